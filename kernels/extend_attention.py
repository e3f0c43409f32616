"""Extend (prefill) attention over the paged KV layout: new tokens after a cached prefix, causal.

Layout and semantics are those of `reference.extend_attention_ref` (see `reference` module docstring).
One program handles one (request, query head, block of BLOCK_M new tokens). The new token at
position p attends to positions 0..p; positions are read through req_to_token, so the cached prefix
and the new tokens (already written into the buffers) take the same path. Blocks of BLOCK_N
positions are folded into a flash-style online softmax kept in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.reference import check_index_vector, check_paged_kv_inputs


@triton.jit
def _extend_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    req_to_token_ptr,
    req_pool_indices_ptr,
    seq_lens_ptr,
    extend_lens_ptr,
    extend_start_loc_ptr,
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    # Grid: (B, num_q_heads, cdiv(max_extend_len, BLOCK_M)); blocks past a request's extend_len exit.
    b = tl.program_id(0)
    q_head = tl.program_id(1)
    block_m = tl.program_id(2)
    kv_head = q_head // GROUP
    extend_len = tl.load(extend_lens_ptr + b)
    if block_m * BLOCK_M >= extend_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    prefix_len = seq_len - extend_len
    first_token = tl.load(extend_start_loc_ptr + b)
    token_row_ptr = req_to_token_ptr + tl.load(req_pool_indices_ptr + b) * stride_req_to_token_row

    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)  # index among this request's new tokens
    is_m = offs_m < extend_len
    q_pos = prefix_len + offs_m
    q_rows = (first_token + offs_m).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    is_d = offs_d < HEAD_DIM
    is_dv = offs_dv < HEAD_DIM_V
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_q_token + q_head * stride_q_head + offs_d[None, :],
        mask=is_m[:, None] & is_d[None, :],
        other=0.0,
    ).to(DOT_DTYPE)

    # Online softmax state per query row: running max, running denominator, unnormalised output.
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    # Causality bounds the walk by the last position of this block (and by seq_len).
    kv_end = tl.minimum(seq_len, prefix_len + (block_m + 1) * BLOCK_M)
    for start_n in range(0, kv_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        is_n = offs_n < kv_end
        slots = tl.load(token_row_ptr + offs_n, mask=is_n, other=0).to(tl.int64)
        k = tl.load(
            k_ptr + slots[:, None] * stride_k_slot + kv_head * stride_k_head + offs_d[None, :],
            mask=is_n[:, None] & is_d[None, :],
            other=0.0,
        ).to(DOT_DTYPE)
        scores = tl.dot(q, tl.trans(k)) * sm_scale  # [BLOCK_M, BLOCK_N], fp32
        is_visible = (offs_n[None, :] <= q_pos[:, None]) & is_n[None, :]
        scores = tl.where(is_visible, scores, float("-inf"))
        # Every row (padding rows too: q_pos >= 0) sees position 0 in the first block, so m_new is
        # finite from the first iteration on and alpha/p never compute inf - inf.
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        v = tl.load(
            v_ptr + slots[:, None] * stride_v_slot + kv_head * stride_v_head + offs_dv[None, :],
            mask=is_n[:, None] & is_dv[None, :],
            other=0.0,
        ).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

    o = acc / l_i[:, None]
    tl.store(
        o_ptr + q_rows[:, None] * stride_o_token + q_head * stride_o_head + offs_dv[None, :],
        o.to(o_ptr.dtype.element_ty),
        mask=is_m[:, None] & is_dv[None, :],
    )


def _dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """Operand dtype for tl.dot: the input dtype, except bf16 under Triton's interpreter.

    The interpreter (Triton 3.9) stores bf16 as raw uint16 and its tl.dot multiplies those bits as
    integers, so there bf16 operands are upcast to fp32 (exact, just slower). fp32 accumulation
    is used in every case.
    """
    is_interpreted = not isinstance(_extend_attention_kernel, triton.runtime.JITFunction)
    if dtype == torch.bfloat16:
        return tl.float32 if is_interpreted else tl.bfloat16
    return tl.float16 if dtype == torch.float16 else tl.float32


def extend_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sm_scale: float,
    *,
    max_extend_len: int | None = None,
    block_m: int = 64,
    block_n: int = 64,
) -> None:
    """Causal extend attention for a batch, written into `o`; same result as `extend_attention_ref`.

    q [N, Hq, D] new tokens of all requests in batch order; k_buffer [num_slots, Hkv, D];
    v_buffer [num_slots, Hkv, Dv]; o [N, Hq, Dv] (output, q's dtype); req_to_token int32
    [max_reqs, max_context_len]; req_pool_indices, seq_lens, extend_lens, extend_start_loc int [B]
    with 0 <= extend_lens[b] <= seq_lens[b] and extend_start_loc the exclusive cumsum of extend_lens.
    `max_extend_len` must be >= max(extend_lens); pass it from host-side metadata to avoid a GPU sync
    (None computes it from extend_lens). Values are not checked. Last dims must be contiguous.
    `block_m`/`block_n` (powers of two, >= 16 on GPU) are the query/position tile sizes.
    """
    check_paged_kv_inputs(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens)
    batch_size = seq_lens.shape[0]
    check_index_vector("extend_lens", extend_lens, batch_size)
    check_index_vector("extend_start_loc", extend_start_loc, batch_size)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, head_dim_v = v_buffer.shape[1], v_buffer.shape[2]
    if o.shape != (num_tokens, num_q_heads, head_dim_v) or o.dtype != q.dtype or o.device != q.device:
        raise ValueError(
            f"o must be {q.dtype} {(num_tokens, num_q_heads, head_dim_v)} on {q.device}, "
            f"got {o.dtype} {tuple(o.shape)} on {o.device}"
        )
    if o.stride(-1) != 1:
        raise ValueError(f"o must be contiguous in its last dim, got strides {o.stride()}")
    for name, block in (("block_m", block_m), ("block_n", block_n)):
        if block < 1 or block & (block - 1):
            raise ValueError(f"{name} must be a power of two, got {block}")
    if q.device.type == "cpu" and isinstance(_extend_attention_kernel, triton.runtime.JITFunction):
        raise ValueError(
            "CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before importing triton"
        )
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max()) if batch_size > 0 else 0
    if num_tokens == 0 or max_extend_len == 0:
        return

    grid = (batch_size, num_q_heads, triton.cdiv(max_extend_len, block_m))
    _extend_attention_kernel[grid](
        q,
        k_buffer,
        v_buffer,
        o,
        req_to_token,
        req_pool_indices,
        seq_lens,
        extend_lens,
        extend_start_loc,
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
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        DOT_DTYPE=_dot_dtype(q.dtype),
    )
