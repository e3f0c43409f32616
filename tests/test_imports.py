"""Import directions over the whole `radixlm` package, checked on the source: every `import`
statement (module and function level) in lang/, runtime/ and kernels/ is parsed with `ast`.

The package is cut into units: `radixlm.formats` (lang/formats/, the text formats the language and
the runtime share), `radixlm.kernels` (kernels/), the language (`radixlm`: the rest of lang/), the
runtime's package root (`radixlm.runtime`, which only hands out the Engine) and each subpackage or
top-level module of the runtime (`radixlm.runtime.config`, ...). Then:

- every unit has a layer in LAYERS, and imports units of its own layer or below, never above; the
  graph between units has no cycle;
- the bottom layer's units (the shared formats, the kernels) import no other unit;
- the language imports nothing of the runtime except the in-process Engine, lazily (inside a
  function), and `import radixlm` loads neither the runtime nor torch and changes no environment
  variable;
- the server's route modules (each defines a `register_*_routes`) share `server/http_common.py`
  and never import each other; the app (`server/http_server.py`) imports them all.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"lang": "radixlm", "runtime": "radixlm.runtime", "kernels": "radixlm.kernels"}
LANGUAGE = "radixlm"
RUNTIME = "radixlm.runtime"


def runtime(*names: str) -> set[str]:
    return {f"{RUNTIME}.{name}" for name in names}


# The units, bottom up: a unit may import units of its own layer or below, never above.
LAYERS: list[set[str]] = [
    {"radixlm.formats", "radixlm.kernels"},  # self-contained (test_bottom_units_import_no_other_unit)
    runtime("config"),  # settings, environment, limits: imports nothing of the runtime
    runtime("tokenizer"),
    runtime("mem_cache", "sampling", "constrained"),
    runtime("ipc"),  # the messages carry the frozen SamplingParams
    runtime("api"),  # the contract and the door: nothing of how it is served (model, scheduler)
    runtime("model", "detokenizer"),
    runtime("scheduler"),
    runtime("engine") | {RUNTIME},  # the package root hands out the Engine
    runtime("server"),
    {LANGUAGE},  # the language: of the runtime only the Engine, lazily (test_language_imports_no_runtime)
    runtime("bench"),  # runs the language's programs on the runtime
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    base = FOLDERS[parts[0]]
    rest = [p for p in parts[1:] if p != "__init__"]
    return ".".join([base, *rest])


def source_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


MODULES = {module_name(path) for path in source_files()}


def imports(path: Path) -> Iterator[tuple[str, bool]]:
    """(imported radixlm module, is_top_level) for every import statement in the file."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            # `from radixlm.runtime.ipc import messages` imports the submodule ...ipc.messages, `from
            # radixlm.runtime import Engine` a name of the package radixlm.runtime
            names = [f"{mod}.{alias.name}" if f"{mod}.{alias.name}" in MODULES else mod for alias in node.names]
        else:
            continue
        for name in names:
            if name == "radixlm" or name.startswith("radixlm."):
                yield name, id(node) in top_level


def runtime_units() -> set[str]:
    """The runtime's subpackages and top-level modules, as found on disk."""
    return {f"{RUNTIME}.{p.stem if p.is_file() else p.name}" for p in (ROOT / "runtime").iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}


RUNTIME_UNITS = runtime_units()


def unit_of(module: str) -> str:
    """The unit a radixlm module (or a name imported from one) belongs to."""
    for unit in ("radixlm.formats", "radixlm.kernels"):
        if module == unit or module.startswith(unit + "."):
            return unit
    if module == RUNTIME or module.startswith(RUNTIME + "."):
        unit = ".".join(module.split(".")[:3])
        return unit if unit in RUNTIME_UNITS else RUNTIME
    return LANGUAGE


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(module_name(path)) for path in source_files()}
    assert units == set(RANK), f"units without a layer: {units - set(RANK)}; gone: {set(RANK) - units}"


def test_language_imports_no_runtime() -> None:
    bad = []
    for path in (ROOT / "lang").rglob("*.py"):
        for name, top in imports(path):
            if name.startswith("radixlm.runtime") or name.startswith("radixlm.kernels"):
                lazy_engine = not top and name in ("radixlm.runtime", "radixlm.runtime.Engine", "radixlm.runtime.engine",
                                                   "radixlm.runtime.engine.Engine")
                if not lazy_engine:
                    bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, "the language imports the runtime:\n" + "\n".join(bad)


def test_bottom_units_import_no_other_unit() -> None:
    """The shared formats and the kernels stand alone: the layering would let them import each
    other; they import neither each other nor anything else of radixlm."""
    bad = [f"{path.relative_to(ROOT)}: {name}" for path in source_files()
           if (src := unit_of(module_name(path))) in LAYERS[0]
           for name, _ in imports(path) if unit_of(name) != src]
    assert not bad, "\n".join(bad)


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {unit: set() for unit in RANK}
    for path in source_files():
        src = unit_of(module_name(path))
        for name, _ in imports(path):
            dst = unit_of(name)
            if dst != src:
                graph.setdefault(src, set()).add(dst)
    return graph


def test_imports_point_down() -> None:
    graph = import_graph()
    bad = [f"{src} (layer {RANK[src]}) imports {dst} (layer {RANK[dst]})"
           for src, dsts in graph.items() for dst in dsts if RANK[dst] > RANK[src]]
    assert not bad, "\n".join(sorted(bad))


def route_modules() -> set[str]:
    """The server's route modules: those that define a `register_*_routes(app, ...)` function."""
    found = set()
    for path in (ROOT / "runtime" / "server").glob("*.py"):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("register_") and node.name.endswith("_routes"):
                found.add(module_name(path))
    return found


def test_route_modules_share_one_helper_module_and_never_import_each_other() -> None:
    routes = route_modules()
    assert {f"{RUNTIME}.server.{name}" for name in ("native_api", "openai_api", "dashboard", "traces")} <= routes
    bad, helpers = [], set()
    for path in (ROOT / "runtime" / "server").glob("*.py"):
        if (module := module_name(path)) not in routes:
            continue
        for name, _ in imports(path):
            if name in routes and name != module:
                bad.append(f"{path.relative_to(ROOT)}: {name}")
            elif name.startswith(f"{RUNTIME}.server.") and name != module:
                helpers.add(name)
    assert not bad, "a route module imports another (share server/http_common.py instead):\n" + "\n".join(bad)
    assert f"{RUNTIME}.server.http_common" in helpers


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_between_units() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])


def test_find_cycle_finds_one() -> None:  # the checker itself can fail
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("statement", [
    "import radixlm", "import radixlm as rl; rl.function; rl.gen; rl.RuntimeEndpoint",
    "import radixlm.formats.chat_template, radixlm.formats.reasoning, radixlm.formats.tool_calls",
])
def test_import_radixlm_loads_no_runtime_and_keeps_the_environment(statement: str) -> None:
    code = (
        "import os, sys, json; before = dict(os.environ);"
        f"{statement};"
        "print(json.dumps({'runtime': sorted(m for m in sys.modules if m.startswith(('radixlm.runtime', 'radixlm.kernels'))),"
        " 'torch': 'torch' in sys.modules, 'env_same': dict(os.environ) == before}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    import json

    result = json.loads(out)
    assert result == {"runtime": [], "torch": False, "env_same": True}
