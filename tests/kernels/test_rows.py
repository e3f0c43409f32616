"""The fused row-wise kernels of prefill-sized steps (kernels/csrc/kernels/rows.cpp), at every ISA
level this CPU runs: RMSNorm and SiLU(gate) * up against torch, float32 and bfloat16, widths
below, at and past whole vectors (partial-vector tails), strided rows. The torch-free driver
(tests/kernels/csrc/test_rows.cpp) checks the kernels against float64, with the same bits on 1-3
threads, natively per x86 build and for aarch64 under qemu."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_vec_layer import (  # the C++ drivers' build and run
    ARM_LEVELS,
    NATIVE_BUILDS,
    REPO,
    _arm_case,
    _native_case,
)


def _bf16_close(out: torch.Tensor, exact: torch.Tensor) -> None:
    """bf16 output within one bf16 rounding (2^-8 relative) of the float32 result."""
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), exact, atol=1e-6, rtol=2 ** -8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "width"), [(1, 576), (7, 100), (300, 64), (33, 13), (2, 16), (3, 47)])
@pytest.mark.parametrize("weighted", [False, True])
def test_rms_norm_matches_torch(ext: Any, dtype: torch.dtype, rows: int, width: int, weighted: bool) -> None:
    gen = torch.Generator().manual_seed(rows * width)
    wide = torch.randn(rows, width + 5, generator=gen) * 3
    x = wide[:, :width].to(dtype) if dtype == torch.float32 else wide.to(dtype)[:, :width]  # rows width + 5 apart
    weight = torch.rand(width, generator=gen) if weighted else None
    out = ext.rms_norm(x, weight, 1e-5)
    exact = F.rms_norm(x.float(), (width,), weight, 1e-5)
    assert out.shape == (rows, width) and out.is_contiguous()
    if dtype == torch.float32:
        torch.testing.assert_close(out, exact, atol=1e-6, rtol=1e-6)
    else:
        _bf16_close(out, exact)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "width"), [(1, 1536), (5, 100), (64, 13), (2, 32), (3, 47)])
def test_silu_mul_matches_torch(ext: Any, dtype: torch.dtype, rows: int, width: int) -> None:
    gen = torch.Generator().manual_seed(rows + width)
    padded = torch.randn(rows, 2 * width + 3, generator=gen) * 4
    gate_up = padded[:, : 2 * width].to(dtype)  # rows may be strided (a packed product's slice)
    gate, up = gate_up.float().chunk(2, dim=-1)
    exact = F.silu(gate) * up
    out = ext.silu_mul(gate_up)
    assert out.shape == (rows, width)
    if dtype == torch.float32:
        torch.testing.assert_close(out, exact, atol=1e-5, rtol=1e-5)
    else:
        _bf16_close(out, exact)


def test_bad_shapes_are_refused(ext: Any) -> None:
    with pytest.raises(RuntimeError, match="even width"):
        ext.silu_mul(torch.randn(2, 7))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ext.rms_norm(torch.randn(2, 8).half(), None, 1e-5)
    with pytest.raises(RuntimeError, match="weight must be contiguous float32"):
        ext.rms_norm(torch.randn(2, 8), torch.ones(9), 1e-5)


# the driver links the row kernels alone, torch-free (kernels/parallel.h on OpenMP)
DRIVER = ["-DRADIXLM_NO_TORCH", "-fopenmp", str(REPO / "kernels" / "csrc" / "kernels" / "rows.cpp")]


@pytest.mark.parametrize("level", NATIVE_BUILDS)
def test_driver_native(level: str, tmp_path: Path) -> None:
    _native_case(level, "test_rows.cpp", rf"rows {level}: \d+ checks passed", tmp_path, DRIVER)


@pytest.mark.parametrize("test_id", ["generic", "neon"])
def test_driver_aarch64(test_id: str, tmp_path: Path) -> None:
    _arm_case(test_id, "test_rows.cpp", rf"rows {ARM_LEVELS[test_id][0]}: \d+ checks passed", tmp_path, DRIVER)
