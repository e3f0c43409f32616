"""A plain install is as good as the editable one: the wheel built from this tree carries every
file the C++ kernels need (sources and headers), the dashboard's page and the benchmarks' data,
and in a fresh venv the kernels compile and run a decode step.

The fresh venv gets the built wheel alone (`pip install --no-deps`); its dependencies (torch
2.13.0 pinned, transformers, ...) come from this suite's venv through a .pth line, so the test
needs no download and checks what the wheel itself carries. The kernels build into a fresh
RADIXLM_CACHE from the installed package's own files (~1 minute).
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, sys
import radixlm
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.kernel_policy import load_cpu_kernels

engine = Engine(model_path=sys.argv[1], dtype="float32", max_total_tokens=512)
model_cls = type(engine.runner.model)
calls = []
original = model_cls._forward_decode_stack
def counted(self, *args, **kwargs):
    calls.append(1)
    return original(self, *args, **kwargs)
model_cls._forward_decode_stack = counted
out = engine.generate("hello there", {"max_new_tokens": 6, "ignore_eos": True, "temperature": 0})
ext = load_cpu_kernels()
print(json.dumps({"package": radixlm.__file__, "cpu_kernels": engine.runner.cpu_kernels,
                  "decode_stack_steps": len(calls), "extension": ext.__file__ if ext else None,
                  "output_ids": out["output_ids"] if "output_ids" in out else None, "text": out["text"]}))
engine.shutdown()
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, timeout=600)
    [built] = out.glob("radixlm-*.whl")
    return built


def test_the_wheel_carries_every_kernel_source(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    csrc = ROOT / "kernels" / "csrc"
    needed = {f"radixlm/kernels/csrc/{p.relative_to(csrc)}" for p in csrc.glob("*/*") if p.suffix in (".cpp", ".h")}
    assert needed and needed <= names, f"missing from the wheel: {sorted(needed - names)}"
    for package in ("radixlm/runtime/server/serve.py", "radixlm/runtime/scheduler/scheduler.py",
                    "radixlm/runtime/mem_cache/radix_cache.py", "radixlm/runtime/bench/__main__.py"):
        assert package in names
    page = {f"radixlm/runtime/server/static/{p.name}" for p in (ROOT / "runtime" / "server" / "static").iterdir()}
    assert len(page) == 3 and page <= names, f"the dashboard's page is missing: {sorted(page - names)}"
    data = {f"radixlm/runtime/bench/data/{p.name}" for p in (ROOT / "runtime" / "bench" / "data").glob("*.json")}
    assert data and data <= names, f"the benchmarks' data is missing: {sorted(data - names)}"


def test_kernels_compile_and_decode_in_a_fresh_venv_from_the_wheel(
    wheel: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, timeout=300)
    fresh_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     check=True, capture_output=True, text=True).stdout.strip())
    # the dependencies: this venv's site-packages, after the fresh venv's own (where the wheel is)
    (fresh_site / "zz_suite_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["RADIXLM_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run([str(python), "-c", SCRIPT, str(tiny_model_dir)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["package"].startswith(str(fresh_site)), result  # the installed copy, not this tree
    assert result["extension"] and result["extension"].startswith(str(tmp_path / "cache")), result  # built here
    assert result["cpu_kernels"] is True and result["decode_stack_steps"] >= 5, result

    from radixlm.runtime.engine import Engine  # the same request through this tree gives the same text

    with Engine(model_path=str(tiny_model_dir), dtype="float32", max_total_tokens=512) as engine:
        here = engine.generate("hello there", {"max_new_tokens": 6, "ignore_eos": True, "temperature": 0})
    assert result["text"] == here["text"]
