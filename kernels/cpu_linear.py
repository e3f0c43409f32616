"""C++ CPU kernels: linear layers over weights packed in 64-column panels (float32 or bfloat16,
csrc/packed_gemm.h), read once per step for up to 4 rows; DecodeStack (csrc/decode_stack.h),
every decoder layer of a decode step in one call; and paged attention (csrc/paged_attention.cpp),
causal attention of any batch's new tokens reading K/V in place from the KV pool.

Built on first use with torch's C++ extension tooling (gcc, ninja from the `ninja` wheel) into
`build_root` (the runtime passes its cache's `extensions/` folder), keyed by the source and torch version, under a file lock so concurrent
processes build once. `load()` returns None (and says why, once) where it cannot run: no
AVX-512 (avx512f + avx512bw), no compiler, a failed build; callers then keep torch's matmul.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
from pathlib import Path
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

PANEL = 64
CSRC = Path(__file__).parent / "csrc"
SOURCES = [CSRC / "packed_linear.cpp", CSRC / "decode_stack.cpp", CSRC / "paged_attention.cpp"]
HEADERS = [CSRC / "packed_gemm.h", CSRC / "decode_stack.h", CSRC / "simd_math.h"]
_state: dict[str, ModuleType | None] = {}


def cpu_supports_avx512() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512f" in flags and " avx512bw" in flags


def load(build_root: Path) -> ModuleType | None:
    """The compiled extension, or None if it cannot be used here (the reason is logged once).
    The first call builds (or finds) it under `build_root`; later calls return that result."""
    if "ext" not in _state:
        _state["ext"] = _build(build_root)
    return _state["ext"]


def _build(build_root: Path) -> ModuleType | None:
    if not cpu_supports_avx512():
        logger.info("packed CPU linear kernel off: this CPU lacks avx512f/avx512bw")
        return None
    from torch.utils.cpp_extension import load as load_extension

    digest = hashlib.sha256(torch.__version__.encode())
    for path in SOURCES + HEADERS:
        digest.update(path.read_bytes())
    build_dir = build_root / f"cpu_kernels-{digest.hexdigest()[:16]}"
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        import ninja  # the wheel's binary; the venv's bin/ is not necessarily on PATH

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass
    try:
        with open(build_dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return load_extension(
                name="radixlm_cpu_kernels",
                sources=[str(path) for path in SOURCES],
                build_directory=str(build_dir),
                extra_cflags=["-O3", "-mavx512f", "-mavx512bw", "-fopenmp"],
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
    except Exception as e:  # a missing compiler or ninja, a failed build: fall back to torch
        logger.warning("packed CPU linear kernel off: build failed (%s)", str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None


def pack(weight_t: torch.Tensor) -> torch.Tensor:
    """`[K, N]` -> `[ceil(N/64), K, 64]` panels (zero-padded columns), same dtype."""
    k, n = weight_t.shape
    padded = -(-n // PANEL) * PANEL
    if padded != n:
        weight_t = torch.nn.functional.pad(weight_t, (0, padded - n))
    return weight_t.reshape(k, padded // PANEL, PANEL).permute(1, 0, 2).contiguous()


def packed_linear(
    ext: ModuleType, x: torch.Tensor, packed: torch.Tensor, n: int,
    residual: torch.Tensor | None = None, bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ W (+ bias) (+ residual) in x's dtype; `n` is W's true column count."""
    xf = x.float().contiguous()
    res = None
    padded = packed.shape[0] * PANEL
    if residual is not None:
        res = residual.float()
        if padded != n:
            res = torch.nn.functional.pad(res, (0, padded - n))
    if bias is not None and bias.numel() != padded:
        bias = torch.nn.functional.pad(bias.float(), (0, padded - bias.numel()))
    out = ext.packed_linear(xf, packed, res, bias)
    if padded != n:
        out = out[:, :n]
    return out if x.dtype == torch.float32 else out.to(x.dtype)




PAGED_ATTENTION_HEAD_DIMS = (16, 32, 64, 80, 96, 128, 256)


def paged_attention(
    ext: ModuleType, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor, scale: float,
) -> torch.Tensor:
    """Attention of new tokens `q [T, Hq, D]` over their requests' context in the pool (K/V of
    the new tokens already written), causal; in q's dtype. Token i of request b is q row
    `extend_start_loc[b] + i` at position `seq_lens[b] - extend_lens[b] + i`."""
    out = ext.paged_attention(
        q.float().contiguous(), k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, extend_lens,
        extend_start_loc, scale,
    )
    return out if q.dtype == torch.float32 else out.to(q.dtype)
