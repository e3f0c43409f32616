"""The ISA levels the kernel tests run (kernels/isa.py: every level this CPU runs, an AVX-512
machine's AVX2 and generic ones too) and, for tests of a path only some builds run here (a bf16
GEMM path, a long-extend attention path), the (level, path) pairs that exist: a pair above a
level is not generated, rather than skipped."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from radixlm.kernels import cpu_linear, isa
from radixlm.runtime.model.model_files import cache_dir


def _runnable_levels() -> list[str]:
    features = isa.probe(cache_dir() / "extensions")
    assert features is not None, "the CPU probe must build here (a C++ compiler is part of the test machine)"
    return [level.name for level in isa.runnable_levels(features)]


LEVELS = _runnable_levels()


def level_module(level: str) -> Any:
    """The kernels built for `level` (built once into the cache, then loaded once per process)."""
    module = cpu_linear.load_level(cache_dir() / "extensions", level)
    assert module is not None, f"the {level} build must load here (see the log for why it did not)"
    return module


def bf16_path_runs(module: Any, path: str) -> bool:
    return path in cpu_linear.available_bf16_paths(module)


def long_extend_path_runs(module: Any, path: str) -> bool:
    """AMX tiles or vdpbf16ps (the avx512 build on a CPU that has them; AMX where the OS lets
    this process use tiles), or the vector kernel's float32 FMAs (every level)."""
    features = module.cpu_features()
    return {"amx": bool(features["amx_bf16"]), "dpbf16": bool(features["avx512_bf16"]), "fma": True}[path]


def level_params(cases: Iterable[tuple[str, ...]], runs: Callable[[Any, str], bool]) -> list[Any]:
    """pytest params (level, *case) for `@pytest.mark.parametrize(("ext", ...), ..., indirect=["ext"])`:
    each level with each case whose path (its first item) the level's build runs here."""
    params = []
    for level in LEVELS:
        module = level_module(level)
        params += [pytest.param(level, *case, id="-".join([level, *map(str, case)])) for case in cases
                   if runs(module, case[0])]
    return params
