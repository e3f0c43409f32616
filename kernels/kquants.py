"""GGUF's K-quant formats Q4_K, Q5_K and Q6_K: our reference quantizer, and the repacking into
the quant groups our kernels read (csrc/kernels/kquant_gemm.h), at the file's bytes per weight.

A K-quant weight is stored in super-blocks of 256 k of one output channel (GGUF's block, QK_K):
 - Q4_K (144 bytes): d, dmin (float16), 12 bytes of 6-bit sub-block scales sc[8] and mins m[8],
   128 bytes of 4-bit values; w = (d * sc[s]) * u - (dmin * m[s]), s = k // 32, u in [0, 15].
 - Q5_K (176 bytes): the same with a fifth bit per value (32 bytes qh); u in [0, 31].
 - Q6_K (210 bytes): 128 bytes of low nibbles, 64 of high 2-bit pairs, int8 scales sc[16], d;
   w = (d * sc[k // 16]) * (u - 32), u in [0, 63].
(`split` reads the bit positions as gguf.quants' dequantizer does.)

Packed, as quant.pack gives it: uint8 `[Np/16, K/256, super-block bytes]`, group g holding
columns 16g..16g+15 (Np: N padded to 64 with zero bytes, so zero scales). A super-block of a group
is a header, then 8 sub-blocks of 32 k:
 - header: the scale bytes as "words", word w (64 bytes) byte 4c + i = column c's scale byte
   4w + i (Q4_K / Q5_K: GGUF's 12 bytes, 3 words; Q6_K: the 16 int8 scales, 4 words); then d[16]
   float16, and for Q4_K / Q5_K dmin[16] float16 (256 bytes, or 288 for Q6_K);
 - a sub-block: the low nibbles as Q4_0's 32-block (4 vectors of 64 bytes, byte 4c + j of vector
   v: low nibble = column c's u at k = 8v + j, high nibble at k = 8v + 4 + j); then Q5_K one vector
   whose byte 4c + j holds bit 4 of column c's u at k = 4t + j in its bit t; Q6_K two vectors, byte
   4c + j of vector h holding bits 4-5 of u at k = 4(4h + i) + j in its bits 2i, 2i + 1.
So a super-block is 2304 (Q4_K), 2816 (Q5_K) or 3360 (Q6_K) bytes: 16 x the file's 144, 176, 210.
"""

from __future__ import annotations

import torch

SUPER = 256  # k of a super-block (GGUF's QK_K)
SUB = 32  # k of a sub-block of the packed layout
GROUP = 16
# format -> (GGUF bytes per super-block, packed header bytes, packed bytes per sub-block of a group)
KQUANTS: dict[str, tuple[int, int, int]] = {"q4_k": (144, 256, 256), "q5_k": (176, 256, 320), "q6_k": (210, 288, 384)}
LEVELS = {"q4_k": 15, "q5_k": 31}  # the largest u of the asymmetric formats


def super_block_bytes(fmt: str) -> int:
    _, header, sub = KQUANTS[fmt]
    return header + 8 * sub


def _f16_at_least(v: torch.Tensor) -> torch.Tensor:
    """float16 of v >= 0, rounded up (so a scale from it never clips the values it was made for)."""
    h = v.half()
    return torch.where(h.float() < v, torch.nextafter(h, torch.full_like(h, float("inf"))), h)


def _quantize_asymmetric(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x [N, S, 256] -> GGUF Q4_K / Q5_K bytes [N, S, 144 or 176]."""
    n, s, _ = x.shape
    levels = LEVELS[fmt]
    sub = x.view(n, s, 8, SUB)
    low, high = sub.amin(-1).clamp(max=0), sub.amax(-1).clamp(min=0)
    scale, mins = (high - low) / levels, -low
    d, dmin = _f16_at_least(scale.amax(-1) / 63), _f16_at_least(mins.amax(-1) / 63)
    df, dminf = d.float()[..., None], dmin.float()[..., None]
    sc = torch.where(df > 0, torch.ceil(scale / df.clamp_min(1e-30)), 0).clamp(0, 63)
    m = torch.where(dminf > 0, torch.round(mins / dminf.clamp_min(1e-30)), 0).clamp(0, 63)
    step, offset = (df * sc)[..., None], (dminf * m)[..., None]
    u = torch.where(step > 0, torch.round((sub + offset) / step.clamp_min(1e-30)), 0).clamp(0, levels).to(torch.uint8)
    sc, m = sc.to(torch.uint8), m.to(torch.uint8)
    scales = torch.cat([  # GGUF's 12 bytes: see quant_gemm's scale unpacking
        (sc[..., :4] & 0x3F) | ((sc[..., 4:] >> 4) << 6),
        (m[..., :4] & 0x3F) | ((m[..., 4:] >> 4) << 6),
        (sc[..., 4:] & 0x0F) | ((m[..., 4:] & 0x0F) << 4),
    ], dim=-1)
    u = u.view(n, s, 4, 2, SUB)  # byte 32i + l: u[64i + l] | u[64i + 32 + l] << 4
    qs = ((u[:, :, :, 0] & 0x0F) | ((u[:, :, :, 1] & 0x0F) << 4)).reshape(n, s, 128)
    parts = [d.view(torch.uint8).view(n, s, 2), dmin.view(torch.uint8).view(n, s, 2), scales]
    if fmt == "q5_k":  # qh byte l, bit t: bit 4 of u[32t + l]
        bits = (u.view(n, s, 8, SUB) >> 4).to(torch.int32) << torch.arange(8, dtype=torch.int32)[:, None]
        parts.append(bits.sum(dim=2).to(torch.uint8))
    return torch.cat(parts + [qs], dim=-1)


def _quantize_q6_k(x: torch.Tensor) -> torch.Tensor:
    """x [N, S, 256] -> GGUF Q6_K bytes [N, S, 210]. Each 16-k scale is signed so that the value of
    largest magnitude maps to -32 (the format's one-sided end)."""
    n, s, _ = x.shape
    sub = x.view(n, s, 16, 16)
    at = sub.abs().argmax(-1, keepdim=True)
    peak = sub.gather(-1, at).squeeze(-1)
    scale = -peak / 32
    d = _f16_at_least(scale.abs().amax(-1) / 127)
    df = d.float()[..., None]
    sc = torch.where(df > 0, torch.ceil(scale.abs() / df.clamp_min(1e-30)), 0).clamp(0, 127) * scale.sign()
    step = (df * sc)[..., None]
    q = torch.where(step != 0, torch.round(sub / torch.where(step != 0, step, 1)), 0).clamp(-32, 31)
    u = (q + 32).to(torch.uint8).view(n, s, 2, 2, 64)  # [half h, nibble, l]: k = 128h + 64 * nibble + l
    ql = ((u[:, :, :, 0] & 0x0F) | ((u[:, :, :, 1] & 0x0F) << 4)).reshape(n, s, 128)
    hi = (u.view(n, s, 2, 4, SUB) >> 4).to(torch.int32) << (2 * torch.arange(4, dtype=torch.int32))[:, None]
    qh = hi.sum(dim=3).to(torch.uint8).reshape(n, s, 64)  # byte 32h + l: bits 2t of u[128h + 32t + l]
    scales = sc.to(torch.int8).view(torch.uint8)
    return torch.cat([ql, qh, scales, d.view(torch.uint8).view(n, s, 2)], dim=-1)


def quantize(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """GGUF `fmt` bytes `[N, K/256 * bytes per super-block]` of a float weight `[N, K]` (K a
    multiple of 256): per 32 (Q6_K: 16) k the scale that spans the values (rounded up in 6 / 8 bits,
    so nothing clips), each value rounded to its nearest level. Not llama.cpp's search for the
    least-error scales: an error of at most about half a step (see tests/kernels/test_kquants.py)."""
    n, k = weight.shape
    if k % SUPER:
        raise ValueError(f"a {fmt} weight needs K a multiple of {SUPER}, got {k}")
    x = weight.detach().float().reshape(n, k // SUPER, SUPER)
    raw = _quantize_q6_k(x) if fmt == "q6_k" else _quantize_asymmetric(x, fmt)
    return raw.reshape(n, -1).contiguous()


def split(raw: torch.Tensor, k: int, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """GGUF bytes `[N, S * bytes]` -> (u [N, S, 256] uint8 in k order, scale bytes [N, S, 12 or 16],
    d [N, S] float16, dmin [N, S] float16 or None)."""
    n, s = raw.shape[0], k // SUPER
    b = raw.view(n, s, KQUANTS[fmt][0])

    def f16(at: int) -> torch.Tensor:
        return b[:, :, at:at + 2].contiguous().view(torch.float16).view(n, s)

    def nibbles(qs: torch.Tensor, width: int) -> torch.Tensor:  # byte `width`*i + l -> k 2i*width + l, then + width
        q = qs.reshape(n, s, -1, 1, width)
        return torch.cat([q & 0x0F, q >> 4], dim=3).reshape(n, s, -1)

    if fmt == "q6_k":
        low = nibbles(b[:, :, :128], 64)
        hi = (b[:, :, 128:192].reshape(n, s, 2, 1, SUB) >> (2 * torch.arange(4, dtype=torch.uint8))[:, None]) & 3
        return low | (hi.reshape(n, s, SUPER) << 4), b[:, :, 192:208], f16(208), None
    u = nibbles(b[:, :, -128:], SUB)
    if fmt == "q5_k":
        hi = (b[:, :, 16:48].reshape(n, s, 1, SUB) >> torch.arange(8, dtype=torch.uint8)[:, None]) & 1
        u = u | (hi.reshape(n, s, SUPER) << 4)
    return u, b[:, :, 4:16], f16(0), f16(2)


def pack(raw: torch.Tensor, k: int, fmt: str, n_multiple: int) -> torch.Tensor:
    """The kernels' quant groups `[Np/16, K/256, super-block bytes]` (module docstring)."""
    if fmt == "q4_k":
        return _pack_q4_k(raw, k, n_multiple)
    return _pack_values(raw, k, fmt, n_multiple)


def _pack_q4_k(raw: torch.Tensor, k: int, n_multiple: int) -> torch.Tensor:
    """`pack` for Q4_K, the same bytes as `_pack_values` at a third of its work: the file's bytes
    moved 4 at a time (as int32: the 4 bytes j of a packed vector come from 4 consecutive file
    bytes) and nibbles swapped in place, never expanded to one value a byte. GGUF's qs byte 32i + l
    holds u at k = 64i + l (low nibble) and 64i + 32 + l (high); packed sub-block 2i + h, vector
    v, byte 4c + j wants nibble h of the bytes l = 8v + j (low) and 8v + 4 + j (high)."""
    low, high = 0x0F0F0F0F, -0x0F0F0F10  # 0xF0F0F0F0 as an int32
    n, s = raw.shape[0], k // SUPER
    pad = -n % n_multiple
    groups = (n + pad) // GROUP
    b = torch.nn.functional.pad(raw.reshape(n, -1), (0, 0, 0, pad)).contiguous() if pad else raw.contiguous()
    b32, b16 = b.view(torch.int32).view(groups, GROUP, s, 36), b.view(torch.int16).view(groups, GROUP, s, 72)
    out = torch.empty(groups, s, super_block_bytes("q4_k"), dtype=torch.uint8)
    o32, o16 = out.view(torch.int32), out.view(torch.int16)
    o32[:, :, :48].view(groups, s, 3, GROUP).copy_(b32[..., 1:4].permute(0, 2, 3, 1))  # scale words
    o16[:, :, 96:112].copy_(b16[..., 0].permute(0, 2, 1))  # d
    o16[:, :, 112:128].copy_(b16[..., 1].permute(0, 2, 1))  # dmin
    qs = b32[..., 4:].reshape(groups, GROUP, s, 4, 4, 2)  # [G, column, S, i, v, l // 4 % 2]
    lo, hi = qs[..., 0], qs[..., 1]
    body = o32[:, :, 64:].view(groups, s, 4, 2, 4, GROUP)  # [G, S, i, h, v, column]
    body[:, :, :, 0].copy_(((lo & low) | ((hi << 4) & high)).permute(0, 2, 3, 4, 1))
    body[:, :, :, 1].copy_((((lo >> 4) & low) | (hi & high)).permute(0, 2, 3, 4, 1))
    return out


def _pack_values(raw: torch.Tensor, k: int, fmt: str, n_multiple: int) -> torch.Tensor:
    """`pack` through the values: each one's bits split out, then placed (every K-quant)."""
    u, scales, d, dmin = split(raw, k, fmt)
    n, s = u.shape[:2]
    pad = -n % n_multiple
    groups = (n + pad) // GROUP

    def padded(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0,) * (2 * t.dim() - 2) + (0, pad))

    def lanes(t: torch.Tensor) -> torch.Tensor:  # [N, S, 4W] bytes -> [G, S, W * 64]: word w, lane c
        words = t.shape[-1] // 4
        return padded(t).view(groups, GROUP, s, words, 4).permute(0, 2, 3, 1, 4).reshape(groups, s, -1)

    def halves(t: torch.Tensor) -> torch.Tensor:  # [N, S] float16 -> [G, S, 32] bytes: column c at 2c
        return padded(t).view(groups, GROUP, s).permute(0, 2, 1).contiguous().view(torch.uint8)

    header = [lanes(scales), halves(d)] + ([halves(dmin)] if dmin is not None else [])
    # [G, 16 columns, S, 8 sub-blocks, 8 quads, 4] -> [G, S, sub-block, quad, column, 4]
    quads = padded(u).view(groups, GROUP, s, 8, 8, 4).permute(0, 2, 3, 4, 1, 5)
    low = quads & 0x0F
    values = [(low[:, :, :, 0::2] | (low[:, :, :, 1::2] << 4)).reshape(groups, s, 8, 256)]
    shifts = torch.arange(8, dtype=torch.int32)
    if fmt == "q5_k":
        bits = ((quads >> 4).to(torch.int32) << shifts[:, None, None]).sum(dim=3)
        values.append(bits.to(torch.uint8).reshape(groups, s, 8, 64))
    elif fmt == "q6_k":
        pairs = (quads >> 4).to(torch.int32).view(groups, s, 8, 2, 4, GROUP, 4) << (2 * shifts[:4])[:, None, None]
        values.append(pairs.sum(dim=4).to(torch.uint8).reshape(groups, s, 8, 128))
    body = torch.cat(values, dim=3).reshape(groups, s, -1)
    return torch.cat(header + [body], dim=2).contiguous()


def _scale_mins(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF's 12 scale bytes [..., 12] -> (sc [..., 8], m [..., 8]), 6 bits each."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 6) << 4)], dim=-1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 6) << 4)], dim=-1)
    return sc, mins


def unpack_columns(packed: torch.Tensor, cols: torch.Tensor, fmt: str) -> torch.Tensor:
    """float32 `[len(cols), K]`: output columns `cols` of quant groups, dequantized as gguf.quants
    does ((d * sc) * u - dmin * m; Q6_K (d * sc) * (u - 32)), bit for bit."""
    _, header, sub_bytes = KQUANTS[fmt]
    t, s = torch.arange(len(cols)), packed.shape[1]
    sel = packed[cols // GROUP]  # [T, S, bytes]: each column's group
    c = cols % GROUP
    words = 4 if fmt == "q6_k" else 3
    scales = sel[:, :, :64 * words].reshape(-1, s, words, GROUP, 4)[t, :, :, c, :].reshape(-1, s, 4 * words)

    def f16(at: int) -> torch.Tensor:  # [T, S] float32
        return sel[:, :, at:at + 32].contiguous().view(torch.float16)[t, :, c].float()

    body = sel[:, :, header:].reshape(-1, s, 8, sub_bytes)
    low = body[:, :, :, :256].reshape(-1, s, 8, 4, GROUP, 4)[t, :, :, :, c, :]  # [T, S, 8, 4, 4]
    u = torch.stack([low & 0x0F, low >> 4], dim=4)  # [T, S, sub-block, vector v, nibble, j]: quad 2v + nibble
    if fmt == "q5_k":
        hi = body[:, :, :, 256:].reshape(-1, s, 8, GROUP, 4)[t, :, :, c, :]  # [T, S, 8, 4]
        u = u | ((hi[:, :, :, None, :] >> torch.arange(8, dtype=torch.uint8)[:, None]) & 1).view(u.shape) << 4
    elif fmt == "q6_k":
        hi = body[:, :, :, 256:].reshape(-1, s, 8, 2, GROUP, 4)[t, :, :, :, c, :]  # [T, S, 8, 2, 4]
        shifts = 2 * torch.arange(4, dtype=torch.uint8)[:, None]
        u = u | ((hi[:, :, :, :, None, :] >> shifts) & 3).view(u.shape) << 4
    u = u.reshape(len(cols), s, SUPER).float()
    if fmt == "q6_k":
        sc = scales.view(torch.int8).float()  # [T, S, 16]
        step = (f16(64 * words)[..., None] * sc).repeat_interleave(16, dim=2)
        return (step * (u - 32)).reshape(len(cols), -1)
    sc, m = _scale_mins(scales)
    step = (f16(64 * words)[..., None] * sc.float()).repeat_interleave(SUB, dim=2)
    offset = (f16(64 * words + 32)[..., None] * m.float()).repeat_interleave(SUB, dim=2)
    return (step * u - offset).reshape(len(cols), -1)
