"""The block-quantized GEMM (kernels/csrc/kernels/quant_gemm.cpp) and its packing (kernels/quant.py),
at every ISA level this CPU runs (the `ext` fixture): the packed blocks against the `gguf`
package's own dequantization, the weight-only mode against a float64 product of the dequantized
weights, the int8 modes against int8 activations computed here, on each int8 dot variant the
level runs here (simd/dot_int8.h: vpdpbusd, vpmaddubsw, NEON, plain C++), which must give the same
bits; odd widths, batch sizes 1 / 3 / 16 / 17 / 64, and weights at the ends of their ranges (where
vpmaddubsw's int16 pairs would saturate without the sign trick). The torch-free driver
(tests/kernels/csrc/test_quant_gemm.cpp) checks the same per level, with bit-equal outputs on 1-3
threads, natively on x86 and for aarch64 (NEON, dotprod) under qemu. (Whole models:
tests/runtime/test_quantized.py.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from test_vec_layer import (  # the C++ drivers' build and run
    ARM_LEVELS,
    NATIVE_BUILDS,
    REPO,
    _arm_case,
    _native_case,
)

from radixlm.kernels import cpu_linear, quant

FORMATS = ["q8_0", "q4_0", "q4_1", "w8a8_int8"]
SHAPES = [(40, 32), (100, 96), (576, 1536), (17, 576)]  # (N, K): N never a multiple of 64 but once
ROWS = [1, 3, 16, 17, 64]

# the int8 dot variant each build picks first where the level allows the feature it names
FASTEST_VARIANT = {"avx512": ("avx512_vnni", "avx512bw"), "avx2": ("avx_vnni", "avx2"), "neon": ("neon_dotprod", "neon")}
VARIANT_FEATURES = {"avx512_vnni": "avx512_vnni", "avx_vnni": "avx_vnni", "neon_dotprod": "dotprod"}


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


@contextmanager
def _variant(ext: Any, name: str) -> Iterator[None]:
    """The int8 modes on dot variant `name` inside the block (the fastest again after it)."""
    ext.set_int8_variant(name)
    try:
        yield
    finally:
        ext.set_int8_variant("")


def _on_each_variant(ext: Any, product: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`product()` on every int8 dot variant this level runs here; their outputs must be the same
    bits (each variant's integer sums are exact). Each call counts as one int8 call."""
    outs = {}
    for name in ext.int8_variants():
        with _variant(ext, name):
            assert ext.int8_variant() == name
            calls = ext.num_vnni_calls()
            outs[name] = product()
            assert ext.num_vnni_calls() == calls + 1
    first, *others = outs
    for name in others:
        assert torch.equal(outs[name], outs[first]), f"{name} differs from {first}"
    return outs[first]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["int8", "int8_row"])
def test_int8_modes_are_exact_on_int8_activations(ext: Any, fmt: str, mode: str) -> None:
    """Exact integer sums per block on every dot variant, so the result equals the float64 product
    of the rounded activations and the weights but for float32 rounding of the per-block terms."""
    g = torch.Generator().manual_seed(5)
    for n, k in SHAPES:
        qt = quant.quantize(_weight(n, k, 6), fmt)
        packed, w = quant.pack(qt), qt.dequantize()
        for m in ROWS:
            x = torch.randn(m, k, generator=g)
            x[0, :32] = 0  # an all-zero block: scale 0
            got = _on_each_variant(ext, partial(cpu_linear.q_linear, ext, x, packed, n, mode=quant.MODES[mode]))
            want = _int8_reference(x, w, per_row=mode == "int8_row")
            bound = 2e-6 * (x.abs().double() @ w.abs().double().T).max().item() + 1e-6
            assert (got.double() - want).abs().max().item() <= bound, (fmt, mode, n, k, m)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_each_row_is_the_row_alone_whatever_rows_share_the_product(ext: Any, fmt: str) -> None:
    """A speculative verify step's rows go through one product: each row's output is, to the bit,
    what that row gives alone, whatever row count (and so register tile: the narrow one at 1-2
    rows on AVX-512, the wide one past it) and whichever rows share its pass."""
    g = torch.Generator().manual_seed(13)
    n, k = 200, 576
    packed = quant.pack(quant.quantize(_weight(n, k, 14), fmt))
    x = torch.randn(17, k, generator=g)
    for mode in ("int8", "float32"):
        def run(rows: torch.Tensor, mode: str = mode) -> torch.Tensor:
            return cpu_linear.q_linear(ext, rows, packed, n, mode=quant.MODES[mode])

        alone = torch.cat([run(x[i : i + 1]) for i in range(17)])
        for m in (2, 3, 5, 9, 16, 17):
            assert torch.equal(run(x[:m]), alone[:m]), (fmt, mode, m)
            assert torch.equal(run(x[17 - m :]), alone[17 - m :]), (fmt, mode, m)


def _extreme_q8_0(n: int, k: int, q: int, seed: int) -> quant.QuantizedTensor:
    """A q8_0 weight whose values are all `q` but for random ones at the ends of the range
    (-128, -127, 127: -128 is never written by gguf's quantizer, but a file may hold it)."""
    g = torch.Generator().manual_seed(seed)
    nb = k // 32
    values = torch.full((n, nb, 32), q, dtype=torch.int8)
    ends = torch.tensor([-128, -127, 127], dtype=torch.int8)
    pick = torch.rand(n, nb, 32, generator=g) < 0.3
    values[pick] = ends[torch.randint(0, 3, (int(pick.sum()),), generator=g)]
    d = (torch.rand(n, nb, 1, generator=g) * 0.01 + 0.001).half()
    raw = torch.cat([d.view(torch.uint8).view(n, nb, 2), values.view(torch.uint8)], dim=2)
    return quant.QuantizedTensor("q8_0", raw.reshape(n, -1).contiguous(), k)


@pytest.mark.parametrize("q", [-128, 127])
def test_int8_modes_are_exact_at_the_ends_of_the_ranges(ext: Any, q: int) -> None:
    """Q8_0 values at -128 / 127 against activations at +-127 (x's largest |int8|: each 32-block
    all at its max |x|): every variant exact, where vpmaddubsw on the stored unsigned bytes would
    saturate its int16 pairs (2 * 255 * 127); and Q4 nibbles at 15, the int16-summed variants' worst
    case."""
    g = torch.Generator().manual_seed(11)
    n, k = 64, 96
    signs = torch.where(torch.rand(5, k, generator=g) < 0.5, -1.0, 1.0)
    signs[0], signs[1] = 1.0, -1.0  # rows of one sign: the largest sums
    x = signs * torch.rand(5, 1, generator=g).add(0.5)  # every element at its block's max |x|: int8 +-127
    nibbles = torch.ones(n, k)
    nibbles[:, ::32] = 0  # q4_1 from min 0 to max 1: nibbles 15 but one a block
    for qt in [_extreme_q8_0(n, k, q, 12), quant.quantize(nibbles, "q4_1")]:
        packed, w = quant.pack(qt), qt.dequantize()
        got = _on_each_variant(ext, partial(cpu_linear.q_linear, ext, x, packed, n, mode=quant.MODES["int8"]))
        want = _int8_reference(x, w, per_row=False)
        bound = 2e-6 * (x.abs().double() @ w.abs().double().T).max().item() + 1e-6
        assert (got.double() - want).abs().max().item() <= bound, qt.fmt


def test_the_weight_only_mode_is_not_an_int8_call(ext: Any) -> None:
    packed = quant.pack(quant.quantize(_weight(64, 64, 7), "q4_1"))
    calls = ext.num_vnni_calls()
    cpu_linear.q_linear(ext, torch.randn(3, 64), packed, 64, mode=quant.MODES["float32"])
    assert ext.num_vnni_calls() == calls


def test_int8_variants_follow_the_level(ext: Any) -> None:
    """Each level runs the int8 modes: on the fastest dot variant whose feature the level allows
    here (AVX512-VNNI, AVX-VNNI, dotprod), else the build's plain vector one, else plain C++; a
    variant can be forced for a test (and a forced one the level lacks is refused)."""
    features = ext.cpu_features()
    variants = ext.int8_variants()
    assert variants[-1] == "generic"
    fast, plain = FASTEST_VARIANT.get(features["build"], ("generic", "generic"))
    expected = fast if VARIANT_FEATURES.get(fast) and features[VARIANT_FEATURES[fast]] else plain
    assert ext.int8_variant() == variants[0] == expected
    for name, feature in VARIANT_FEATURES.items():
        if name in variants:
            assert features[feature]
    with _variant(ext, "generic"):
        assert ext.int8_variant() == "generic"
    assert ext.int8_variant() == expected
    with pytest.raises(RuntimeError, match="unknown int8 dot variant"):
        ext.set_int8_variant("avx1024")
    if features["build"] == "avx2" and not features["avx_vnni"]:
        with pytest.raises(RuntimeError, match="does not run"):
            ext.set_int8_variant("avx_vnni")


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


# the driver links the kernel itself, torch-free (kernels/parallel.h on OpenMP)
DRIVER_FLAGS = ["-DRADIXLM_NO_TORCH", "-fopenmp",
                *(str(REPO / "kernels" / "csrc" / "kernels" / name) for name in ("quant_gemm.cpp", "kquant_gemm.cpp"))]


@pytest.mark.parametrize("level", NATIVE_BUILDS)
def test_driver_native(level: str, tmp_path: Path) -> None:
    _native_case(level, "test_quant_gemm.cpp", rf"quant_gemm {level}: \d+ checks passed", tmp_path, DRIVER_FLAGS)


@pytest.mark.parametrize("test_id", list(ARM_LEVELS))
def test_driver_aarch64(test_id: str, tmp_path: Path) -> None:
    """qemu's `max` CPU has dotprod: the neon builds run the neon_dotprod, neon and generic variants."""
    closing = rf"quant_gemm {ARM_LEVELS[test_id][0]}: \d+ checks passed \(int8 variants: [a-z_ ]+\)"
    _arm_case(test_id, "test_quant_gemm.cpp", closing, tmp_path, DRIVER_FLAGS)
