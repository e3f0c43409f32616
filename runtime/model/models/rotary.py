"""Rotary position embedding on interleaved pairs, as one complex multiply.

The model permutes q/k projection rows at load time so that rotary pair i is the two adjacent
dims (2i, 2i+1) of each head (see models/llama.py); `apply` then treats each pair as a complex
number and multiplies by e^{i * pos * inv_freq_i}. Frequencies are computed in float32 as HF does.
Partial rotary (only the leading `rotary_dim` dims of a head rotate): the table's remaining pairs
are 1 + 0i, so those dims pass through unchanged (exactly) and every layer, DecodeStack's too,
applies one table of head_dim / 2 pairs. LongRoPE keeps two tables, short and long; a token takes
the long one when its request's sequence is longer than original_max_position_embeddings, which
is transformers' choice for a call over a cache (prefill, extend, or a decode step). Not yet
done: transformers' `generate` (Phi-3) recomputes the whole cache with the long factors when a
sequence first crosses that length; here the keys cached before the crossing keep the short ones
(the radix cache shares them with requests that stay short).
"""

from __future__ import annotations

import math

import torch

from radixlm.runtime.model.model_config import RopeConfig


def rope_inv_freq(rotary_dim: int, rope: RopeConfig, long: bool = False) -> torch.Tensor:
    """Inverse frequencies `[rotary_dim // 2]` (float32), with `linear` / `llama3` / `longrope`
    (its short or `long` factors) scaling applied."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    if rope.scaling_type == "longrope":
        factors = torch.tensor(rope.long_factor if long else rope.short_factor, dtype=torch.float32)
        return 1.0 / (factors * rope.theta**exponents)
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.scaling_type == "linear":
        return inv_freq / rope.factor
    if rope.scaling_type == "llama3":
        old_len = rope.original_max_position_embeddings
        low_freq_wavelen = old_len / rope.low_freq_factor
        high_freq_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


class RotaryEmbedding:
    def __init__(self, head_dim: int, max_positions: int, rope: RopeConfig):
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.rope = rope
        self.is_longrope = rope.scaling_type == "longrope"
        tables = [self._table_of(rope_inv_freq(rope.rotary_dim(head_dim), rope, long=False))]
        if self.is_longrope:
            tables.append(self._table_of(rope_inv_freq(rope.rotary_dim(head_dim), rope, long=True)))
        self._table = torch.cat(tables)  # complex64 [max_pos (x2 for longrope: short, then long), head_dim/2]

    def _table_of(self, inv_freq: torch.Tensor) -> torch.Tensor:
        angles = torch.arange(self.max_positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
        table = torch.polar(torch.full_like(angles, self.rope.attention_factor), angles)
        passing = self.head_dim // 2 - inv_freq.numel()
        if passing:
            table = torch.cat([table, torch.ones(self.max_positions, passing, dtype=table.dtype)], dim=1)
        return table

    def freqs_for(self, positions: torch.Tensor, seq_lens: torch.Tensor | None = None) -> torch.Tensor:
        """complex64 `[num_tokens, 1, head_dim/2]` for the given positions; `seq_lens` (longrope
        only): each token's request's sequence length, which picks the short or long table."""
        if self.is_longrope:
            assert seq_lens is not None
            long = seq_lens > self.rope.original_max_position_embeddings
            positions = positions + long.to(positions.dtype) * self.max_positions
        return self._table[positions].unsqueeze(1)

    @staticmethod
    def apply(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        """Rotate `x [num_tokens, heads, head_dim]` (interleaved pairs) by `freqs`."""
        n, heads, dim = x.shape
        pairs = torch.view_as_complex(x.float().reshape(n, heads, dim // 2, 2))
        return torch.view_as_real(pairs * freqs).reshape(n, heads, dim).to(x.dtype)
