"""Environment variables read by the runtime: the one place they are read, each typed.

Every variable is prefixed `RADIXLM_`. Read a value with `RADIXLM_X.get()` at the moment it is
needed (not at import), so tests can set it with `monkeypatch.setenv`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from radixlm.runtime.config.limits import GRAMMAR_COMPILE_TIMEOUT_S


@dataclass(frozen=True)
class EnvStr:
    """A string variable; unset or empty reads as `default`."""

    name: str
    default: str | None = None

    def get(self) -> str | None:
        value = os.environ.get(self.name)
        return value if value else self.default


# Root of the on-disk cache of converted models (default: ~/.cache/radixlm).
RADIXLM_CACHE = EnvStr("RADIXLM_CACHE")

# What `--dtype auto` means on CPU: float32 or bfloat16; default: by the CPU (bfloat16 where it
# has AVX512-BF16 and a bf16 product times 1.25x float32's, float32 elsewhere; ServerArgs.torch_dtype,
# cpu_linear.prefers_bf16). For comparisons; the test suite runs the default.
RADIXLM_CPU_AUTO_DTYPE = EnvStr("RADIXLM_CPU_AUTO_DTYPE")

# What `--quantization auto` means (a value of server_args.QUANTIZATIONS); default: keep a GGUF's
# quantized weights when --dtype is auto (float weights where no kernel can run). For comparisons;
# the test suite runs the default.
RADIXLM_AUTO_QUANTIZATION = EnvStr("RADIXLM_AUTO_QUANTIZATION")

# "0" keeps torch's thread count fixed (as --disable-adaptive-threads does); the test suite sets it,
# so that no check depends on how busy the machine was (another thread count may sum in another
# order); tests/runtime/test_cpu_threads.py turns it back on.
RADIXLM_ADAPTIVE_THREADS = EnvStr("RADIXLM_ADAPTIVE_THREADS", "1")

# The C++ bf16 GEMM's path (kernels/cpu_linear.BF16_PATHS: emulated, avx512bf16, amx); default:
# the fastest this CPU runs. For tests and comparisons; a path the CPU cannot run is an error.
RADIXLM_BF16_PATH = EnvStr("RADIXLM_BF16_PATH")

# The highest ISA level the C++ CPU kernels may run at (kernels/isa.py LADDERS: generic, avx2,
# avx2_vnni, avx512 on x86-64; generic, neon, neon_dotprod, neon_i8mm on aarch64); default: the
# highest this CPU runs. A level above the CPU's runs the CPU's own.
RADIXLM_CPU_ISA = EnvStr("RADIXLM_CPU_ISA")

# Which llama.cpp build the bench's peer loads: "native" (llama-cpp-python in the environment) or
# the name of a build under <cache>/peers/ (`make bench-peers`); default: the build for radixlm's
# ISA level (llama-cpp-avx2 under RADIXLM_CPU_ISA=avx2), and on a CPU whose native build cannot
# run its AMX kernels the build without AMX (llama-cpp-noamx), where one is there. For comparisons.
RADIXLM_PEER_BUILD = EnvStr("RADIXLM_PEER_BUILD")


@dataclass(frozen=True)
class EnvFloat:
    """A float variable; unset or empty reads as `default`, anything unparsable is a ValueError."""

    name: str
    default: float

    def get(self) -> float:
        value = os.environ.get(self.name)
        if not value:
            return self.default
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{self.name} must be a number of seconds, got {value!r}") from None


# Seconds a grammar's token index may take to build before the build is killed.
RADIXLM_GRAMMAR_COMPILE_TIMEOUT = EnvFloat("RADIXLM_GRAMMAR_COMPILE_TIMEOUT", GRAMMAR_COMPILE_TIMEOUT_S)

# Seconds a grammar's token index may build in the fast lane; a build still running then moves to
# the slow lane (constrained/grammar.py), so that it holds up no new grammar.
RADIXLM_GRAMMAR_FAST_LANE_DEADLINE = EnvFloat("RADIXLM_GRAMMAR_FAST_LANE_DEADLINE", 2.0)


# What torch's own kernels may use at each capped level (RADIXLM_CPU_ISA): ATen's vectorized ops,
# oneDNN (bf16 matmuls) and MKL (float32 GEMMs), so that a capped run uses no instruction above
# the level anywhere (uncapped, and for avx512, torch picks for itself).
_TORCH_CAPS: dict[str, dict[str, str]] = {
    "generic": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx2_vnni": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2_VNNI", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}


def set_process_defaults() -> None:
    """Settings read when torch loads, for each process entry point (serve, the scheduler
    process, the Engine's module, the bench, the tests) to call before it does; a variable the
    user set is kept.

    - OpenMP threads spin only briefly before they sleep. libgomp reads this when it loads (the
      first `import torch`). A decode step runs ~150 short parallel regions
      (kernels/csrc/decode_stack.cpp); with libgomp's default long spin, any competing process on
      the same cores stalls every region boundary for a time slice. Measured on the 2-core machine
      (bf16 decode step of the default model): quiet, 16-20 ms for every setting; beside one busy
      process, ~600 ms with the default spin, 63 ms with GOMP_SPINCOUNT=10000, 33 ms with
      OMP_WAIT_POLICY=PASSIVE. PASSIVE (sleep at once) cost ~15% on batched work when quiet, the
      short spin nothing.
    - Under RADIXLM_CPU_ISA=generic / avx2 / avx2_vnni, torch's kernels are capped to the same
      level (_TORCH_CAPS), so that a capped machine runs as one of that level would: uncapped on
      an AVX-512 machine, torch's bf16 matmuls ran 20x faster than at AVX2 (AVX512-BF16).
    """
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = "10000"
    for name, value in _TORCH_CAPS.get(RADIXLM_CPU_ISA.get() or "", {}).items():
        os.environ.setdefault(name, value)
