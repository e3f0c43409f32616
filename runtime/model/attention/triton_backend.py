"""Attention through the Triton paged kernels (the default on CUDA; on CPU only in the
interpreter, for tests). Reads K/V in place from the pool through `req_to_token`. The kernels
take each layer's scale, but have no sliding window and no logit soft-cap: a model whose windows
can cut within the context, or that soft-caps its scores, is refused at load."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixlm.runtime.mem_cache.mem_pool import KVPool, ReqToTokenPool
from radixlm.runtime.model.attention.base import BaseAttentionBackend, LayerAttention
from radixlm.runtime.model.forward_batch import ForwardBatch, ForwardMode


class TritonAttentionBackend(BaseAttentionBackend):
    def __init__(self, kv_pool: KVPool, req_to_token_pool: ReqToTokenPool, scaling: float,
                 layers: Sequence[LayerAttention] | None = None):
        super().__init__(kv_pool, req_to_token_pool, scaling, layers)
        context_len = self.req_to_token.shape[1]
        missing = []
        windowed = [i for i, a in enumerate(self.layers) if a.sliding_window is not None and a.sliding_window < context_len]
        if windowed:
            missing.append(f"sliding-window attention (layers {windowed}, windows shorter than the {context_len}-token "
                           "context)")
        capped = [i for i, a in enumerate(self.layers) if a.logit_softcap is not None]
        if capped:
            missing.append(f"attention logit soft-capping (layers {capped})")
        if missing:
            raise ValueError(f"the triton attention backend does not implement {' or '.join(missing)}, which this "
                             "model needs; use --attention-backend torch")

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        device = self.kv_pool.device
        self._req_pool_indices = batch.req_pool_indices.to(device)
        self._seq_lens = batch.seq_lens.to(device)
        self._extend_lens = batch.extend_lens.to(device)
        self._extend_start_loc = batch.extend_start_loc.to(device)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        from radixlm.kernels.decode_attention import decode_attention_fwd
        from radixlm.kernels.extend_attention import extend_attention_fwd

        self.kv_pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        k_buf, v_buf = self.kv_pool.k_buffer[layer_id], self.kv_pool.v_buffer[layer_id]
        out = torch.empty_like(q)
        if batch.mode is ForwardMode.DECODE:
            decode_attention_fwd(
                q, k_buf, v_buf, out, self.req_to_token, self._req_pool_indices, self._seq_lens,
                self.layers[layer_id].scaling,
            )
        else:
            extend_attention_fwd(
                q, k_buf, v_buf, out, self.req_to_token, self._req_pool_indices, self._seq_lens,
                self._extend_lens, self._extend_start_loc, self.layers[layer_id].scaling,
                max_extend_len=max(batch.extend_lens_list),
            )
        return out
