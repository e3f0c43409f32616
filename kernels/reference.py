"""Torch references for the paged-KV attention kernels, and the input contract they share.

Paged KV layout (one layer):
    k_buffer          [num_slots, num_kv_heads, head_dim]    K of the token stored at each slot
    v_buffer          [num_slots, num_kv_heads, head_dim_v]  V of the token stored at each slot
    req_to_token      int32 [max_reqs, max_context_len]      req_to_token[r, p] = slot of position p of row r
    req_pool_indices  int [B]                                row of req_to_token for each request of the batch
    seq_lens          int [B]                                total tokens per request (>= 1), new ones included

Query head h reads kv head h // group, where group = num_q_heads // num_kv_heads (GQA).
The K/V of new tokens are written into the buffers before attention runs, so every position
0..seq_len-1 of a request is readable through req_to_token. Slots of one request need not be
contiguous or ordered.

The references loop over requests and compute in fp32; they are the specification the Triton
kernels are tested against, so they favour being obviously correct over being fast.
"""

from __future__ import annotations

import torch

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INDEX_DTYPES = (torch.int32, torch.int64)


def check_paged_kv_inputs(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    """Raise ValueError unless the tensors follow the paged KV layout in the module docstring.

    `q` is [num_tokens, num_q_heads, head_dim] (num_tokens is B for decode, sum(extend_lens) for
    extend). q/k/v/req_to_token may be strided views but must be contiguous in their last dim.
    Checks only metadata (shapes, dtypes, devices, strides), never values, so it never syncs a GPU.
    """
    tensors = {
        "q": q,
        "k_buffer": k_buffer,
        "v_buffer": v_buffer,
        "req_to_token": req_to_token,
        "req_pool_indices": req_pool_indices,
        "seq_lens": seq_lens,
    }
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) != 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")
    for name, t in (("q", q), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [tokens, heads, dim], got shape {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")
    if q.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"q dtype must be one of {_FLOAT_DTYPES}, got {q.dtype}")
    if k_buffer.dtype != q.dtype or v_buffer.dtype != q.dtype:
        raise ValueError(
            f"q, k_buffer, v_buffer dtypes differ: {q.dtype}, {k_buffer.dtype}, {v_buffer.dtype}"
        )
    num_slots, num_kv_heads, head_dim = k_buffer.shape
    if v_buffer.shape[:2] != (num_slots, num_kv_heads):
        raise ValueError(
            f"v_buffer shape {tuple(v_buffer.shape)} does not match k_buffer shape {tuple(k_buffer.shape)}"
        )
    if q.shape[2] != head_dim:
        raise ValueError(f"q head_dim {q.shape[2]} != k_buffer head_dim {head_dim}")
    if q.shape[1] % num_kv_heads != 0:
        raise ValueError(f"num_q_heads {q.shape[1]} is not a multiple of num_kv_heads {num_kv_heads}")
    if req_to_token.dim() != 2 or req_to_token.dtype != torch.int32 or req_to_token.stride(-1) != 1:
        raise ValueError(
            "req_to_token must be int32 [max_reqs, max_context_len] with unit last stride, "
            f"got {req_to_token.dtype} {tuple(req_to_token.shape)} strides {req_to_token.stride()}"
        )
    check_index_vector("req_pool_indices", req_pool_indices, len(seq_lens))
    check_index_vector("seq_lens", seq_lens, len(req_pool_indices))


def check_index_vector(name: str, t: torch.Tensor, length: int) -> None:
    """Raise ValueError unless `t` is a contiguous int32/int64 vector of `length` elements."""
    if t.dim() != 1 or t.dtype not in _INDEX_DTYPES or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous int32/int64 vector, got {t.dtype} {tuple(t.shape)}")
    if t.shape[0] != length:
        raise ValueError(f"{name} has {t.shape[0]} elements, expected {length}")


def _attend_fp32(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, sm_scale: float
) -> torch.Tensor:
    """Causal attention of one request in fp32.

    q [Lq, Hq, D] at positions q_pos [Lq]; k [Lk, Hkv, D], v [Lk, Hkv, Dv] at positions 0..Lk-1.
    Query at position p sees keys 0..p. Returns [Lq, Hq, Dv] in fp32.
    """
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)  # [Lk, Hq, D]: q head h uses kv head h // group
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * sm_scale
    k_pos = torch.arange(k.shape[0], device=q.device)
    is_visible = k_pos[None, :] <= q_pos[:, None]  # [Lq, Lk]
    scores = scores.masked_fill(~is_visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)


def decode_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """Decode attention: request b's single query q[b] attends to all its seq_lens[b] positions.

    q [B, Hq, D] -> o [B, Hq, Dv] in q.dtype.
    """
    check_paged_kv_inputs(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens)
    o = q.new_empty(q.shape[0], q.shape[1], v_buffer.shape[2])
    for b in range(q.shape[0]):
        seq_len = int(seq_lens[b])
        slots = req_to_token[int(req_pool_indices[b]), :seq_len].long()
        q_pos = torch.tensor([seq_len - 1], device=q.device)
        o[b] = _attend_fp32(q[b : b + 1], k_buffer[slots], v_buffer[slots], q_pos, sm_scale)[0].to(q.dtype)
    return o


def extend_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """Extend (prefill) attention over a cached prefix plus new tokens, causal.

    q [N, Hq, D] holds the new tokens of all requests concatenated in batch order, N = sum(extend_lens).
    Request b's new tokens sit at positions seq_lens[b]-extend_lens[b] .. seq_lens[b]-1 (positions
    before are its cached prefix); the new token at position p attends to positions 0..p.
    Returns o [N, Hq, Dv] in q.dtype.
    """
    check_paged_kv_inputs(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens)
    check_index_vector("extend_lens", extend_lens, len(seq_lens))
    if int(extend_lens.sum()) != q.shape[0]:
        raise ValueError(f"q has {q.shape[0]} tokens but extend_lens sums to {int(extend_lens.sum())}")
    o = q.new_empty(q.shape[0], q.shape[1], v_buffer.shape[2])
    start = 0
    for b in range(len(seq_lens)):
        seq_len, extend_len = int(seq_lens[b]), int(extend_lens[b])
        slots = req_to_token[int(req_pool_indices[b]), :seq_len].long()
        q_pos = torch.arange(seq_len - extend_len, seq_len, device=q.device)
        q_b = q[start : start + extend_len]
        o[start : start + extend_len] = _attend_fp32(
            q_b, k_buffer[slots], v_buffer[slots], q_pos, sm_scale
        ).to(q.dtype)
        start += extend_len
    return o
