"""The vector layer (kernels/csrc/simd/) checked op by op against its definition, vec_generic.h,
and a kernel over it (packed_gemm) against a float64 product: the torch-free drivers in
tests/kernels/csrc/ built for each ISA build this CPU runs (the probe's levels, kernels/isa.py:
an AVX-512 machine also runs its avx2 and generic builds; builds above the CPU are not offered),
natively; and the aarch64 builds cross-compiled and run under qemu-user, always (`make
arm-tools` installs the Debian tools; the test fails without them rather than skip)."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from radixlm.kernels import isa
from radixlm.runtime.model.model_files import cache_dir

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "kernels" / "csrc"
DRIVERS = Path(__file__).resolve().parent / "csrc"



def _native_builds() -> list[str]:
    """The ISA builds (isa.BUILD_FLAGS) of the levels this CPU runs, lowest first."""
    features = isa.probe(cache_dir() / "extensions")
    assert features is not None, "the CPU probe must build here (a C++ compiler is part of the test machine)"
    return list(dict.fromkeys(level.build for level in isa.runnable_levels(features)))


NATIVE_BUILDS = _native_builds()
# test id -> (the level vec.h picks, compiler flags); the second neon build adds the features the
# kernels' dotprod / i8mm paths are compiled with, under the same layer
ARM_LEVELS = {
    "generic": ("generic", ["-DRADIXLM_ISA_GENERIC"]),
    "neon": ("neon", []),
    "neon-dotprod-i8mm": ("neon", ["-march=armv8.2-a+dotprod+i8mm"]),
}
ARM_CXX = "aarch64-linux-gnu-g++"
QEMU = ["qemu-aarch64", "-cpu", "max", "-L", "/usr/aarch64-linux-gnu"]


def _build(cxx: str, driver: str, flags: list[str], out: Path, extra: list[str] | None = None) -> Path:
    """The driver and the kernel sources among `extra` compiled each to an object, as many at once
    as the machine has cores (a decode-stack driver is 8 translation units), then linked. Objects
    are shared between drivers and runs (`_object`): several drivers link the same kernels."""
    sources = [str(DRIVERS / driver), *(a for a in extra or [] if a.endswith(".cpp"))]
    options = ["-std=c++17", "-O2", "-I", str(CSRC), *flags, *(a for a in extra or [] if not a.endswith(".cpp"))]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        objects = list(pool.map(lambda src: _object(cxx, options, src), sources))
    link = [cxx, *options, *map(str, objects), "-o", str(out)]
    result = subprocess.run(link, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"link failed: {' '.join(link)}\n{result.stderr[-4000:]}"
    return out


@functools.cache
def _headers_digest() -> str:
    """Every header a translation unit here can include (the kernels' and the drivers')."""
    digest = hashlib.sha256()
    for header in sorted([*CSRC.rglob("*.h"), *DRIVERS.glob("*.h")]):
        digest.update(str(header).encode() + header.read_bytes())
    return digest.hexdigest()


def _object(cxx: str, options: list[str], source: str) -> Path:
    """`source` compiled with `options`, from the cache when the same compiler, options, source
    and headers made it before (in this run by another driver or worker, or in an earlier run).
    A lock per object: two test workers wanting it at once compile it once."""
    key = hashlib.sha256("\0".join([cxx, *options, source, _headers_digest()]).encode()
                         + Path(source).read_bytes()).hexdigest()[:24]
    folder = cache_dir() / "test-objects"
    folder.mkdir(parents=True, exist_ok=True)
    obj = folder / f"{Path(source).stem}-{key}.o"
    with open(folder / f"{obj.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not obj.exists():
            partial = obj.with_suffix(f".{os.getpid()}.tmp")
            cmd = [cxx, *options, "-c", source, "-o", str(partial)]
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            assert result.returncode == 0, f"build failed: {' '.join(cmd)}\n{result.stderr[-4000:]}"
            partial.rename(obj)
    return obj


def _run(cmd: list[str], closing: str) -> str:
    """Run a driver; it must exit 0 and print its closing line (matched by the regex `closing`).
    OpenMP threads spin briefly only (as runtime/config/envs.py sets for the server): on a shared machine
    libgomp's default spin at each region's end made the packed_gemm driver 40x slower."""
    env = dict(os.environ)
    if "OMP_WAIT_POLICY" not in env:
        env.setdefault("GOMP_SPINCOUNT", "10000")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    out = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(cmd)} exited {result.returncode}:\n{out[-4000:]}"
    assert re.search(closing, out), f"no closing line {closing!r} in:\n{out[-4000:]}"
    return out


def _native_case(build: str, driver: str, closing: str, tmp_path: Path, extra: list[str] | None = None) -> str:
    exe = _build("g++", driver, list(isa.BUILD_FLAGS[build]), tmp_path / f"{Path(driver).stem}_{build}", extra)
    return _run([str(exe)], closing)


def _arm_case(test_id: str, driver: str, closing: str, tmp_path: Path, extra: list[str] | None = None) -> str:
    _level, flags = ARM_LEVELS[test_id]
    native = platform.machine() == "aarch64"
    cxx = "g++" if native else ARM_CXX
    if not native:
        absent = [tool for tool in (ARM_CXX, QEMU[0]) if shutil.which(tool) is None]
        assert not absent, f"{' and '.join(absent)} not found: run `make arm-tools` (Debian's g++-aarch64-linux-gnu, qemu-user)"
    exe = _build(cxx, driver, flags, tmp_path / f"{Path(driver).stem}_{test_id}", extra)
    return _run([str(exe)] if native else [*QEMU, str(exe)], closing)


@pytest.mark.parametrize("level", NATIVE_BUILDS)
def test_vec_layer_native(level: str, tmp_path: Path) -> None:
    _native_case(level, "test_vec.cpp", rf"vec {level}: \d+ checks passed", tmp_path)


@pytest.mark.parametrize("test_id", list(ARM_LEVELS))
def test_vec_layer_aarch64(test_id: str, tmp_path: Path) -> None:
    _arm_case(test_id, "test_vec.cpp", rf"vec {ARM_LEVELS[test_id][0]}: \d+ checks passed", tmp_path)


# packed_gemm without torch: kernels/parallel.h on OpenMP
GEMM_FLAGS = ["-DRADIXLM_NO_TORCH", "-fopenmp"]


@pytest.mark.parametrize("level", NATIVE_BUILDS)
def test_packed_gemm_native(level: str, tmp_path: Path) -> None:
    _native_case(level, "test_packed_gemm.cpp", rf"packed_gemm {level}: \d+ checks passed", tmp_path, GEMM_FLAGS)


@pytest.mark.parametrize("test_id", ["generic", "neon"])
def test_packed_gemm_aarch64(test_id: str, tmp_path: Path) -> None:
    closing = rf"packed_gemm {ARM_LEVELS[test_id][0]}: \d+ checks passed"
    _arm_case(test_id, "test_packed_gemm.cpp", closing, tmp_path, GEMM_FLAGS)
