"""Attention on the CPU (the default there). Two paths:

* Paged kernel (when the C++ CPU kernels load, `kernels/csrc/paged_attention.cpp`): every new
  token of any batch (decode, extend, mixed) attends over its request's context read in place
  from the pool: no gather, no padding, no mask. Requests with 16 or more new tokens take a
  flash-style kernel: over a bf16 pool its AMX tile kernel (`csrc/amx_attention.cpp`) on a CPU
  with AMX, or its vector kernel (`csrc/flash_attention.cpp`: vdpbf16ps or float32 FMAs,
  whichever that CPU runs faster) on one with AVX512-BF16; over a float32 pool the vector kernel
  in FMAs on every AVX-512 CPU; then every batch runs here. Elsewhere (a bf16 pool without
  AVX512-BF16), batches holding a long extend (a long prompt or a chunk of one) run torch's own
  SDPA, which is faster there than the per-row kernel.
* Torch: gather each request's K/V rows from the pool by slot index, pad the batch to a
  rectangle, and run one `scaled_dot_product_attention` with a mask (cascade attention over a
  prefix every request shares). Metadata per forward (shared by all layers): the padded slot
  index matrix `[batch, max_seq_len]`, the boolean mask, and for extend the map from flat new
  tokens to padded query rows.

Layers with a logit soft-cap, or with a sliding window that cuts some context of an extend batch
(`LayerAttention`), attend on the torch path, which the paged kernel cannot take: over the
gathered context with a mask that also hides keys outside the window (SDPA), and soft-capped
scores in plain float32 math. A decode step's windowed layers stay on the paged kernel: it reads
each request's last `window` slots through a small req_to_token of their own. Their KV stays in the pool whole (no eviction of keys a window has
passed): correct, not yet memory-saving.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from radixlm.kernels import cpu_linear
from radixlm.kernels.cpu_linear import (
    PAGED_ATTENTION_HEAD_DIMS,
    paged_attention,
)
from radixlm.runtime.mem_cache.mem_pool import KVPool, ReqToTokenPool
from radixlm.runtime.model import kernel_policy
from radixlm.runtime.model.attention.base import BaseAttentionBackend, LayerAttention
from radixlm.runtime.model.forward_batch import ForwardBatch, ForwardMode

# A batch holding an extend at least this long runs torch's SDPA, not the paged kernel: SDPA wins
# long dense prompts, the paged kernel everything shorter and every batch over a cached prefix
# (figures: docs/cpu-support.md, "Thresholds and the measurements behind them").
DENSE_PREFILL_MIN_LEN = 512


@dataclass(frozen=True)
class _Metadata:
    slot_index: torch.Tensor  # int64 [batch, max_seq_len] (padding points at valid-but-masked slots)
    mask: torch.Tensor | None  # bool [batch, 1, q_len, max_seq_len]; None = no masking needed
    is_causal: bool  # single request, no prefix: SDPA's own causal mask
    pad_rows: torch.Tensor | None  # int64 [num_tokens]: row of each new token in [batch*max_extend]
    max_extend_len: int
    contiguous_start: int | None = None  # one request whose slots are start..start+len-1: no gather
    shared_prefix_len: int = 0  # > 0: cascade attention over slots shared by every request


class _WindowView(NamedTuple):
    """What the paged kernel reads for a windowed layer of a decode batch (`_decode_window_view`)."""

    req_to_token: torch.Tensor  # int32 [batch, window]: each request's last `window` slots
    req_pool_indices: torch.Tensor  # int64 [batch]: 0 .. batch-1
    seq_lens: torch.Tensor  # int64 [batch]: min(seq_len, window)


@dataclass(frozen=True)
class _Part:
    """A group of a batch's requests attended together: their flat token indices, a sub-batch
    view of them, and its metadata."""

    token_index: torch.Tensor | None  # None: the whole batch
    batch: ForwardBatch
    meta: _Metadata


class TorchAttentionBackend(BaseAttentionBackend):
    _parts: list[_Part]
    _paged: bool = False  # this forward runs the paged kernel
    num_cascade_forwards = 0  # forwards that used cascade attention (a statistic for tests/bench)
    num_paged_forwards = 0  # forwards that used the paged kernel (a statistic for tests/bench)
    num_window_view_forwards = 0  # decode forwards whose windowed layers read their windows on the paged kernel

    _torch_layers: frozenset[int] = frozenset()  # layers this forward attends on the torch path, paged or not
    _masks: dict[tuple[int, int | None], torch.Tensor]  # per forward: (part, window) -> its layers' mask
    _window_views: dict[int, _WindowView]  # per decode forward on the paged kernel: windowed layer -> its view

    def __init__(self, kv_pool: KVPool, req_to_token_pool: ReqToTokenPool, scaling: float,
                 cpu_kernels: cpu_linear.Extension | None = None, bf16_path: str | None = None,
                 layers: Sequence[LayerAttention] | None = None, deterministic: bool = False):
        """`bf16_path`: our bf16 GEMM's (kernel_policy.choose), which names the instructions the
        attention kernels may use; None: kernel_policy.bf16_path's. `deterministic`: no cascade
        over a shared prefix on either path, and the paged kernel called per request for a batch
        of several: each request's attention is then what it would be alone."""
        super().__init__(kv_pool, req_to_token_pool, scaling, layers)
        self.deterministic = deterministic
        self._windowed_or_capped = [i for i, a in enumerate(self.layers) if not a.is_plain]
        head_dim = kv_pool.k_buffer[0].shape[-1]
        fits = head_dim in PAGED_ATTENTION_HEAD_DIMS and kv_pool.device.type == "cpu"
        self.cpu_kernels = cpu_kernels if fits else None
        self.amx = self.flash = False  # the paged kernel's long paths (kernel_policy.attention_kernels)
        if self.cpu_kernels is not None and kv_pool.k_buffer[0].dtype in (torch.float32, torch.bfloat16):
            path = bf16_path or kernel_policy.bf16_path(self.cpu_kernels)
            chosen = kernel_policy.attention_kernels(self.cpu_kernels, kv_pool.k_buffer[0].dtype, path, head_dim)
            self.amx, self.flash = chosen.amx, chosen.flash

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Paged kernel where it is faster (see the module docstring); else torch's path, where
        mixed extend batches are split: requests with one new token (decodes riding along, or
        1-token extends) attend as a decode batch instead of being padded to the longest extend."""
        self._paged = self.cpu_kernels is not None and (self.amx or self.flash or not _is_dense_prefill(batch))
        torch_layers = {i for i in self._windowed_or_capped
                        if self.layers[i].logit_softcap is not None or self.layers[i].cuts(batch)}
        self._masks, self._window_views = {}, {}
        if self._paged and batch.mode is ForwardMode.DECODE:  # windows without a soft-cap: the paged kernel
            views: dict[int, _WindowView] = {}
            for i in sorted(torch_layers):
                window = self.layers[i].sliding_window
                if self.layers[i].logit_softcap is None and window is not None:
                    self._window_views[i] = views.setdefault(window, self._decode_window_view(batch, window))
            torch_layers -= set(self._window_views)
            self.num_window_view_forwards += bool(self._window_views)
        self._torch_layers = frozenset(torch_layers)
        if self._paged:
            self.num_paged_forwards += 1
            if not self._torch_layers:
                return
        single = [i for i, n in enumerate(batch.extend_lens_list) if n == 1]
        if batch.mode is ForwardMode.DECODE or not single or len(single) == batch.batch_size:
            self._parts = [_Part(None, batch, self._build_metadata(batch))]
            return
        multi = [i for i, n in enumerate(batch.extend_lens_list) if n > 1]
        starts = batch.extend_start_loc
        single_tokens = starts[single]
        multi_tokens = torch.cat([torch.arange(int(starts[i]), int(starts[i]) + batch.extend_lens_list[i]) for i in multi])
        decode = ForwardBatch.decode(
            batch.req_pool_indices[single].tolist(), [batch.seq_lens_list[i] for i in single], [0] * len(single),
            single_tokens,
        )
        extend = ForwardBatch.extend(
            batch.req_pool_indices[multi].tolist(), [batch.prefix_lens_list[i] for i in multi],
            [[0] * batch.extend_lens_list[i] for i in multi], multi_tokens,
        )
        self._parts = [
            _Part(single_tokens, decode, self._build_metadata(decode)),
            _Part(multi_tokens, extend, self._build_metadata(extend)),
        ]

    def _build_metadata(self, batch: ForwardBatch) -> _Metadata:
        max_len = max(batch.seq_lens_list)
        slot_index = self.req_to_token[batch.req_pool_indices, :max_len].to(torch.int64)
        key_pos = torch.arange(max_len)
        start = _contiguous_start(slot_index) if batch.batch_size == 1 else None
        if batch.mode is ForwardMode.DECODE:
            uniform = min(batch.seq_lens_list) == max_len
            mask = None if uniform else (key_pos[None, :] < batch.seq_lens[:, None])[:, None, None, :]
            shared = 0 if self.deterministic else _shared_prefix_len(batch, slot_index)
            if shared and mask is None:
                mask = torch.ones(batch.batch_size, 1, 1, max_len, dtype=torch.bool)
            return _Metadata(slot_index, mask, False, None, 1, start, shared)
        max_ext = max(batch.extend_lens_list)
        if batch.batch_size == 1 and batch.prefix_lens_list[0] == 0:
            return _Metadata(slot_index, None, True, None, max_ext, start)
        q_pos = batch.prefix_lens[:, None] + torch.arange(max_ext)[None, :]  # [batch, max_ext]
        mask = (key_pos[None, None, :] <= q_pos[:, :, None]) & (
            key_pos[None, None, :] < batch.seq_lens[:, None, None]
        )
        pad_rows = None
        if batch.batch_size > 1:
            offsets = torch.arange(batch.num_tokens) - torch.repeat_interleave(
                batch.extend_start_loc, batch.extend_lens
            )
            batch_of_token = torch.repeat_interleave(torch.arange(batch.batch_size), batch.extend_lens)
            pad_rows = batch_of_token * max_ext + offsets
        shared = 0 if self.deterministic else _shared_prefix_len(batch, slot_index)
        return _Metadata(slot_index, mask[:, None], False, pad_rows, max_ext, start, shared)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        layer = self.layers[layer_id]
        if self._paged and layer_id not in self._torch_layers:
            assert self.cpu_kernels is not None
            req_to_token, rows, seq_lens = self._window_views.get(
                layer_id, (self.req_to_token, batch.req_pool_indices, batch.seq_lens))
            k_buf, v_buf = self.kv_pool.k_buffer[layer_id], self.kv_pool.v_buffer[layer_id]
            if self.deterministic and batch.batch_size > 1:
                return self._paged_per_request(q, k_buf, v_buf, req_to_token, rows, seq_lens, batch, layer.scaling)
            return paged_attention(
                self.cpu_kernels, q, k_buf, v_buf, req_to_token, rows, seq_lens, batch.extend_lens,
                batch.extend_start_loc, layer.scaling, amx=self.amx, flash=self.flash,
            )
        if len(self._parts) == 1:
            return self._attend(q, layer_id, 0)
        out = torch.empty_like(q)
        for i, part in enumerate(self._parts):
            assert part.token_index is not None
            out[part.token_index] = self._attend(q[part.token_index], layer_id, i)
        return out

    def _paged_per_request(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
                           rows: torch.Tensor, seq_lens: torch.Tensor, batch: ForwardBatch, scaling: float) -> torch.Tensor:
        """The paged kernel once per request of the batch (deterministic): the kernel's cascade
        serves only batches of several requests, and nothing else in it depends on the others."""
        assert self.cpu_kernels is not None
        out = torch.empty_like(q)
        zero = torch.zeros(1, dtype=batch.extend_start_loc.dtype)
        for b, (start, length) in enumerate(zip(batch.extend_start_loc.tolist(), batch.extend_lens_list, strict=True)):
            out[start: start + length] = paged_attention(
                self.cpu_kernels, q[start: start + length], k_buf, v_buf, req_to_token, rows[b: b + 1],
                seq_lens[b: b + 1], batch.extend_lens[b: b + 1], zero, scaling, amx=self.amx, flash=self.flash,
            )
        return out

    def _attend(self, q: torch.Tensor, layer_id: int, part_index: int) -> torch.Tensor:
        part = self._parts[part_index]
        meta, batch = part.meta, part.batch
        layer = self.layers[layer_id]
        k_buf, v_buf = self.kv_pool.k_buffer[layer_id], self.kv_pool.v_buffer[layer_id]
        q_pad = self._pad_queries(q, batch, meta)  # [B, q_len, H, D]
        if layer_id in self._torch_layers:
            out = self._attend_masked(q_pad, k_buf, v_buf, part_index, layer)
        elif meta.shared_prefix_len:
            if layer_id == self._first_plain_layer():
                self.num_cascade_forwards += 1
            out = self._cascade(q, q_pad, k_buf, v_buf, meta, layer.scaling)
        else:
            k_ctx, v_ctx = self._gather(k_buf, v_buf, meta.slot_index, meta.contiguous_start, q.dtype)
            out = F.scaled_dot_product_attention(
                q_pad.transpose(1, 2), k_ctx, v_ctx, attn_mask=meta.mask, is_causal=meta.is_causal,
                scale=layer.scaling, enable_gqa=True,
            ).transpose(1, 2)  # [B, q_len, H, D]
        return self._unpad(out, q.shape, meta)

    def _decode_window_view(self, batch: ForwardBatch, window: int) -> _WindowView:
        """A decode batch as seen by a layer with this window: each request's last `window` slots
        as the rows of a small req_to_token, so the paged kernel reads only them, in place."""
        seq_lens = batch.seq_lens
        cols = (seq_lens - window).clamp(min=0)[:, None] + torch.arange(window)[None, :]
        cols = cols.clamp(max=self.req_to_token.shape[1] - 1)  # past a short request's end: never read
        rows = self.req_to_token[batch.req_pool_indices[:, None], cols].contiguous()
        return _WindowView(rows, torch.arange(batch.batch_size), torch.clamp(seq_lens, max=window))

    def _first_plain_layer(self) -> int:
        return next((i for i in range(len(self.layers)) if i not in self._torch_layers), -1)

    def _attend_masked(self, q_pad: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, part_index: int,
                       layer: LayerAttention) -> torch.Tensor:
        """A windowed or soft-capped layer over the part's whole gathered context: `[B, q_len, H, D]`."""
        part = self._parts[part_index]
        meta = part.meta
        key = (part_index, layer.sliding_window)
        if key not in self._masks:
            self._masks[key] = _layer_mask(part.batch, meta.slot_index.shape[1], q_pad.shape[1], layer.sliding_window)
        mask = self._masks[key]  # [B, 1, q_len, L]
        k_ctx, v_ctx = self._gather(k_buf, v_buf, meta.slot_index, meta.contiguous_start, q_pad.dtype)
        if layer.logit_softcap is None:
            return F.scaled_dot_product_attention(
                q_pad.transpose(1, 2), k_ctx, v_ctx, attn_mask=mask, scale=layer.scaling, enable_gqa=True,
            ).transpose(1, 2)
        bsz, q_len, num_heads, head_dim = q_pad.shape
        num_kv, length = k_ctx.shape[1], k_ctx.shape[2]
        group = num_heads // num_kv
        q_rows = q_pad.reshape(bsz, q_len, num_kv, group, head_dim).permute(0, 2, 1, 3, 4)
        q_rows = q_rows.reshape(bsz, num_kv, q_len * group, head_dim)
        mask = mask.unsqueeze(3).expand(bsz, 1, q_len, group, length).reshape(bsz, 1, q_len * group, length)
        out, _ = _attend(q_rows, k_ctx, v_ctx, mask, layer.scaling, layer.logit_softcap)
        out = out.view(bsz, num_kv, q_len, group, head_dim).permute(0, 2, 1, 3, 4)
        return out.reshape(bsz, q_len, num_heads, head_dim).to(q_pad.dtype)

    @staticmethod
    def _pad_queries(q: torch.Tensor, batch: ForwardBatch, meta: _Metadata) -> torch.Tensor:
        num_tokens, num_heads, head_dim = q.shape
        if batch.mode is ForwardMode.DECODE:
            return q.view(batch.batch_size, 1, num_heads, head_dim)
        if meta.pad_rows is None:
            return q.view(1, num_tokens, num_heads, head_dim)
        q_pad = q.new_zeros(batch.batch_size * meta.max_extend_len, num_heads, head_dim)
        q_pad.index_copy_(0, meta.pad_rows, q)
        return q_pad.view(batch.batch_size, meta.max_extend_len, num_heads, head_dim)

    @staticmethod
    def _unpad(out: torch.Tensor, shape: torch.Size, meta: _Metadata) -> torch.Tensor:
        if meta.pad_rows is not None:
            return out.reshape(-1, shape[1], shape[2])[meta.pad_rows]
        return out.reshape(shape)

    @staticmethod
    def _gather(
        k_buf: torch.Tensor, v_buf: torch.Tensor, slot_index: torch.Tensor, contiguous_start: int | None,
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of the given slots as `[B, Hkv, L, D]` in `dtype` (the queries'; a view of the pool
        when contiguous and of that dtype; a pool may hold another, e.g. bf16 under float32
        activations of a quantized model)."""
        bsz, length = slot_index.shape
        if contiguous_start is not None:
            end = contiguous_start + length
            k, v = (k_buf[contiguous_start:end].unsqueeze(0).transpose(1, 2),
                    v_buf[contiguous_start:end].unsqueeze(0).transpose(1, 2))
        else:
            # index_select on the flat index: an order of magnitude faster than advanced indexing
            flat = slot_index.reshape(-1)
            k = k_buf.index_select(0, flat).view(bsz, length, *k_buf.shape[1:]).transpose(1, 2)
            v = v_buf.index_select(0, flat).view(bsz, length, *v_buf.shape[1:]).transpose(1, 2)
        return k.to(dtype), v.to(dtype)

    def _cascade(
        self, q: torch.Tensor, q_pad: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, meta: _Metadata,
        scaling: float,
    ) -> torch.Tensor:
        """Attention split at the prefix every request shares: all queries attend to the shared
        prefix in one product (its K/V read once, not once per request), each request's queries
        to its own suffix, and the two partial softmaxes merge by their log-sum-exp."""
        shared = meta.shared_prefix_len
        prefix_slots = meta.slot_index[:1, :shared]
        k_pre, v_pre = self._gather(k_buf, v_buf, prefix_slots, _contiguous_start(prefix_slots), q.dtype)
        bsz, q_len, num_heads, head_dim = q_pad.shape
        num_kv = k_pre.shape[1]
        group = num_heads // num_kv
        # prefix: every padded query row against the prefix, as [1, Hkv, B*q_len*G, D]
        q_rows = q_pad.reshape(bsz * q_len, num_kv, group, head_dim).permute(1, 0, 2, 3)
        q_rows = q_rows.reshape(1, num_kv, bsz * q_len * group, head_dim)
        out_pre, lse_pre = _attend(q_rows, k_pre, v_pre, None, scaling)
        out_pre = out_pre.view(num_kv, bsz, q_len, group, head_dim).permute(1, 2, 0, 3, 4)
        lse_pre = lse_pre.view(num_kv, bsz, q_len, group).permute(1, 2, 0, 3)
        # suffix: each request's own keys, masked, as [B, Hkv, q_len*G, D]
        k_suf, v_suf = self._gather(k_buf, v_buf, meta.slot_index[:, shared:], None, q.dtype)
        assert meta.mask is not None
        mask = meta.mask[..., shared:]  # [B, 1, q_len, S]
        q_suf = q_pad.view(bsz, q_len, num_kv, group, head_dim).permute(0, 2, 1, 3, 4)
        q_suf = q_suf.reshape(bsz, num_kv, q_len * group, head_dim)
        mask = mask.unsqueeze(3).expand(bsz, 1, q_len, group, mask.shape[-1]).reshape(bsz, 1, q_len * group, -1)
        out_suf, lse_suf = _attend(q_suf, k_suf, v_suf, mask, scaling)
        out_suf = out_suf.view(bsz, num_kv, q_len, group, head_dim).permute(0, 2, 1, 3, 4)
        lse_suf = lse_suf.view(bsz, num_kv, q_len, group).permute(0, 2, 1, 3)
        lse = torch.logaddexp(lse_pre, lse_suf)
        out = out_pre * (lse_pre - lse).exp().unsqueeze(-1) + out_suf * (lse_suf - lse).exp().unsqueeze(-1)
        return out.reshape(bsz, q_len, num_heads, head_dim).to(q.dtype)


MASKED = -1e30  # finite, so a fully masked (padding) row gives weight 0, never NaN
MIN_SHARED_PREFIX = 64  # shorter shared prefixes are not worth a second attention pass


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain attention returning (output, log-sum-exp): q `[B, Hkv, M, D]`, k/v `[B, Hkv, S, D]`,
    mask broadcastable to `[B, Hkv, M, S]` (True = attend); scores soft-capped by `softcap` if
    given. float32 math."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, MASKED)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    return torch.matmul(probs, v.float()), lse


def _layer_mask(batch: ForwardBatch, max_len: int, q_len: int, window: int | None) -> torch.Tensor:
    """bool `[B, 1, q_len, max_len]`: query row j of request b (position prefix + j; padding rows
    repeat the last real one, so no row is empty) attends to keys at or before its position and,
    with a window, after position - window."""
    key_pos = torch.arange(max_len)
    last = (batch.seq_lens - 1)[:, None]
    q_pos = torch.minimum(batch.prefix_lens[:, None] + torch.arange(q_len)[None, :], last)  # [B, q_len]
    mask = key_pos[None, None, :] <= q_pos[:, :, None]
    if window is not None:
        mask &= key_pos[None, None, :] > q_pos[:, :, None] - window
    return mask[:, None]


def _is_dense_prefill(batch: ForwardBatch) -> bool:
    """A batch with a long extend (a prompt, or a chunk of one): torch's SDPA (blocked, bf16
    matrix units where the CPU has them) beats the paged kernel on it."""
    return batch.mode is ForwardMode.EXTEND and max(batch.extend_lens_list) >= DENSE_PREFILL_MIN_LEN


def _shared_prefix_len(batch: ForwardBatch, slot_index: torch.Tensor) -> int:
    """Leading positions whose slot is the same in every request of the batch (a prefix they
    share through the radix cache), or 0 when cascade attention would not pay."""
    if batch.batch_size < 2:
        return 0
    limit = min(batch.prefix_lens_list)  # shared slots are cached ones: never a new token's
    if limit < MIN_SHARED_PREFIX:
        return 0
    same = (slot_index[:, :limit] == slot_index[:1, :limit]).all(dim=0)
    shared = limit if bool(same.all()) else int(same.logical_not().nonzero()[0, 0])
    return shared if shared >= MIN_SHARED_PREFIX else 0


def _contiguous_start(slot_index: torch.Tensor) -> int | None:
    """The first slot if one request's slots form one ascending run (the common single-stream
    case: the pool hands out consecutive slots), else None."""
    row = slot_index[0]
    first, last = int(row[0]), int(row[-1])
    if last - first != row.numel() - 1:
        return None
    return first if row.numel() == 1 or bool((row.diff() == 1).all()) else None
