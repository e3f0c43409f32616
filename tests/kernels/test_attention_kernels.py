"""Triton paged-KV attention kernels vs their torch references, run in Triton's interpreter on CPU.

TRITON_INTERPRET must be set before triton is first imported, hence the line above the imports.
The interpreter runs each program in numpy (~10 ms per loop step), so cases use few heads, short
sequences and 16-wide tiles: small tiles also make short sequences span several blocks, which is
what exercises the online softmax and the causal block bounds.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from typing import NamedTuple  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from radixlm.kernels.decode_attention import decode_attention_fwd  # noqa: E402
from radixlm.kernels.extend_attention import extend_attention_fwd  # noqa: E402
from radixlm.kernels.reference import decode_attention_ref, extend_attention_ref  # noqa: E402

BLOCK = 16  # tile size passed to the kernels in these tests (the smallest tl.dot accepts on GPU)


class PagedBatch(NamedTuple):
    k_buffer: torch.Tensor  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor  # [num_slots, num_kv_heads, head_dim_v]
    req_to_token: torch.Tensor  # int32 [max_reqs, max_context_len]
    req_pool_indices: torch.Tensor  # int64 [B]
    seq_lens: torch.Tensor  # int64 [B]


def make_paged_batch(
    seq_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    head_dim_v: int,
    dtype: torch.dtype,
    gen: torch.Generator,
) -> PagedBatch:
    """A batch whose slots are a random permutation (never contiguous or ordered) of a larger pool.

    Requests use shuffled, non-identity rows of req_to_token, and every unused req_to_token entry
    holds a valid but wrong slot, so a kernel that reads past seq_len gives wrong values, not a crash.
    """
    num_slots = sum(seq_lens) + 11
    max_reqs, max_context_len = len(seq_lens) + 2, max(seq_lens, default=0) + 5
    req_to_token = torch.randint(0, num_slots, (max_reqs, max_context_len), generator=gen, dtype=torch.int32)
    req_pool_indices = torch.randperm(max_reqs, generator=gen)[: len(seq_lens)]
    slots = torch.randperm(num_slots, generator=gen, dtype=torch.int32)
    start = 0
    for row, seq_len in zip(req_pool_indices.tolist(), seq_lens, strict=True):
        req_to_token[row, :seq_len] = slots[start : start + seq_len]
        start += seq_len
    k_buffer = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_buffer = torch.randn(num_slots, num_kv_heads, head_dim_v, generator=gen).to(dtype)
    return PagedBatch(
        k_buffer, v_buffer, req_to_token, req_pool_indices, torch.tensor(seq_lens, dtype=torch.int64)
    )


def make_query(
    num_tokens: int, num_q_heads: int, head_dim: int, dtype: torch.dtype, gen: torch.Generator
) -> torch.Tensor:
    """q [num_tokens, num_q_heads, head_dim] as a strided view into a fused qkv tensor, as in a model.

    Scaled by 2 so that softmax is peaked enough for a wrong mask or a wrong kv head to show.
    """
    qkv = 2 * torch.randn(num_tokens, 3 * num_q_heads, head_dim, generator=gen)
    return qkv.to(dtype)[:, :num_q_heads]


def run_decode(q: torch.Tensor, batch: PagedBatch, sm_scale: float) -> torch.Tensor:
    o = q.new_empty(q.shape[0], q.shape[1], batch.v_buffer.shape[2])
    decode_attention_fwd(q, batch.k_buffer, batch.v_buffer, o, *batch[2:], sm_scale, block_n=BLOCK)
    return o


def run_extend(q: torch.Tensor, batch: PagedBatch, extend_lens: list[int], sm_scale: float) -> torch.Tensor:
    o = q.new_empty(q.shape[0], q.shape[1], batch.v_buffer.shape[2])
    extend_lens_t = torch.tensor(extend_lens)
    extend_start_loc = torch.cumsum(extend_lens_t, 0) - extend_lens_t
    extend_attention_fwd(
        q, batch.k_buffer, batch.v_buffer, o, *batch[2:], extend_lens_t, extend_start_loc, sm_scale,
        block_m=BLOCK, block_n=BLOCK,
    )  # fmt: skip
    return o


@pytest.mark.parametrize(
    "seq_lens, num_kv_heads, group, head_dim, head_dim_v",
    [
        pytest.param([1], 1, 1, 64, 64, id="len1"),
        pytest.param([7], 2, 3, 128, 128, id="len7-gqa3"),
        pytest.param([33], 2, 4, 64, 64, id="len33-gqa4"),
        pytest.param([100], 1, 1, 128, 128, id="len100"),
        pytest.param([1, 7, 33, 100], 2, 3, 64, 64, id="mixed-gqa3"),
        pytest.param([100, 1, 33], 2, 4, 128, 128, id="mixed-gqa4-d128"),
        pytest.param([20, 45], 2, 1, 96, 32, id="d96-dv32"),
    ],
)
def test_decode_matches_reference_fp32(
    seq_lens: list[int], num_kv_heads: int, group: int, head_dim: int, head_dim_v: int
) -> None:
    gen = torch.Generator().manual_seed(len(seq_lens) * 1000 + sum(seq_lens) + group)
    batch = make_paged_batch(seq_lens, num_kv_heads, head_dim, head_dim_v, torch.float32, gen)
    q = make_query(len(seq_lens), num_kv_heads * group, head_dim, torch.float32, gen)
    sm_scale = head_dim**-0.5

    expected = decode_attention_ref(q, *batch, sm_scale)
    torch.testing.assert_close(run_decode(q, batch, sm_scale), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "prefix_lens, extend_lens, num_kv_heads, group, head_dim",
    [
        pytest.param([0], [1], 1, 1, 64, id="no-prefix-extend1"),
        pytest.param([0], [7], 2, 3, 64, id="no-prefix-extend7-gqa3"),
        pytest.param([9], [1], 2, 4, 128, id="prefix9-extend1-gqa4"),
        pytest.param([40], [33], 1, 1, 128, id="prefix40-extend33"),
        pytest.param([0], [100], 1, 3, 64, id="no-prefix-extend100-gqa3"),
        pytest.param([0, 12, 60, 5], [7, 1, 40, 17], 2, 4, 64, id="mixed-gqa4"),
        pytest.param([3, 0], [30, 2], 2, 1, 96, id="mixed-d96"),
    ],
)
def test_extend_matches_reference_fp32(
    prefix_lens: list[int], extend_lens: list[int], num_kv_heads: int, group: int, head_dim: int
) -> None:
    gen = torch.Generator().manual_seed(sum(prefix_lens) * 100 + sum(extend_lens) + group)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    batch = make_paged_batch(seq_lens, num_kv_heads, head_dim, head_dim, torch.float32, gen)
    q = make_query(sum(extend_lens), num_kv_heads * group, head_dim, torch.float32, gen)
    sm_scale = head_dim**-0.5

    expected = extend_attention_ref(q, *batch, torch.tensor(extend_lens), sm_scale)
    torch.testing.assert_close(run_extend(q, batch, extend_lens, sm_scale), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_inputs_match_fp32_reference(dtype: torch.dtype) -> None:
    """Half inputs, fp32 accumulation: the only error is input/output rounding, checked against fp32 math."""
    gen = torch.Generator().manual_seed(7)
    prefix_lens, extend_lens, head_dim = [0, 25], [19, 6], 64
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    batch = make_paged_batch(seq_lens, 2, head_dim, head_dim, dtype, gen)
    batch_fp32 = PagedBatch(batch.k_buffer.float(), batch.v_buffer.float(), *batch[2:])
    q_extend = make_query(sum(extend_lens), 4, head_dim, dtype, gen)
    q_decode = make_query(len(seq_lens), 4, head_dim, dtype, gen)
    sm_scale = head_dim**-0.5
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 2e-3, "rtol": 2e-3}

    o_extend = run_extend(q_extend, batch, extend_lens, sm_scale)
    expected = extend_attention_ref(q_extend.float(), *batch_fp32, torch.tensor(extend_lens), sm_scale)
    assert o_extend.dtype == dtype
    torch.testing.assert_close(o_extend.float(), expected, **tol)

    o_decode = run_decode(q_decode, batch, sm_scale)
    expected = decode_attention_ref(q_decode.float(), *batch_fp32, sm_scale)
    assert o_decode.dtype == dtype
    torch.testing.assert_close(o_decode.float(), expected, **tol)


def test_extend_of_one_token_per_request_equals_decode() -> None:
    gen = torch.Generator().manual_seed(3)
    seq_lens = [1, 18, 40]
    batch = make_paged_batch(seq_lens, 2, 64, 64, torch.float32, gen)
    q = make_query(len(seq_lens), 6, 64, torch.float32, gen)

    o_extend = run_extend(q, batch, [1] * len(seq_lens), 0.125)
    torch.testing.assert_close(o_extend, run_decode(q, batch, 0.125), atol=1e-5, rtol=1e-5)


def test_extend_accepts_a_loose_max_extend_len() -> None:
    """Blocks past a request's extend_len exit early, so an over-estimate only costs empty programs."""
    gen = torch.Generator().manual_seed(4)
    batch = make_paged_batch([10, 3], 1, 64, 64, torch.float32, gen)
    extend_lens = torch.tensor([4, 3])
    q = make_query(7, 1, 64, torch.float32, gen)
    o = torch.full_like(q, float("nan"))
    extend_attention_fwd(
        q, batch.k_buffer, batch.v_buffer, o, *batch[2:], extend_lens, torch.tensor([0, 4]), 0.125,
        max_extend_len=50, block_m=BLOCK, block_n=BLOCK,
    )  # fmt: skip
    expected = extend_attention_ref(q, *batch, extend_lens, 0.125)
    torch.testing.assert_close(o, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("group", [1, 3])
def test_references_match_sdpa_on_a_contiguous_request(group: int) -> None:
    """Pins the references themselves to torch's SDPA (identity slots, bottom-right-aligned causal mask)."""
    gen = torch.Generator().manual_seed(5)
    prefix_len, extend_len, num_kv_heads, head_dim = 6, 5, 2, 16
    seq_len = prefix_len + extend_len
    k = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
    q = torch.randn(extend_len, num_kv_heads * group, head_dim, generator=gen)
    req_to_token = torch.arange(seq_len, dtype=torch.int32)[None, :]
    pool, lens = torch.tensor([0]), torch.tensor([seq_len])
    is_visible = torch.ones(extend_len, seq_len, dtype=torch.bool).tril(diagonal=prefix_len)
    expected = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=is_visible,
        scale=0.3,
        enable_gqa=True,
    ).transpose(0, 1)

    o_extend = extend_attention_ref(q, k, v, req_to_token, pool, lens, torch.tensor([extend_len]), 0.3)
    torch.testing.assert_close(o_extend, expected, atol=1e-5, rtol=1e-5)
    o_decode = decode_attention_ref(q[-1:], k, v, req_to_token, pool, lens, 0.3)
    torch.testing.assert_close(o_decode, expected[-1:], atol=1e-5, rtol=1e-5)


def test_empty_batch_is_a_no_op() -> None:
    batch = make_paged_batch([], 1, 64, 64, torch.float32, torch.Generator().manual_seed(0))
    q = torch.empty(0, 2, 64)
    o = torch.empty(0, 2, 64)
    decode_attention_fwd(q, batch.k_buffer, batch.v_buffer, o, *batch[2:], 0.125)
    empty = torch.empty(0, dtype=torch.int64)
    extend_attention_fwd(q, batch.k_buffer, batch.v_buffer, o, *batch[2:], empty, empty, 0.125)


def _decode_args() -> dict[str, object]:
    batch = make_paged_batch([5, 9], 2, 64, 64, torch.float32, torch.Generator().manual_seed(0))
    return {
        "q": torch.randn(2, 4, 64),
        "k_buffer": batch.k_buffer,
        "v_buffer": batch.v_buffer,
        "o": torch.empty(2, 4, 64),
        "req_to_token": batch.req_to_token,
        "req_pool_indices": batch.req_pool_indices,
        "seq_lens": batch.seq_lens,
        "sm_scale": 0.125,
    }


@pytest.mark.parametrize(
    "name, bad_value, message",
    [
        ("q", torch.randn(2, 4, 64, dtype=torch.float16), "dtypes differ"),
        ("q", torch.randn(2, 3, 64), "multiple of num_kv_heads"),
        ("q", torch.randn(2, 4, 32), "head_dim"),
        ("q", torch.randn(2, 64, 4).transpose(1, 2), "contiguous in its last dim"),
        ("q", torch.randn(3, 4, 64), "requests"),
        ("q", torch.randn(2, 4, 64, dtype=torch.float64), "dtype must be"),
        ("o", torch.empty(2, 4, 32), "o must be"),
        ("o", torch.empty(2, 4, 64, device="meta"), "o must be"),
        ("v_buffer", torch.randn(10, 2, 64), "does not match"),
        ("req_to_token", torch.zeros(4, 16, dtype=torch.int64), "int32"),
        ("req_pool_indices", torch.tensor([0]), "elements"),
        ("seq_lens", torch.tensor([5.0, 9.0]), "int32/int64"),
        ("block_n", 24, "power of two"),
    ],
)
def test_decode_launcher_rejects_bad_inputs(name: str, bad_value: object, message: str) -> None:
    args = _decode_args()
    args[name] = bad_value
    with pytest.raises(ValueError, match=message):
        decode_attention_fwd(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name, bad_value, message",
    [
        ("extend_lens", torch.tensor([2]), "extend_lens has 1 elements"),
        ("extend_start_loc", torch.tensor([[0, 1]]), "extend_start_loc must be"),
        ("o", torch.empty(2, 4, 64), "o must be"),
        ("block_m", 0, "power of two"),
    ],
)
def test_extend_launcher_rejects_bad_inputs(name: str, bad_value: object, message: str) -> None:
    args = _decode_args()
    args.update(q=torch.randn(3, 4, 64), o=torch.empty(3, 4, 64))
    args.update(extend_lens=torch.tensor([1, 2]), extend_start_loc=torch.tensor([0, 1]))
    args[name] = bad_value
    with pytest.raises(ValueError, match=message):
        extend_attention_fwd(**args)  # type: ignore[arg-type]
