"""GGUF's K-quants (Q4_K, Q5_K, Q6_K; kernels/kquants.py, csrc/kernels/kquant_gemm.cpp): our
reference quantizer against the `gguf` package's own dequantizer (bounded error, on random,
extreme and zero weights), our packing and both our dequantizers (torch and C++ `q_columns`) bit
for bit against gguf's on random bytes (every bit of every field), and the kernel's products
against a float64 product of gguf's dequantized weights at every ISA level this CPU runs (the
`ext` fixture), with bias and residual, on 1-3 threads; Q4_K's int8 modes against int8-rounded
activations on every int8 dot variant, and its one-row kernel (a decode step at batch 1) the same
bits as the tiled product on every variant and thread count. The torch-free driver
(tests/kernels/csrc/test_quant_gemm.cpp) checks the products per level natively and under qemu."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
from test_quant_gemm import _int8_reference, _on_each_variant, _reference, _variant

from radixlm.kernels import cpu_linear, kquants, quant

KQUANTS = ["q4_k", "q5_k", "q6_k"]
SHAPES = [(40, 256), (100, 768)]  # (N, K): N not a multiple of 64
ROWS = [1, 5, 17]


def _weight(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[:, ::7] *= 4  # uneven magnitudes within sub-blocks
    return w


def _extremes(k: int) -> torch.Tensor:
    """Rows at the formats' edges: zeros, constants of either sign, one sub-block far larger than
    the rest, all positive, all negative, tiny values, alternating +-c (Q6_K's clipped end)."""
    g = torch.Generator().manual_seed(9)
    rows = [torch.zeros(k), torch.full((k,), 0.75), torch.full((k,), -2.0), torch.rand(k, generator=g) + 1,
            -torch.rand(k, generator=g) - 0.5, torch.randn(k, generator=g) * 1e-3,
            torch.tensor([1.0, -1.0]).repeat(k // 2)]
    spike = torch.randn(k, generator=g) * 0.01
    spike[32:64] *= 3000
    return torch.stack(rows + [spike])


def _random_bytes(n: int, k: int, fmt: str, seed: int) -> quant.QuantizedTensor:
    """Random bytes in every field but the float16 scales, whose exponents are kept finite."""
    g = torch.Generator().manual_seed(seed)
    size = kquants.KQUANTS[fmt][0]
    raw = torch.randint(0, 256, (n, k // kquants.SUPER, size), generator=g, dtype=torch.uint8)
    for at in [208] if fmt == "q6_k" else [0, 2]:
        raw[:, :, at + 1] &= 0x3B  # high byte of a float16: |x| < 2 ** 0
    return quant.QuantizedTensor(fmt, raw.reshape(n, -1).contiguous(), k)


def _error_bound(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """Per element, the error our quantizer may make (kquants.quantize): half a step of the value's
    sub-block plus the rounding of the 6-bit scale and min (a step of d, half a step of dmin), for
    Q6_K a step (a value at +max|x| of a sub-block whose -max|x| maps to -32 clips to 31)."""
    n, k = w.shape
    eps = 2.0 ** -24  # a float16 scale's smallest step (rounded up)
    if fmt == "q6_k":
        sub = w.view(n, k // 256, 16, 16)
        scale = sub.abs().amax(-1) / 32
        d = scale.amax(-1, keepdim=True) / 127 * 1.001 + eps
        return (scale + d).repeat_interleave(16, dim=2).reshape(n, k) * 1.0001
    levels = kquants.LEVELS[fmt]
    sub = w.view(n, k // 256, 8, 32)
    low, high = sub.amin(-1).clamp(max=0), sub.amax(-1).clamp(min=0)
    scale = (high - low) / levels
    d = scale.amax(-1, keepdim=True) / 63 * 1.001 + eps
    dmin = (-low).amax(-1, keepdim=True) / 63 * 1.001 + eps
    return ((scale + d) / 2 + dmin / 2).repeat_interleave(32, dim=2).reshape(n, k) * 1.0001 + 1e-7


@pytest.mark.parametrize("fmt", KQUANTS)
def test_our_quantizer_is_close_through_gguf_dequantizer(fmt: str) -> None:
    w = torch.cat([_weight(24, 512, 1), _extremes(512)])
    qt = quant.quantize(w, fmt)
    assert qt.raw.shape == (w.shape[0], 2 * kquants.KQUANTS[fmt][0]) and qt.shape == w.shape
    err, bound = (qt.dequantize() - w).abs(), _error_bound(w, fmt)  # gguf.quants.dequantize
    assert (err <= bound).all(), (fmt, (err / bound).max().item())
    assert torch.equal(qt.dequantize()[24], torch.zeros(512))  # zeros stay zeros
    assert err[:24].mean() < 0.5 * bound[:24].mean()  # rounding to the nearest level: ~ a quarter step on average
    with pytest.raises(ValueError, match="multiple of 256"):
        quant.quantize(torch.randn(4, 96), fmt)


@pytest.mark.parametrize("fmt", KQUANTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_packed_blocks_dequantize_as_gguf_does(ext: Any, fmt: str, shape: tuple[int, int]) -> None:
    """Random bytes (every bit of every field: values, high bits, 6-bit scales and mins, signed
    Q6_K scales) through pack, then our torch and C++ dequantizers: gguf's values bit for bit, at
    the file's bytes per weight."""
    n, k = shape
    qt = _random_bytes(n, k, fmt, seed=n + k)
    packed, reference = quant.pack(qt), qt.dequantize()
    assert packed.shape == (-(-n // 64) * 4, k // 256, quant.block_bytes(fmt)) and quant.format_of(packed) == fmt
    assert packed.numel() * n == qt.nbytes * packed.shape[0] * quant.GROUP  # 144, 176, 210 bytes per 256
    assert torch.equal(quant.unpack_columns(packed, torch.arange(n)), reference)
    picked = torch.tensor([n - 1, 0, n // 2, n - 1] * 20)
    assert torch.equal(quant.unpack_columns(packed, picked), reference[picked])
    assert torch.equal(ext.q_columns(packed, torch.arange(n)), reference)
    assert torch.equal(ext.q_columns(packed, picked), reference[picked])
    with pytest.raises(RuntimeError, match="out of range"):
        ext.q_columns(packed, torch.tensor([packed.shape[0] * quant.GROUP]))


@pytest.mark.parametrize("fmt", KQUANTS)
def test_weight_only_products_match_the_dequantized_product(ext: Any, fmt: str, on_thread_counts: Any) -> None:
    """The weight-only mode: float32 products of gguf's dequantized weights, in another order of
    additions, bit-equal on 1-3 threads; and the int8 modes (_check_int8_modes)."""
    g = torch.Generator().manual_seed(4)
    for i, (n, k) in enumerate(SHAPES):
        qt = _random_bytes(n, k, fmt, seed=i) if i else quant.quantize(_weight(n, k, 3), fmt)
        packed, w = quant.pack(qt), qt.dequantize()
        for m in ROWS:
            x = torch.randn(m, k, generator=g)
            residual, bias = torch.randn(m, n, generator=g), torch.randn(n, generator=g)
            bound = 1e-5 * (x.abs().double() @ w.abs().double().T).max().item() + 1e-6
            for res, b in [(None, None), (residual, bias)]:
                got = cpu_linear.q_linear(ext, x, packed, n, res, b)
                assert got.shape == (m, n) and (got.double() - _reference(x, w, res, b)).abs().max().item() <= bound
            _check_int8_modes(ext, fmt, x, packed, w, n)
        outs = on_thread_counts(partial(cpu_linear.q_linear, ext, x, packed, n))
        assert all(torch.equal(o, outs[0]) for o in outs)


def _check_int8_modes(ext: Any, fmt: str, x: torch.Tensor, packed: torch.Tensor, w: torch.Tensor, n: int) -> None:
    """Q4_K and Q6_K: int8 x int8 (Q4_K's 32-k sub-blocks and Q6_K's pairs of 16-k scale spans are
    x's int8 blocks), exact integer sums on every dot variant, so the float64 product of the
    rounded activations within float32 rounding; Q5_K: the weight-only kernel in every mode, the
    same bits (and no int8 call)."""
    plain, calls = cpu_linear.q_linear(ext, x, packed, n), ext.num_vnni_calls()
    for mode in ("int8", "int8_row"):
        product = partial(cpu_linear.q_linear, ext, x, packed, n, mode=quant.MODES[mode])
        if fmt == "q5_k":
            assert torch.equal(product(), plain)
            continue
        got = _on_each_variant(ext, product)
        bound = 2e-6 * (x.abs().double() @ w.abs().double().T).max().item() + 1e-6
        assert (got.double() - _int8_reference(x, w, per_row=mode == "int8_row")).abs().max().item() <= bound
    assert ext.num_vnni_calls() == calls + (0 if fmt == "q5_k" else 2 * len(ext.int8_variants()))


def test_bad_k_quant_operands_are_refused(ext: Any) -> None:
    packed = quant.pack(quant.quantize(_weight(64, 256, 8), "q4_k"))
    with pytest.raises(RuntimeError, match="matching x"):
        ext.q_linear(torch.randn(2, 32), packed, 0)
    with pytest.raises(ValueError, match="unknown quantized format"):
        quant.quantize(torch.randn(4, 256), "q3_k")
    with pytest.raises(ValueError, match="different formats"):
        quant.QuantizedTensor.cat([quant.quantize(_weight(8, 256, 1), "q4_k"), quant.quantize(_weight(8, 256, 1), "q6_k")])


@pytest.mark.parametrize(("n", "k"), [(96, 512), (4160, 256)])  # one pair of quant groups / threads' halves uneven
def test_q4_k_one_row_kernel_gives_the_tiled_products_bits(ext: Any, on_thread_counts: Any, n: int, k: int) -> None:
    """q4k_row_linear (the batch-1 Q4_K product q_gemm takes in an int8 mode, so every caller's:
    DecodeStack, the fused experts, q_linear) equals the tiled kernel's row to the bit (row 0 of
    a two-row q_linear, which the row kernel does not take), with and without residual and bias,
    on every int8 dot variant and thread count, and q_linear's one row is it; a float mode or a
    non-Q4_K weight is refused."""
    packed = quant.pack(quant.quantize(_weight(n, k, 11), "q4_k"))
    cols = packed.shape[0] * quant.GROUP
    g = torch.Generator().manual_seed(12)
    x, residual, bias = torch.randn(1, k, generator=g), torch.randn(1, cols, generator=g), torch.randn(cols, generator=g)
    two = torch.cat([x, torch.randn(1, k, generator=g)])
    for mode in (quant.MODES["int8"], quant.MODES["int8_row"]):
        for name in ext.int8_variants():
            with _variant(ext, name):
                for res, b in [(None, None), (residual, bias)]:
                    want = ext.q_linear(two, packed, mode, None if res is None else res.repeat(2, 1), b)[:1]
                    outs = on_thread_counts(partial(ext.q4k_row_linear, x, packed, mode, res, b))
                    assert all(torch.equal(o, want) for o in outs), (mode, name)
                    assert torch.equal(ext.q_linear(x, packed, mode, res, b), want)
    with pytest.raises(RuntimeError, match="takes an int8 mode"):
        ext.q4k_row_linear(x, packed, quant.MODES["float32"], None, None)
    with pytest.raises(RuntimeError, match="Q4_K quant groups"):
        ext.q4k_row_linear(x, quant.pack(quant.quantize(_weight(n, k, 11), "q6_k")), quant.MODES["int8"], None, None)
    with pytest.raises(RuntimeError, match=r"\[1, K\]"):
        ext.q4k_row_linear(x.repeat(2, 1), packed, quant.MODES["int8"], None, None)
