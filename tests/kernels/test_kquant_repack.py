"""The C++ repack of GGUF blocks into quant groups (csrc/kernels/kquant_repack.h) against its
reference, quant.pack in torch: byte for byte, for every format we keep quantized, on random
blocks (any bytes are a valid block: the repack only moves bits), N not a multiple of 16 or 64
(padding), a weight given as row blocks of strided views, at every ISA level this CPU runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from radixlm.kernels import quant

# (format, N, K): odd N pads to 64 columns; K of several blocks
SHAPES = [("q4_k", 77, 512), ("q5_k", 33, 512), ("q6_k", 130, 256), ("q8_0", 21, 96), ("q4_0", 64, 64),
          ("q4_1", 50, 128)]


def random_weight(fmt: str, n: int, k: int, seed: int) -> quant.QuantizedTensor:
    gguf_bytes, block_k = quant.FORMATS[fmt]
    generator = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n, k // block_k * gguf_bytes), dtype=torch.uint8, generator=generator)
    return quant.QuantizedTensor(fmt, raw, k)


@pytest.mark.parametrize(("fmt", "n", "k"), SHAPES)
def test_repack_matches_torch_pack(ext: Any, fmt: str, n: int, k: int) -> None:
    weight = random_weight(fmt, n, k, seed=n)
    expected = quant.pack(weight)
    repack = ext.ops.quant_repack.default
    assert torch.equal(quant.pack(weight, repack), expected)
    # the same weight fused from row blocks (QuantizedTensor.cat: no copy), one a view whose rows
    # are strided past their bytes: the C++ repack reads them in place, torch's joins them first
    wide = torch.zeros(n, weight.raw.shape[1] + 8, dtype=torch.uint8)
    wide[:, 3:3 + weight.raw.shape[1]] = weight.raw
    fused = quant.QuantizedTensor.cat([weight.rows(slice(0, 5)), quant.QuantizedTensor(fmt, wide[5:, 3:-5], k)])
    assert len(fused.row_blocks) == 2 and fused.shape == weight.shape
    assert torch.equal(quant.pack(fused, repack), expected)
    assert torch.equal(quant.pack(fused), expected) and len(fused.row_blocks) == 1

def test_repack_same_on_any_thread_count(ext: Any, on_thread_counts: Any) -> None:
    weight = random_weight("q4_k", 200, 1024, seed=1)
    outs = on_thread_counts(lambda: quant.pack(weight, ext.ops.quant_repack.default))
    assert all(torch.equal(out, quant.pack(weight)) for out in outs)


def test_repack_refuses_bad_input(ext: Any) -> None:
    repack = ext.ops.quant_repack.default
    raw = torch.zeros(16, 144, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="unknown format 'q3_k'"):
        repack([raw], 256, "q3_k", 64)
    with pytest.raises(RuntimeError, match=r"uint8 \[rows, 288\]"):
        repack([raw], 512, "q4_k", 64)
    with pytest.raises(RuntimeError, match="not a multiple of 256"):
        repack([raw], 100, "q4_k", 64)
