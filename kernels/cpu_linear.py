"""C++ CPU kernels (csrc/): linear layers over weights packed in panels, float32
(kernels/packed_gemm.h) or bfloat16 (kernels/bf16_gemm.h: AMX tiles, AVX512-BF16 vdpbf16ps, or
vdpbf16ps emulated over the vector layer, whichever the CPU runs), or block-quantized
(kernels/quant_gemm.h, kernels/quant.py: GGUF Q8_0 / Q4_0 / Q4_1, weight-only or int8 x int8, and the
K-quants Q4_K (both modes) and Q5_K / Q6_K (weight-only));
DecodeStack (kernels/decode_stack.h), every decoder layer of a decode step in one call; paged
attention (kernels/paged_attention.cpp), causal attention of any batch's new tokens reading K/V
in place from the KV pool; and fused row-wise RMSNorm and SiLU x up (kernels/rows.cpp).

Each kernel is written once over the vector layer (csrc/simd/vec.h) and built once per ISA
build (isa.BUILD_FLAGS: generic, avx2, avx512, neon) as its own extension module, on first use,
with torch's C++ extension tooling (a C++ compiler, ninja from the `ninja` wheel), into
`build_root` (the runtime passes its cache's `extensions/` folder), keyed by the sources, the
flags and torch's version, under a file lock so concurrent processes build once. `load()` gives
the module of the highest level the CPU runs (isa.py), or None (and says why, once) where none
can: no compiler, a failed build; callers then keep torch's ops.

The compute kernels (csrc/kernels/, all but shm_all_reduce: the tensor-parallel ranks' sum, which
waits on Python's signals) are torch-free, raw pointers and sizes, so C++ drivers test them without
torch (tests/kernels/csrc/, aarch64 under qemu); csrc/bindings/ is the torch layer (tensor checks,
allocation) and the module's definitions.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from radixlm.kernels import isa, quant

logger = logging.getLogger(__name__)

PANEL = 64
CSRC = Path(__file__).parent / "csrc"
# every build compiles the bindings and the kernels; the hash of a build covers every source
SOURCES = [*sorted((CSRC / "bindings").glob("*.cpp")), *sorted((CSRC / "kernels").glob("*.cpp"))]
HEADERS = sorted(CSRC.glob("**/*.h"))


class Extension:
    """One build of the C++ kernels. Its compute ops (OPS) are torch ops, `torch.ops.radixlm_<build>`
    (registered in csrc/bindings/torch_ops.cpp), so profilers and torch.compile see them by name
    (each has a meta kernel: its output's shape); the rest (DecodeStack, ShmAllReduce, the CPU's
    features, counters) is the build's Python module."""

    OPS = ("packed_linear", "bf16_linear", "q_linear", "q_columns", "rms_norm", "silu_mul", "paged_attention",
           "moe_experts")

    def __init__(self, module: ModuleType, build: str):
        self.module, self.build = module, build
        self.ops = getattr(torch.ops, ops_namespace(build))
        for name in self.OPS:
            setattr(self, name, getattr(self.ops, name).default)

    def __getattr__(self, name: str) -> object:
        return getattr(self.module, name)


def ops_namespace(build: str) -> str:
    """The torch ops namespace of a build's kernels."""
    return f"radixlm_{build}"


_state: dict[str, Extension | None] = {}  # build name -> its kernels (None: they cannot run here)
_bf16_choice: dict[str, bool] = {}


# `--dtype auto` takes bfloat16 weights on a CPU where a batched product runs at least this many
# times faster with them than with float32 ones (bf16_speedup): CPUs with AMX or fast vdpbf16ps
# clear it by far, one with vdpbf16ps at half the FMA's rate does not (figures: docs/cpu-support.md, "Thresholds and the measurements behind them").
BF16_AUTO_MIN_SPEEDUP = 1.25


def bf16_speedup(ext: Extension, rows: int = 64, k: int = 576, n: int = 3072, repeats: int = 5) -> float:
    """How many times faster a product of `rows` rows runs with bf16 weights (the fastest bf16 path
    this CPU runs) than with float32 ones, both through our kernels, timed now: the minimum of
    `repeats` alternating runs each, after a warm-up (~10 ms on 2 cores). The shape is the default
    model's gate/up product; at 64 rows both are bound by arithmetic, which bf16 must speed up
    (reading half the bytes, it always wins single-row decode)."""
    generator = torch.Generator().manual_seed(0)
    weight_t = torch.randn(k, n, generator=generator)
    x = torch.randn(rows, k, generator=generator)
    fp32, bf16 = pack(weight_t), pack_pairs(weight_t)
    path = BF16_PATHS.index(bf16_path(ext))
    runs = {"float32": lambda: ext.packed_linear(x, fp32, None, None),
            "bfloat16": lambda: ext.bf16_linear(x, bf16, None, None, path)}
    best = dict.fromkeys(runs, math.inf)
    for run in runs.values():
        run()
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best["float32"] / best["bfloat16"]


def prefers_bf16(bf16_in_hardware: bool, load_ext: Callable[[], Extension | None]) -> bool:
    """What `--dtype auto` takes on this CPU (True: bfloat16 weights, False: float32): float32
    without bf16 in hardware (it would be emulated; `load_ext` is not called); with it, bfloat16 where
    bf16_speedup, measured once per process, reaches BF16_AUTO_MIN_SPEEDUP, or where our kernels
    are off (`load_ext()` gives None: torch's oneDNN bf16 GEMMs, as before this measurement)."""
    if not bf16_in_hardware:
        return False
    ext = load_ext()
    if ext is None:
        return True
    if "choice" not in _bf16_choice:
        speedup = bf16_speedup(ext)
        _bf16_choice["choice"] = speedup >= BF16_AUTO_MIN_SPEEDUP
        logger.info("--dtype auto: a 64-row product with bf16 weights (%s) runs %.2fx float32's here: %s",
                    bf16_path(ext), speedup, "bfloat16" if _bf16_choice["choice"] else "float32")
    return _bf16_choice["choice"]


def load(build_root: Path, cap: str | None = None) -> Extension | None:
    """The compiled extension for the highest ISA level this CPU runs, at most `cap` (a level
    of isa.ladder(), e.g. RADIXLM_CPU_ISA), or None if no build can run here (the reason is
    logged once). The first call builds (or finds) it under `build_root`."""
    features = isa.probe(build_root)
    if features is None:
        return None
    return load_level(build_root, isa.choose_level(features, cap).name)


def load_level(build_root: Path, level_name: str) -> Extension | None:
    """The extension built for ISA level `level_name`, its kernels told which features they may
    use (the CPU's, within the level's). Levels that share a build share its module: it follows
    the level of the last call. A level above this CPU is a ValueError."""
    features = isa.probe(build_root)
    if features is None:
        return None
    level = isa.level_named(level_name)
    if level not in isa.runnable_levels(features):
        raise ValueError(f"CPU ISA level {level_name!r} cannot run on this CPU (features: {', '.join(sorted(features.present))})")
    if level.build not in _state:
        _state[level.build] = _build(build_root, level.build)
    ext = _state[level.build]
    if ext is not None:
        ext.set_cpu_features(features.mask_of(level.allows), level.name)
    return ext


def _build(build_root: Path, build: str) -> Extension | None:
    from torch.utils.cpp_extension import load as load_extension

    flags = [*isa.BUILD_FLAGS[build], f"-DRADIXLM_OPS={ops_namespace(build)}"]
    # keyed by the sources' bytes and their place: torch's loader rebuilds when the source paths
    # change, so two checkouts (or a checkout and an installed wheel) sharing one folder would
    # rebuild over each other
    digest = hashlib.sha256(torch.__version__.encode())
    digest.update(" ".join(flags).encode())
    for path in SOURCES + HEADERS:
        digest.update(str(path.resolve()).encode())
        digest.update(path.read_bytes())
    build_dir = build_root / f"cpu_kernels-{build}-{digest.hexdigest()[:16]}"
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        import ninja  # the wheel's binary; the venv's bin/ is not necessarily on PATH

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass
    try:
        with open(build_dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            # torch's own build baton (a plain file it polls for, forever) left by a builder that was
            # killed: every builder of this folder holds our lock first, so a baton seen now is stale
            (build_dir / "lock").unlink(missing_ok=True)
            # hidden visibility: each build's inline functions and statics stay its own, so two
            # builds loaded in one process (the tests of every level) never share code
            return Extension(load_extension(
                name=f"radixlm_cpu_kernels_{build}",
                sources=[str(path) for path in SOURCES],
                build_directory=str(build_dir),
                extra_include_paths=[str(CSRC)],
                extra_cflags=["-O3", "-fopenmp", "-fvisibility=hidden", *flags],
                extra_ldflags=["-fopenmp"],
                verbose=False,
            ), build)
    except Exception as e:  # a missing compiler or ninja, a failed build: fall back to torch
        logger.warning("C++ CPU kernels (%s build) off: build failed (%s)", build,
                       str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None


# Rows up to which our kernels beat torch's GEMM, measured with `python -m radixlm.runtime.bench.gemm`
# (a decode step's layers of the default model, distinct weights streamed from memory): float32
# ours at every size; bf16 ours up to where torch's oneDNN catches up on each path (figures:
# docs/cpu-support.md, "Thresholds and the measurements behind them"). Both vector kernels hold a 6-row x 64-column block of the output in 24 registers (4 dot
# products per weight vector loaded). DecodeStack takes decode batches of up to as many rows.
FLOAT32_MAX_ROWS = sys.maxsize
BF16_MAX_ROWS = {"amx": 64, "avx512bf16": 512, "emulated": 16}


def kernel_max_rows(dtype: torch.dtype, path: str) -> int:
    """Products of up to this many rows go through our kernel for weights of `dtype` (bf16 ones
    on bf16 GEMM path `path`)."""
    return BF16_MAX_ROWS[path] if dtype == torch.bfloat16 else FLOAT32_MAX_ROWS


def pack(weight_t: torch.Tensor) -> torch.Tensor:
    """float32 `[K, N]` -> `[ceil(N/64), K, 64]` panels (zero-padded columns)."""
    k, n = weight_t.shape
    padded = -(-n // PANEL) * PANEL
    if padded != n:
        weight_t = torch.nn.functional.pad(weight_t, (0, padded - n))
    return weight_t.reshape(k, padded // PANEL, PANEL).permute(1, 0, 2).contiguous()


def packed_linear(
    ext: Extension, x: torch.Tensor, packed: torch.Tensor, n: int,
    residual: torch.Tensor | None = None, bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ W (+ bias) (+ residual) in x's dtype, W from `pack`; `n` is W's true column count."""
    return _run_padded(lambda xf, res, b: ext.packed_linear(xf, packed, res, b), x, packed.shape[0] * PANEL, n,
                       residual, bias)


def _run_padded(
    kernel: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None], torch.Tensor], x: torch.Tensor,
    padded: int, n: int, residual: torch.Tensor | None, bias: torch.Tensor | None,
) -> torch.Tensor:
    """`kernel(x, residual, bias)` on float32 operands padded to the packed width `padded`, its
    output cut back to `n` columns, in x's dtype."""
    res = None
    if residual is not None:
        res = residual.float()
        if padded != n:
            res = torch.nn.functional.pad(res, (0, padded - n))
    if bias is not None and bias.numel() != padded:
        bias = torch.nn.functional.pad(bias.float(), (0, padded - bias.numel()))
    out = kernel(x.float().contiguous(), res, bias)
    if padded != n:
        out = out[:, :n]
    return out if x.dtype == torch.float32 else out.to(x.dtype)


# The bf16 GEMM's paths (csrc/bf16_gemm.h), slowest first; `bf16_path` gives the one this CPU runs.
BF16_PATHS = ("emulated", "avx512bf16", "amx")
PAIR_PANEL = 32
PAIR_K = 32


def pack_pairs(weight_t: torch.Tensor) -> torch.Tensor:
    """`[K, N]` -> bfloat16 pair panels `[Np/32, Kp/2, 32, 2]` (K padded to a multiple of 32, N to
    one of 64, with zeros): panel b, row p holds (W[2p, c], W[2p+1, c]) for its 32 columns c."""
    k, n = weight_t.shape
    kp, np_ = -(-k // PAIR_K) * PAIR_K, -(-n // PANEL) * PANEL
    w = torch.nn.functional.pad(weight_t.to(torch.bfloat16), (0, np_ - n, 0, kp - k))
    return w.reshape(kp // 2, 2, np_ // PAIR_PANEL, PAIR_PANEL).permute(2, 0, 3, 1).contiguous()


def bf16_path(ext: Extension) -> str:
    """The fastest bf16 GEMM path this CPU runs: 'amx', 'avx512bf16' or 'emulated' (vdpbf16ps
    emulated over the vector layer, at every ISA level)."""
    return BF16_PATHS[ext.cpu_features()["bf16_path"]]


def available_bf16_paths(ext: Extension) -> list[str]:
    """The bf16 GEMM paths this build runs on this CPU (and OS), slowest first."""
    return [BF16_PATHS[i] for i in ext.cpu_features()["bf16_paths"]]


def resolve_bf16_path(ext: Extension, requested: str | None) -> str:
    """`requested` (e.g. from RADIXLM_BF16_PATH) if this CPU runs it, the fastest path if None;
    a ValueError naming the paths it can run otherwise."""
    if requested is None:
        return bf16_path(ext)
    available = available_bf16_paths(ext)
    if requested not in available:
        known = "" if requested in BF16_PATHS else f" (known paths: {', '.join(BF16_PATHS)})"
        raise ValueError(f"bf16 GEMM path {requested!r} cannot run here{known}; this CPU runs: {', '.join(available)}")
    return requested


def bf16_linear(
    ext: Extension, x: torch.Tensor, packed: torch.Tensor, n: int,
    residual: torch.Tensor | None = None, bias: torch.Tensor | None = None, path: str | None = None,
) -> torch.Tensor:
    """bf16(x) @ W (+ bias) (+ residual), W from `pack_pairs`, accumulated in float32, in x's dtype;
    `path` forces one of BF16_PATHS (an error where this CPU cannot run it)."""
    index = -1 if path is None else BF16_PATHS.index(path)
    return _run_padded(lambda xf, res, b: ext.bf16_linear(xf, packed, res, b, index), x,
                       packed.shape[0] * PAIR_PANEL, n, residual, bias)



def q_linear(
    ext: Extension, x: torch.Tensor, packed: torch.Tensor, n: int,
    residual: torch.Tensor | None = None, bias: torch.Tensor | None = None, mode: int = 0,
) -> torch.Tensor:
    """x @ W (+ bias) (+ residual) in x's dtype, W block-quantized in quant groups
    (kernels/quant.py `pack`); `mode` one of quant.MODES' values."""
    return _run_padded(lambda xf, res, b: ext.q_linear(xf, packed, mode, res, b), x, packed.shape[0] * quant.GROUP, n,
                       residual, bias)


PAGED_ATTENTION_HEAD_DIMS = (16, 32, 64, 80, 96, 128, 256)


def amx_attention_supported(ext: Extension, head_dim: int) -> bool:
    """Whether `paged_attention(..., amx=True)` runs long extends of this head size on AMX tiles
    here (AMX permitted, head_dim 64, 128 or 256)."""
    return bool(ext.amx_attention_supported(head_dim))


def flash_attention_supported(ext: Extension, head_dim: int) -> bool:
    """Whether `paged_attention(..., flash=True)` runs long extends of this head size with the
    vector kernel (head_dim 64 or 128): with vdpbf16ps or float32 FMAs, whichever the CPU runs
    faster (`ext.long_extend_uses_fma()`, timed once per process; FMAs where it lacks AVX512-BF16)."""
    return bool(ext.flash_attention_supported(head_dim))


def paged_attention(
    ext: Extension, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor, scale: float, amx: bool = False, flash: bool = False,
) -> torch.Tensor:
    """Attention of new tokens `q [T, Hq, D]` over their requests' context in the pool (K/V of
    the new tokens already written), causal; in q's dtype. Token i of request b is q row
    `extend_start_loc[b] + i` at position `seq_lens[b] - extend_lens[b] + i`. `amx` / `flash`:
    requests with long extends (16+ new tokens) over a bfloat16 pool take the AMX kernel where
    `amx_attention_supported`, else the flash-style vector kernel (vdpbf16ps or float32 FMAs, csrc/kernels/flash_attention.cpp) where `flash_attention_supported`; with `flash`, a batch sharing a long prefix takes the cascade."""
    wide = q.dtype not in (torch.float32, torch.bfloat16)
    out = ext.paged_attention(
        (q.float() if wide else q).contiguous(), k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens,
        extend_lens, extend_start_loc, scale, amx, flash,
    )
    return out.to(q.dtype) if wide else out
