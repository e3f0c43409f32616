"""The attention backend interface: one object per model runner, shared by all layers.

Per forward: `init_forward_metadata(batch)` once (index tensors, masks), then `forward(...)` per
layer. `forward` first writes the new tokens' K/V into the KV pool at `batch.out_cache_loc`, then
attends each new query to its request's whole context (cached prefix + new tokens, causal).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixlm.kernels import cpu_linear
from radixlm.runtime.mem_cache.mem_pool import KVPool, ReqToTokenPool
from radixlm.runtime.model.forward_batch import ForwardBatch


@dataclass(frozen=True)
class LayerAttention:
    """How one layer attends."""

    scaling: float  # of the scores q.k
    sliding_window: int | None = None  # a query attends to the last `sliding_window` positions, itself included
    logit_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before the softmax (Gemma 2)

    def cuts(self, batch: ForwardBatch) -> bool:
        """Whether the window hides any key from a query of this batch."""
        return self.sliding_window is not None and max(batch.seq_lens_list) > self.sliding_window

    @property
    def is_plain(self) -> bool:
        return self.sliding_window is None and self.logit_softcap is None


class BaseAttentionBackend(abc.ABC):
    def __init__(self, kv_pool: KVPool, req_to_token_pool: ReqToTokenPool, scaling: float,
                 layers: Sequence[LayerAttention] | None = None):
        """`layers`: each layer's attention (default: every layer plain, scaled by `scaling`)."""
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token_pool.req_to_token
        self.scaling = scaling
        self.layers = tuple(layers) if layers is not None else tuple(
            LayerAttention(scaling) for _ in range(len(kv_pool.k_buffer)))

    @abc.abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Prepare whatever the layers share for this batch."""

    @abc.abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        """q `[num_tokens, num_heads, head_dim]`, k/v `[num_tokens, num_kv_heads, head_dim]`
        -> attention output `[num_tokens, num_heads, head_dim]`."""


def create_attention_backend(
    name: str, kv_pool: KVPool, req_to_token_pool: ReqToTokenPool, scaling: float,
    cpu_kernels: cpu_linear.Extension | None = None, bf16_path: str | None = None,
    layers: Sequence[LayerAttention] | None = None, deterministic: bool = False,
) -> BaseAttentionBackend:
    """`cpu_kernels` (the loaded C++ extension, CPU only): the torch backend attends through its
    paged kernel where that is faster (see torch_backend); `layers`: each layer's attention;
    `deterministic`: the torch backend's attention batch-invariant (--enable-deterministic-inference)."""
    if name == "torch":
        from radixlm.runtime.model.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend(kv_pool, req_to_token_pool, scaling, cpu_kernels, bf16_path, layers, deterministic)
    if name == "triton":
        from radixlm.runtime.model.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend(kv_pool, req_to_token_pool, scaling, layers)
    raise ValueError(f"unknown attention backend {name!r}; choose 'torch' or 'triton'")
