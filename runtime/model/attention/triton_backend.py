"""Attention through the Triton paged kernels (the default on CUDA; on CPU only in the
interpreter, for tests). Reads K/V in place from the pool through `req_to_token`."""

from __future__ import annotations

import torch

from radixlm.runtime.model.attention.base import BaseAttentionBackend
from radixlm.runtime.model.forward_batch import ForwardBatch, ForwardMode


class TritonAttentionBackend(BaseAttentionBackend):
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
                q, k_buf, v_buf, out, self.req_to_token, self._req_pool_indices, self._seq_lens, self.scaling
            )
        else:
            extend_attention_fwd(
                q, k_buf, v_buf, out, self.req_to_token, self._req_pool_indices, self._seq_lens,
                self._extend_lens, self._extend_start_loc, self.scaling,
                max_extend_len=max(batch.extend_lens_list),
            )
        return out
