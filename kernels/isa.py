"""ISA levels of the C++ CPU kernels: what this CPU runs, and which build of the kernels to load.

Features are detected once per process, by the probe (csrc/dispatch/cpu_probe.cpp: cpuid + XCR0
on x86, HWCAP on aarch64), a small library built for the baseline ISA and read with ctypes, so
no code built for a level the CPU lacks is ever loaded. The levels of an architecture are
ordered; each names the build of the kernels it loads (one extension module per build) and the
features its kernels may use. `choose_level(cap)` takes the highest level the CPU runs, at most
`cap` (RADIXLM_CPU_ISA): so one machine runs and tests every level below its own.

    x86-64:  generic < avx2 < avx2_vnni < avx512     (avx512: BF16, VNNI, AMX where present)
    aarch64: generic < neon < neon_dotprod < neon_i8mm
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
PROBE_SOURCES = (CSRC / "dispatch" / "cpu_probe.cpp", CSRC / "dispatch" / "cpu_features.h")


@dataclass(frozen=True)
class IsaLevel:
    """One rung of an architecture's ladder: `build` names the extension build it loads (its
    compiler flags in BUILD_FLAGS), `requires` the features the CPU must have, `allows` the
    features its kernels may use where present (a superset of `requires`)."""

    name: str
    build: str
    requires: frozenset[str]
    allows: frozenset[str]


def _level(name: str, build: str, requires: set[str], extra: set[str] = frozenset()) -> IsaLevel:
    return IsaLevel(name, build, frozenset(requires), frozenset(requires | set(extra)))


_AVX2 = {"avx2", "fma", "f16c"}
_AVX512_EXTRAS = {"avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"}
LADDERS: dict[str, tuple[IsaLevel, ...]] = {
    "x86_64": (
        _level("generic", "generic", set()),
        _level("avx2", "avx2", _AVX2),
        _level("avx2_vnni", "avx2", _AVX2 | {"avx_vnni"}),
        _level("avx512", "avx512", _AVX2 | {"avx512f", "avx512bw"}, _AVX512_EXTRAS),
    ),
    "aarch64": (
        _level("generic", "generic", set()),
        _level("neon", "neon", {"neon"}),
        _level("neon_dotprod", "neon", {"neon", "dotprod"}),
        _level("neon_i8mm", "neon", {"neon", "dotprod", "i8mm"}, {"sve", "arm_bf16"}),
    ),
}

# Compiler flags of each build (csrc/simd/vec.h picks its backend from the macros they define).
BUILD_FLAGS: dict[str, tuple[str, ...]] = {
    "generic": ("-DRADIXLM_ISA_GENERIC",),
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
    "avx512": ("-mavx512f", "-mavx512bw", "-mavx2", "-mfma", "-mf16c"),
    "neon": (),
}


def architecture() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def ladder() -> tuple[IsaLevel, ...]:
    """This architecture's levels, lowest first (only `generic` on an architecture we have no
    vector code for)."""
    return LADDERS.get(architecture(), LADDERS["x86_64"][:1])


@dataclass(frozen=True)
class CpuFeatures:
    """The probe's answer: `names` in bit order, `bits` the features this process can execute."""

    names: tuple[str, ...]
    bits: int

    @property
    def present(self) -> frozenset[str]:
        return frozenset(name for i, name in enumerate(self.names) if self.bits >> i & 1)

    def mask_of(self, allowed: frozenset[str]) -> int:
        """The bits of the present features that are in `allowed`."""
        return sum(1 << i for i, name in enumerate(self.names) if name in allowed and self.bits >> i & 1)


_probed: dict[str, CpuFeatures | None] = {}


def probe(build_root: Path) -> CpuFeatures | None:
    """This CPU's features, from the probe built (once, keyed by its source) under `build_root`;
    None where it cannot be built (no compiler): then no kernel runs here."""
    if "features" not in _probed:
        _probed["features"] = _run_probe(build_root)
    return _probed["features"]


def _run_probe(build_root: Path) -> CpuFeatures | None:
    digest = hashlib.sha256()
    for path in PROBE_SOURCES:
        digest.update(path.read_bytes())
    library = build_root / f"cpu_probe-{architecture()}-{digest.hexdigest()[:16]}.so"
    if not library.exists():
        build_root.mkdir(parents=True, exist_ok=True)
        partial = library.with_suffix(f".{id(library)}.tmp")
        command = [os.environ.get("CXX", "c++"), "-O2", "-std=c++17", "-shared", "-fPIC", "-I", str(CSRC), str(PROBE_SOURCES[0]), "-o", str(partial)]
        try:
            subprocess.run(command, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as e:
            detail = getattr(e, "stderr", None) or str(e)
            logger.warning("C++ CPU kernels off: the CPU probe did not build (%s)", detail.strip().splitlines()[-1:])
            return None
        partial.replace(library)
    lib = ctypes.CDLL(str(library))
    lib.radixlm_cpu_features.restype = ctypes.c_uint64
    lib.radixlm_cpu_feature_name.restype = ctypes.c_char_p
    names = tuple(lib.radixlm_cpu_feature_name(i).decode() for i in range(lib.radixlm_num_cpu_features()))
    return CpuFeatures(names, int(lib.radixlm_cpu_features()))


def runnable_levels(features: CpuFeatures) -> list[IsaLevel]:
    """The levels this CPU runs, lowest first (`generic` always)."""
    present = features.present
    return [level for level in ladder() if level.requires <= present]


def level_named(name: str) -> IsaLevel:
    """The level `name` of this architecture; a ValueError listing them otherwise."""
    for level in ladder():
        if level.name == name:
            return level
    raise ValueError(f"unknown CPU ISA level {name!r} on {architecture()}; levels: {', '.join(lv.name for lv in ladder())}")


def choose_level(features: CpuFeatures, cap: str | None = None) -> IsaLevel:
    """The highest level this CPU runs, at most `cap` (a level name; one above the machine's
    own is capped at the machine's, with a log line)."""
    levels = runnable_levels(features)
    if cap is None:
        return levels[-1]
    wanted = level_named(cap)
    order = [level.name for level in ladder()]
    allowed = [level for level in levels if order.index(level.name) <= order.index(wanted.name)]
    if allowed[-1] != wanted:
        logger.info("RADIXLM_CPU_ISA=%s is above this CPU; running %s", cap, allowed[-1].name)
    return allowed[-1]
