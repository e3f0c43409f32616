"""Block-quantized weights as our kernels read them (csrc/kernels/quant_gemm.h): GGUF's Q8_0, Q4_0 and
Q4_1 blocks (32 k of one column, float16 scale d, Q4_1 also a float16 minimum m), repacked into
"quant groups" `[N/16, K/32, block bytes]` uint8, the file's bytes per weight exactly; and GGUF's
K-quants Q4_K, Q5_K, Q6_K (super-blocks of 256 k), as quant groups `[N/16, K/256, super-block
bytes]`, again the file's bytes per weight (kernels/kquants.py).

`QuantizedTensor` holds a weight `[N, K]` as the GGUF stores it (one row of blocks per output
channel), so a loader can permute and concatenate rows (fused q/k/v, RoPE layout) before `pack`;
`quantize` makes one from a float weight (GGUF's own quantizer for q8_0 / q4_0 / q4_1, ours
for the K-quants, or per-channel int8 for w8a8_int8), `unpack_columns` dequantizes chosen output columns of a packed
weight (an embedding lookup, and the tests' reference). Pure torch: no compiled code; `pack` takes
the C++ extension's `quant_repack` (csrc/kernels/kquant_repack.h: the same bytes, no torch temporaries) from
a caller that has the extension, and is its reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from radixlm.kernels import kquants

GROUP = 16  # columns of a quant group
BLOCK = 32  # k of a block
N_MULTIPLE = 64  # packed weights are padded to this many columns (the decode stack's widths)



class BlockFormat(NamedTuple):
    gguf_bytes: int  # bytes of one GGUF block (one column's `block_k` consecutive k)
    block_k: int  # k of a GGUF block: 32, or 256 for the K-quants


# the formats kept quantized (keys: GGUF's type names lower-cased)
FORMATS: dict[str, BlockFormat] = {
    "q8_0": BlockFormat(34, BLOCK), "q4_0": BlockFormat(18, BLOCK), "q4_1": BlockFormat(20, BLOCK),
    **{fmt: BlockFormat(gguf_bytes, kquants.SUPER) for fmt, (gguf_bytes, _, _) in kquants.KQUANTS.items()},
}
# 32-k formats -> (packed value bytes per block of a group, offset of the values)
_VALUES: dict[str, tuple[int, int]] = {"q8_0": (512, 128), "q4_0": (256, 8), "q4_1": (256, 0)}
# how each kernel mode feeds x to the products (csrc/kernels/quant_gemm.h QMode; the int8 ones run at every ISA level)
MODES = {"float32": 0, "int8": 1, "int8_row": 2}


def block_bytes(fmt: str) -> int:
    """Bytes of one packed block of a group: the values, d[16], and for q4_1 m[16] (float16); a
    K-quant's super-block (kquants.py)."""
    if fmt in kquants.KQUANTS:
        return kquants.super_block_bytes(fmt)
    values, _ = _VALUES[fmt]
    return values + (64 if fmt == "q4_1" else 32)


def format_of(packed: torch.Tensor) -> str:
    sizes = {block_bytes(f): f for f in FORMATS}
    return sizes[packed.shape[-1]]


class QuantizedTensor:
    """A weight `[N, K]` in a GGUF block format: `raw` is `[N, K/32 * GGUF bytes per block]` uint8,
    row n the blocks of output channel n, as in the file. It may be held as consecutive row blocks
    (`row_blocks`: a fused weight's parts, `cat`), joined into one tensor only when `raw` is first
    read: `pack` with the C++ repack reads the blocks where they are, so a fused expert's gate and
    up are never copied together."""

    def __init__(self, fmt: str, raw: torch.Tensor | tuple[torch.Tensor, ...], k: int):
        self.fmt, self.k = fmt, k
        self.row_blocks: tuple[torch.Tensor, ...] = (raw,) if isinstance(raw, torch.Tensor) else raw
        gguf_bytes, block_k = FORMATS[fmt]
        for block in self.row_blocks:
            if k % block_k or block.dim() != 2 or block.shape[1] != k // block_k * gguf_bytes:
                raise ValueError(f"a {fmt} weight of K {k} needs K a multiple of {block_k} and rows of "
                                 f"K / {block_k} x {gguf_bytes} bytes, got raw {tuple(block.shape)}")

    @property
    def raw(self) -> torch.Tensor:
        if len(self.row_blocks) > 1:
            self.row_blocks = (torch.cat(self.row_blocks),)
        return self.row_blocks[0]

    @staticmethod
    def from_rows(fmt: str, raw: torch.Tensor) -> QuantizedTensor:
        """The weight whose rows are `raw` `[N, blocks * GGUF bytes per block]` (K from the row size)."""
        gguf_bytes, block_k = FORMATS[fmt]
        return QuantizedTensor(fmt, raw, raw.shape[1] // gguf_bytes * block_k)

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(block.shape[0] for block in self.row_blocks), self.k)

    def rows(self, order: torch.Tensor | slice) -> QuantizedTensor:
        return QuantizedTensor(self.fmt, self.raw[order], self.k)

    @staticmethod
    def cat(parts: list[QuantizedTensor]) -> QuantizedTensor:
        """The rows of `parts` in order, as row blocks (no copy: `raw` joins them when read)."""
        fmts = {p.fmt for p in parts}
        if len(fmts) != 1 or len({p.k for p in parts}) != 1:
            raise ValueError(f"cannot fuse weights of different formats or widths: {sorted(fmts)}")
        return QuantizedTensor(parts[0].fmt, tuple(block for p in parts for block in p.row_blocks), parts[0].k)

    @property
    def nbytes(self) -> int:
        return sum(block.numel() for block in self.row_blocks)

    def dequantize(self) -> torch.Tensor:
        """float32 `[N, K]` (gguf's own dequantizer)."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        qtype = GGMLQuantizationType[self.fmt.upper()]
        return torch.from_numpy(dequantize(self.raw.numpy(), qtype).reshape(self.shape).astype(np.float32))


def quantize(weight: torch.Tensor, fmt: str) -> QuantizedTensor:
    """A float weight `[N, K]` (K a multiple of 32; 256 for a K-quant) in `fmt`: q8_0 / q4_0 / q4_1
    by GGUF's quantizer, q4_k / q5_k / q6_k by ours (kquants.quantize), or "w8a8_int8": per-channel
    symmetric int8 (one scale per row, max|w|/127), stored as q8_0 blocks that all carry the row's
    scale."""
    n, k = weight.shape
    if fmt in kquants.KQUANTS:
        return QuantizedTensor(fmt, kquants.quantize(weight, fmt), k)
    if fmt not in FORMATS and fmt != "w8a8_int8":
        raise ValueError(f"unknown quantized format {fmt!r}; formats: {', '.join([*FORMATS, 'w8a8_int8'])}")
    if k % BLOCK:
        raise ValueError(f"a quantized weight needs K a multiple of {BLOCK}, got {k}")
    w = weight.detach().float()
    if fmt == "w8a8_int8":
        d = (w.abs().amax(dim=1, keepdim=True) / 127).half().float()  # the scale as stored
        q = torch.where(d > 0, w / d.clamp_min(torch.finfo(torch.float16).tiny), 0).round().clamp(-127, 127)
        blocks = torch.cat([
            d.half().expand(n, k // BLOCK).contiguous().view(torch.uint8).view(n, k // BLOCK, 2),
            q.to(torch.int8).view(torch.uint8).view(n, k // BLOCK, BLOCK),
        ], dim=2)
        return QuantizedTensor("q8_0", blocks.reshape(n, -1).contiguous(), k)
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize as gguf_quantize

    raw = gguf_quantize(w.numpy(), GGMLQuantizationType[fmt.upper()])
    return QuantizedTensor(fmt, torch.from_numpy(np.ascontiguousarray(raw)), k)


def _split(t: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(u [N, nb, 32] uint8 unsigned values in k order, d [N, nb] float16, m [N, nb] float16 or None)."""
    n, k = t.shape
    nb = k // BLOCK
    b = t.raw.view(n, nb, FORMATS[t.fmt][0])
    d = b[:, :, 0:2].contiguous().view(torch.float16).view(n, nb)
    if t.fmt == "q8_0":
        return b[:, :, 2:].bitwise_xor(0x80), d, None  # signed q -> q + 128
    m = b[:, :, 2:4].contiguous().view(torch.float16).view(n, nb) if t.fmt == "q4_1" else None
    qs = b[:, :, 4:] if t.fmt == "q4_1" else b[:, :, 2:]
    return torch.cat([qs & 0x0F, qs >> 4], dim=2), d, m  # value j < 16: low nibble of byte j


# the C++ repack: (row blocks of a weight's GGUF bytes, K, format, N multiple) -> quant groups
Repack = Callable[[list[torch.Tensor], int, str, int], torch.Tensor]


def pack(t: QuantizedTensor, repack: Repack | None = None) -> torch.Tensor:
    """The kernels' quant groups `[Np/16, K/32, block bytes]` uint8 (Np: N padded to 64 with zero
    scales); `repack` (the extension's quant_repack) makes the same bytes in C++, else torch does."""
    if repack is not None:
        return repack(list(t.row_blocks), t.k, t.fmt, N_MULTIPLE)
    if t.fmt in kquants.KQUANTS:
        return kquants.pack(t.raw, t.k, t.fmt, N_MULTIPLE)
    u, d, m = _split(t)
    n, nb, _ = u.shape
    pad = -(-n // N_MULTIPLE) * N_MULTIPLE - n
    u = torch.nn.functional.pad(u, (0, 0, 0, 0, 0, pad))
    groups = (n + pad) // GROUP

    def scales(s: torch.Tensor) -> torch.Tensor:  # [N, nb] float16 -> [G, nb, 32] bytes
        s = torch.nn.functional.pad(s, (0, 0, 0, pad))
        return s.view(groups, GROUP, nb).permute(0, 2, 1).contiguous().view(torch.uint8)

    # [G, 16 columns, nb, 8 quads, 4] -> [G, nb, quad, column, 4]
    quads = u.view(groups, GROUP, nb, 8, 4).permute(0, 2, 3, 1, 4)
    if t.fmt == "q8_0":
        values = quads.reshape(groups, nb, 512)
    else:
        pairs = quads.reshape(groups, nb, 4, 2, GROUP * 4)
        values = (pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)).reshape(groups, nb, 256)
    parts = [values, scales(d)] + ([scales(m)] if m is not None else [])
    return torch.cat(parts, dim=2).contiguous()


def unpack_columns(packed: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """float32 `[len(cols), K]`: the weight's output columns `cols` dequantized from quant groups
    (column c of a linear layer's weight_t; for a tied embedding, token c's row)."""
    fmt = format_of(packed)
    if fmt in kquants.KQUANTS:
        return kquants.unpack_columns(packed, cols, fmt)
    value_bytes, offset = _VALUES[fmt]
    nb = packed.shape[1]
    t = torch.arange(len(cols))
    sel = packed[cols // GROUP]  # [T, nb, block bytes]: each column's group
    c = cols % GROUP
    if fmt == "q8_0":
        u = sel[:, :, :value_bytes].reshape(-1, nb, 8, GROUP, 4)[t, :, :, c, :]  # [T, nb, 8, 4]
    else:
        b = sel[:, :, :value_bytes].reshape(-1, nb, 4, GROUP, 4)[t, :, :, c, :]  # [T, nb, 4, 4]: quads 2i | 2i+1 << 4
        u = torch.stack([b & 0x0F, b >> 4], dim=3)  # [T, nb, 4, 2, 4]
    u = u.reshape(len(cols), nb, BLOCK).float()

    def scale(at: int) -> torch.Tensor:  # [T, nb]
        return sel[:, :, at:at + 32].contiguous().view(torch.float16)[t, :, c].float()

    w = (u - offset) * scale(value_bytes)[:, :, None]
    if fmt == "q4_1":
        w = w + scale(value_bytes + 32)[:, :, None]
    return w.reshape(len(cols), nb * BLOCK)
