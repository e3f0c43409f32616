"""The block-quantized GEMM (kernels/csrc/quant_gemm.cpp) and its packing (kernels/quant.py):
the packed blocks against the `gguf` package's own dequantization, the weight-only mode against
a float64 product of the dequantized weights, the int8 modes exactly against int8 activations
computed here (the VNNI path; skipped with the reason on a CPU without AVX512-VNNI), on odd
widths and batch sizes 1 / 3 / 16 / 17 / 64; and the dispatch facts. (Whole models: tests/runtime/test_quantized.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixlm.kernels import cpu_linear, quant

pytestmark = pytest.mark.skipif(not cpu_linear.cpu_supports_avx512(), reason="the kernels need AVX-512 (this CPU lacks it)")

FORMATS = ["q8_0", "q4_0", "q4_1", "w8a8_int8"]
SHAPES = [(40, 32), (100, 96), (576, 1536), (17, 576)]  # (N, K): N never a multiple of 64 but once
ROWS = [1, 3, 16, 17, 64]


def _has_vnni() -> bool:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return "avx512_vnni" in line.split()
    return False


def _weight(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[:, ::7] *= 4  # uneven magnitudes within blocks
    return w


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_packed_blocks_dequantize_as_gguf_does(fmt: str, shape: tuple[int, int]) -> None:
    n, k = shape
    qt = quant.quantize(_weight(n, k, 1), fmt)
    packed = quant.pack(qt)
    assert packed.dtype == torch.uint8 and packed.shape[0] * quant.GROUP % 64 == 0 and packed.shape[1] == k // 32
    # the file's bytes per weight exactly (34, 18, 20 per 32), padding columns aside
    assert packed.numel() * n == qt.nbytes * packed.shape[0] * quant.GROUP
    cols = torch.arange(n)
    assert torch.equal(quant.unpack_columns(packed, cols), qt.dequantize())  # gguf's dequantizer
    picked = torch.tensor([n - 1, 0, n // 2, n - 1])
    assert torch.equal(quant.unpack_columns(packed, picked), qt.dequantize()[picked])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_columns_dequantize_as_gguf_does(ext: Any, fmt: str, shape: tuple[int, int]) -> None:
    """`q_columns` (the quantized embedding's lookup with the C++ kernels) gives gguf's values bit
    for bit, for every column, repeated and unordered picks and more than one thread's worth of
    rows; a column past the groups is refused."""
    n, k = shape
    qt = quant.quantize(_weight(n, k, 1), fmt)
    packed = quant.pack(qt)
    reference = qt.dequantize()
    assert torch.equal(ext.q_columns(packed, torch.arange(n)), reference)
    picked = torch.tensor([n - 1, 0, n // 2, n - 1] * 40)
    assert torch.equal(ext.q_columns(packed, picked), reference[picked])
    assert ext.q_columns(packed, torch.tensor([], dtype=torch.int64)).shape == (0, k)
    with pytest.raises(RuntimeError, match="out of range"):
        ext.q_columns(packed, torch.tensor([packed.shape[0] * quant.GROUP]))


def test_w8a8_weights_are_per_channel_int8() -> None:
    w = _weight(24, 96, 2)
    deq = quant.quantize(w, "w8a8_int8").dequantize()
    scale = (w.abs().amax(dim=1) / 127).half().float()
    q = deq / scale[:, None]
    assert torch.allclose(q, q.round(), atol=1e-3) and q.abs().max() <= 127
    assert (deq - w).abs().max() <= scale.max() / 2 + 1e-6


def _reference(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ w.double().T
    if bias is not None:
        out += bias.double()
    if residual is not None:
        out += residual.double()
    return out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_weight_only_mode_matches_the_dequantized_product(ext: Any, fmt: str, shape: tuple[int, int]) -> None:
    n, k = shape
    qt = quant.quantize(_weight(n, k, 3), fmt)
    packed, w = quant.pack(qt), qt.dequantize()
    g = torch.Generator().manual_seed(4)
    for m in ROWS:
        x = torch.randn(m, k, generator=g)
        residual, bias = torch.randn(m, n, generator=g), torch.randn(n, generator=g)
        for res, b in [(None, None), (residual, bias)]:
            got = cpu_linear.q_linear(ext, x, packed, n, res, None if b is None else torch.nn.functional.pad(b, (0, -n % 64)))
            want = _reference(x, w, res, b)
            bound = 1e-5 * (x.abs().double() @ w.abs().double().T).max().item() + 1e-6
            assert got.shape == (m, n) and (got.double() - want).abs().max().item() <= bound, (fmt, m)


def _int8_reference(x: torch.Tensor, w: torch.Tensor, per_row: bool) -> torch.Tensor:
    """x rounded to int8 as the kernel does (scale max|x|/127 per 32-block or per row, x * (1/d)
    in float32, to nearest even), times the dequantized weights, in float64."""
    m, k = x.shape
    blocks = x.view(m, 1, k) if per_row else x.view(m, k // 32, 32)
    d = blocks.abs().amax(dim=2, keepdim=True) / 127
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv).clamp(-128, 127)
    return (q * d).reshape(m, k).double() @ w.double().T


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["int8", "int8_row"])
def test_int8_modes_are_exact_on_int8_activations(ext: Any, fmt: str, mode: str) -> None:
    """vpdpbusd over the int8 activations: exact integer sums per block, so the result equals the
    float64 product of the rounded activations and the weights but for float32 rounding of the
    per-block terms; and each call counts as a VNNI call."""
    if not _has_vnni():
        pytest.skip("this CPU lacks AVX512-VNNI: the int8 modes cannot run (the weight-only mode is tested here)")
    g = torch.Generator().manual_seed(5)
    for n, k in SHAPES:
        qt = quant.quantize(_weight(n, k, 6), fmt)
        packed, w = quant.pack(qt), qt.dequantize()
        for m in ROWS:
            x = torch.randn(m, k, generator=g)
            x[0, :32] = 0  # an all-zero block: scale 0
            calls = ext.num_vnni_calls()
            got = cpu_linear.q_linear(ext, x, packed, n, mode=quant.MODES[mode])
            assert ext.num_vnni_calls() == calls + 1
            want = _int8_reference(x, w, per_row=mode == "int8_row")
            bound = 2e-6 * (x.abs().double() @ w.abs().double().T).max().item() + 1e-6
            assert (got.double() - want).abs().max().item() <= bound, (fmt, mode, n, k, m)


def test_the_weight_only_mode_is_not_a_vnni_call(ext: Any) -> None:
    packed = quant.pack(quant.quantize(_weight(64, 64, 7), "q4_1"))
    calls = ext.num_vnni_calls()
    cpu_linear.q_linear(ext, torch.randn(3, 64), packed, 64, mode=quant.MODES["float32"])
    assert ext.num_vnni_calls() == calls


def test_dispatch_follows_the_cpu_flags(ext: Any) -> None:
    assert ext.cpu_features()["avx512vnni"] == _has_vnni() == cpu_linear.cpu_supports_vnni()


def test_bad_operands_are_refused(ext: Any) -> None:
    packed = quant.pack(quant.quantize(_weight(64, 64, 8), "q8_0"))
    with pytest.raises(RuntimeError, match="matching x"):
        ext.q_linear(torch.randn(2, 96), packed, 0)
    with pytest.raises(RuntimeError, match="unknown quantized mode"):
        ext.q_linear(torch.randn(2, 64), packed, 7)
    with pytest.raises(RuntimeError, match="no quantized format has 100-byte blocks"):
        ext.q_linear(torch.randn(2, 64), torch.zeros(4, 2, 100, dtype=torch.uint8), 0)
    with pytest.raises(ValueError, match="multiple of 32"):
        quant.quantize(torch.randn(8, 48), "q8_0")
    with pytest.raises(ValueError, match="different formats"):
        quant.QuantizedTensor.cat([quant.quantize(_weight(8, 32, 1), "q8_0"), quant.quantize(_weight(8, 32, 1), "q4_0")])
