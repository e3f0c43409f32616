"""The vector layer (kernels/csrc/simd/) checked op by op against its definition, vec_generic.h,
and a kernel over it (packed_gemm) against a float64 product: the torch-free drivers in
tests/kernels/csrc/ built at each ISA level and run. The x86 levels run natively (a level above
this CPU is skipped, with the reason); the aarch64 levels are cross-compiled and run under
qemu-user, always (`make arm-tools` installs the Debian tools; the test fails without them rather
than skip)."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "kernels" / "csrc"
DRIVERS = Path(__file__).resolve().parent / "csrc"

# level -> (compiler flags, the cpuinfo flags it needs)
X86_LEVELS = {
    "generic": (["-DRADIXLM_ISA_GENERIC"], set()),
    "avx2": (["-mavx2", "-mfma", "-mf16c"], {"avx2", "fma", "f16c"}),
    "avx512": (["-mavx512f", "-mavx512bw"], {"avx512f", "avx512bw"}),
}
# test id -> (the level vec.h picks, compiler flags); the second neon build adds the features the
# kernels' dotprod / i8mm paths are compiled with, under the same layer
ARM_LEVELS = {
    "generic": ("generic", ["-DRADIXLM_ISA_GENERIC"]),
    "neon": ("neon", []),
    "neon-dotprod-i8mm": ("neon", ["-march=armv8.2-a+dotprod+i8mm"]),
}
ARM_CXX = "aarch64-linux-gnu-g++"
QEMU = ["qemu-aarch64", "-cpu", "max", "-L", "/usr/aarch64-linux-gnu"]


def _cpu_flags() -> set[str]:
    """The x86 feature flags Linux reports for this CPU (empty off x86)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    match = re.search(r"^flags\s*:(.*)$", text, re.MULTILINE)
    return set(match.group(1).split()) if match else set()


def _build(cxx: str, driver: str, flags: list[str], out: Path, extra: list[str] | None = None) -> Path:
    cmd = [cxx, "-std=c++17", "-O2", "-I", str(CSRC), *flags, *(extra or []), str(DRIVERS / driver), "-o", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"build failed: {' '.join(cmd)}\n{result.stderr[-4000:]}"
    return out


def _run(cmd: list[str], closing: str) -> str:
    """Run a driver; it must exit 0 and print its closing line (matched by the regex `closing`).
    OpenMP threads spin briefly only (as runtime/envs.py sets for the server): on a shared machine
    libgomp's default spin at each region's end made the packed_gemm driver 40x slower."""
    env = dict(os.environ)
    if "OMP_WAIT_POLICY" not in env:
        env.setdefault("GOMP_SPINCOUNT", "10000")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    out = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(cmd)} exited {result.returncode}:\n{out[-4000:]}"
    assert re.search(closing, out), f"no closing line {closing!r} in:\n{out[-4000:]}"
    return out


def _x86_case(level: str, driver: str, closing: str, tmp_path: Path, extra: list[str] | None = None) -> str:
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"the x86 levels run on an x86 CPU; this one is {platform.machine()}")
    flags, needs = X86_LEVELS[level]
    missing = needs - _cpu_flags()
    if missing:
        pytest.skip(f"this CPU cannot run the {level} level (no {', '.join(sorted(missing))} in /proc/cpuinfo)")
    exe = _build("g++", driver, flags, tmp_path / f"{Path(driver).stem}_{level}", extra)
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


@pytest.mark.parametrize("level", list(X86_LEVELS))
def test_vec_layer_x86(level: str, tmp_path: Path) -> None:
    _x86_case(level, "test_vec.cpp", rf"vec {level}: \d+ checks passed", tmp_path)


@pytest.mark.parametrize("test_id", list(ARM_LEVELS))
def test_vec_layer_aarch64(test_id: str, tmp_path: Path) -> None:
    _arm_case(test_id, "test_vec.cpp", rf"vec {ARM_LEVELS[test_id][0]}: \d+ checks passed", tmp_path)


# packed_gemm without torch: kernels/parallel.h on OpenMP
GEMM_FLAGS = ["-DRADIXLM_NO_TORCH", "-fopenmp"]


@pytest.mark.parametrize("level", list(X86_LEVELS))
def test_packed_gemm_x86(level: str, tmp_path: Path) -> None:
    _x86_case(level, "test_packed_gemm.cpp", rf"packed_gemm {level}: \d+ checks passed", tmp_path, GEMM_FLAGS)


@pytest.mark.parametrize("test_id", ["generic", "neon"])
def test_packed_gemm_aarch64(test_id: str, tmp_path: Path) -> None:
    closing = rf"packed_gemm {ARM_LEVELS[test_id][0]}: \d+ checks passed"
    _arm_case(test_id, "test_packed_gemm.cpp", closing, tmp_path, GEMM_FLAGS)
