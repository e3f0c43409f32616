"""Import directions, checked on the source: every `import` statement (module and function level)
in lang/, runtime/ and kernels/ is parsed with `ast`.

- `import radixlm` (the language, lang/) imports nothing of the runtime, except the in-process
  Engine, lazily (inside a function), and changes no environment variable;
- kernels/ imports nothing of the runtime or the language;
- the runtime's units (its subpackages and top-level modules) import in one direction only: down
  the LAYERS below, and the graph between them has no cycle.
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

# The runtime's units, bottom up: a unit may import units of its own layer or below, never above.
LAYERS: list[set[str]] = [
    {"errors", "limits", "envs", "json_types"},
    {"tokenizer", "ipc"},
    {"mem_cache", "sampling", "constrained"},
    {"server_args"},  # checks a JSON whitespace pattern with constrained/ when built
    {"messages"},  # carry the frozen SamplingParams
    {"protocol", "protocol_sglang"},  # the HTTP contract's typed bodies (SGLang's whole schema), publishing SamplingParams' ranges
    {"model", "detokenizer"},
    {"scheduler"},
    {"request_io", "request_output", "engine"},
    {"server"},
    {"bench"},
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
# torch-free modules of the language that the runtime shares (chat templates, tool-call formats,
# reasoning formats)
SHARED_LANG = {"radixlm.chat_template", "radixlm.tool_calls", "radixlm.reasoning"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    base = FOLDERS[parts[0]]
    rest = [p for p in parts[1:] if p != "__init__"]
    return ".".join([base, *rest])


def source_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


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
            # `from radixlm.runtime import messages` imports the submodule radixlm.runtime.messages
            names = [f"{mod}.{alias.name}" for alias in node.names] + [mod]
        else:
            continue
        for name in names:
            if name == "radixlm" or name.startswith("radixlm."):
                yield name, id(node) in top_level


def runtime_unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["radixlm", "runtime"] or len(parts) < 3:
        return None
    return parts[2]


def test_every_runtime_unit_has_a_layer() -> None:
    units = {p.stem if p.is_file() else p.name for p in (ROOT / "runtime").iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
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


def test_kernels_import_neither_runtime_nor_language() -> None:
    bad = [f"{p.relative_to(ROOT)}: {name}" for p in (ROOT / "kernels").rglob("*.py")
           for name, _ in imports(p) if not name.startswith("radixlm.kernels")]
    assert not bad, "\n".join(bad)


def runtime_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {unit: set() for unit in RANK}
    for path in (ROOT / "runtime").rglob("*.py"):
        src = runtime_unit(module_name(path))
        if src is None:
            continue
        for name, _ in imports(path):
            dst = runtime_unit(name)
            if dst is not None and dst != src and dst in RANK:
                graph[src].add(dst)
    return graph


def test_runtime_imports_point_down() -> None:
    graph = runtime_graph()
    bad = [f"{src} (layer {RANK[src]}) imports {dst} (layer {RANK[dst]})"
           for src, dsts in graph.items() for dst in dsts if RANK[dst] > RANK[src]]
    assert not bad, "\n".join(sorted(bad))


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


def test_no_import_cycle_between_runtime_units() -> None:
    cycle = find_cycle(runtime_graph())
    assert cycle is None, " -> ".join(cycle or [])


def test_find_cycle_finds_one() -> None:  # the checker itself can fail
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_runtime_uses_only_the_shared_parts_of_the_language() -> None:
    bad = []
    for path in (ROOT / "runtime").rglob("*.py"):
        if runtime_unit(module_name(path)) == "bench":  # the benchmarks run language programs
            continue
        for name, _ in imports(path):
            if not name.startswith(("radixlm.runtime", "radixlm.kernels")) and name != "radixlm" and not any(
                name == s or name.startswith(s + ".") for s in SHARED_LANG
            ):
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("statement", ["import radixlm", "import radixlm as rl; rl.function; rl.gen; rl.RuntimeEndpoint"])
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
