"""Rotary position embedding on interleaved pairs, as one complex multiply.

The model permutes q/k projection rows at load time so that rotary pair i is the two adjacent
dims (2i, 2i+1) of each head (see models/llama.py); `apply` then treats each pair as a complex
number and multiplies by e^{i * pos * inv_freq_i}. Frequencies are computed in float32 as HF does.
"""

from __future__ import annotations

import math

import torch

from radixlm.runtime.model.model_config import RopeConfig


def rope_inv_freq(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """Inverse frequencies `[head_dim // 2]` (float32), with `linear` / `llama3` scaling applied."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
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
        inv_freq = rope_inv_freq(head_dim, rope)
        angles = torch.arange(max_positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
        self._table = torch.polar(torch.ones_like(angles), angles)  # complex64 [max_pos, head_dim/2]

    def freqs_for(self, positions: torch.Tensor) -> torch.Tensor:
        """complex64 `[num_tokens, 1, head_dim/2]` for the given positions."""
        return self._table[positions].unsqueeze(1)

    @staticmethod
    def apply(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        """Rotate `x [num_tokens, heads, head_dim]` (interleaved pairs) by `freqs`."""
        n, heads, dim = x.shape
        pairs = torch.view_as_complex(x.float().reshape(n, heads, dim // 2, 2))
        return torch.view_as_real(pairs * freqs).reshape(n, heads, dim).to(x.dtype)
