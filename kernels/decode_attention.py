"""Decode attention over the paged KV layout: one new query token per request.

Layout and semantics are those of `reference.decode_attention_ref` (see `reference` module docstring).
One program handles one (request, query head): it walks the request's positions in blocks of
BLOCK_N, reads each block's slots from req_to_token and K/V from those slots in place (no gather
copy), and folds the block into a flash-style online softmax kept in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.reference import check_paged_kv_inputs


@triton.jit
def _decode_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    req_to_token_ptr,
    req_pool_indices_ptr,
    seq_lens_ptr,
    sm_scale,
    stride_q_token,
    stride_q_head,
    stride_k_slot,
    stride_k_head,
    stride_v_slot,
    stride_v_head,
    stride_o_token,
    stride_o_head,
    stride_req_to_token_row,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Grid: (B, num_q_heads). Requires seq_len >= 1 so the softmax denominator is positive.
    b = tl.program_id(0)
    q_head = tl.program_id(1)
    kv_head = q_head // GROUP
    seq_len = tl.load(seq_lens_ptr + b)
    token_row_ptr = req_to_token_ptr + tl.load(req_pool_indices_ptr + b) * stride_req_to_token_row

    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    is_d = offs_d < HEAD_DIM
    is_dv = offs_dv < HEAD_DIM_V
    q = tl.load(q_ptr + b * stride_q_token + q_head * stride_q_head + offs_d, mask=is_d, other=0.0)
    q = q.to(tl.float32) * sm_scale

    # Online softmax state: running max m_i, running denominator l_i, unnormalised output acc.
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        is_n = offs_n < seq_len
        slots = tl.load(token_row_ptr + offs_n, mask=is_n, other=0).to(tl.int64)
        k = tl.load(
            k_ptr + slots[:, None] * stride_k_slot + kv_head * stride_k_head + offs_d[None, :],
            mask=is_n[:, None] & is_d[None, :],
            other=0.0,
        )
        scores = tl.sum(q[None, :] * k.to(tl.float32), axis=1)  # [BLOCK_N]
        scores = tl.where(is_n, scores, float("-inf"))
        # The first block holds position 0, so m_new is finite from the first iteration on.
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new)
        v = tl.load(
            v_ptr + slots[:, None] * stride_v_slot + kv_head * stride_v_head + offs_dv[None, :],
            mask=is_n[:, None] & is_dv[None, :],
            other=0.0,
        )
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new

    o = acc / l_i
    tl.store(
        o_ptr + b * stride_o_token + q_head * stride_o_head + offs_dv,
        o.to(o_ptr.dtype.element_ty),
        mask=is_dv,
    )


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    *,
    block_n: int = 64,
) -> None:
    """Decode attention for a batch, written into `o`; same result as `decode_attention_ref`.

    q [B, Hq, D]; k_buffer [num_slots, Hkv, D]; v_buffer [num_slots, Hkv, Dv]; o [B, Hq, Dv] (output,
    q's dtype); req_to_token int32 [max_reqs, max_context_len]; req_pool_indices, seq_lens int [B]
    with every seq_len >= 1 and every slot in range (values are not checked: that would sync a GPU).
    q/k/v/o may be strided views but their last dim must be contiguous. fp32/bf16/fp16 inputs;
    math in fp32. `block_n` (a power of two) is the number of positions per loop step.
    """
    check_paged_kv_inputs(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens)
    batch_size, num_q_heads, head_dim = q.shape
    num_kv_heads, head_dim_v = v_buffer.shape[1], v_buffer.shape[2]
    if q.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"q has {q.shape[0]} tokens but the batch has {seq_lens.shape[0]} requests")
    if o.shape != (batch_size, num_q_heads, head_dim_v) or o.dtype != q.dtype or o.device != q.device:
        raise ValueError(
            f"o must be {q.dtype} {(batch_size, num_q_heads, head_dim_v)} on {q.device}, "
            f"got {o.dtype} {tuple(o.shape)} on {o.device}"
        )
    if o.stride(-1) != 1:
        raise ValueError(f"o must be contiguous in its last dim, got strides {o.stride()}")
    if block_n < 1 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two, got {block_n}")
    if q.device.type == "cpu" and isinstance(_decode_attention_kernel, triton.runtime.JITFunction):
        raise ValueError(
            "CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before importing triton"
        )
    if batch_size == 0:
        return

    _decode_attention_kernel[(batch_size, num_q_heads)](
        q,
        k_buffer,
        v_buffer,
        o,
        req_to_token,
        req_pool_indices,
        seq_lens,
        sm_scale,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        o.stride(0),
        o.stride(1),
        req_to_token.stride(0),
        GROUP=num_q_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        HEAD_DIM_V=head_dim_v,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_DV=triton.next_power_of_2(head_dim_v),
        BLOCK_N=block_n,
    )
