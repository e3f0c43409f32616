"""The torch attention backend (dense, contiguous and cascade paths) against the kernels' plain
references, over a KV pool whose requests share prefix slots as the radix cache makes them."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.reference import decode_attention_ref, extend_attention_ref
from radixlm.runtime.mem_cache.mem_pool import KVPool, ReqToTokenPool
from radixlm.runtime.model.attention import torch_backend
from radixlm.runtime.model.attention.torch_backend import TorchAttentionBackend
from radixlm.runtime.model.forward_batch import ForwardBatch

HEADS, KV_HEADS, DIM = 6, 2, 16


def setup(prefix_len: int, own_lens: list[int], new_lens: list[int]) -> tuple[KVPool, ReqToTokenPool, list[int]]:
    """Requests share `prefix_len` slots, then have `own` cached slots and `new` slots (shuffled)."""
    gen = torch.Generator().manual_seed(0)
    total = prefix_len + sum(own_lens) + sum(new_lens)
    pool = KVPool(total + 8, 1, KV_HEADS, DIM, torch.float32)
    pool.k_buffer[0].normal_(generator=gen)
    pool.v_buffer[0].normal_(generator=gen)
    reqs = ReqToTokenPool(len(own_lens) + 1, 512)
    slots = pool.alloc(total)
    slots = slots[torch.randperm(total, generator=gen)]
    shared, rest = slots[:prefix_len], slots[prefix_len:]
    rows = []
    for own, new in zip(own_lens, new_lens):
        row = reqs.alloc()
        reqs.write(row, 0, torch.cat([shared, rest[: own + new]]))
        rest = rest[own + new :]
        rows.append(row)
    return pool, reqs, rows


@pytest.mark.parametrize("prefix_len", [0, 80])
@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_torch_backend_matches_reference(prefix_len: int, mode: str) -> None:
    own = [3, 0, 10]
    new = [1, 1, 1] if mode == "decode" else [5, 1, 12]
    pool, reqs, rows = setup(prefix_len, own, new)
    backend = TorchAttentionBackend(pool, reqs, DIM**-0.5)
    prefix_lens = [prefix_len + o for o in own]
    seq_lens = [p + n for p, n in zip(prefix_lens, new)]
    new_slots = torch.cat([reqs.req_to_token[r, p:s].long() for r, p, s in zip(rows, prefix_lens, seq_lens)])
    if mode == "decode":
        batch = ForwardBatch.decode(rows, seq_lens, [0] * len(rows), new_slots)
    else:
        batch = ForwardBatch.extend(rows, prefix_lens, [[0] * n for n in new], new_slots)
    q = torch.randn(batch.num_tokens, HEADS, DIM)
    k = pool.k_buffer[0][new_slots].clone()  # forward re-writes the new tokens' K/V: keep them
    v = pool.v_buffer[0][new_slots].clone()
    before = backend.num_cascade_forwards
    backend.init_forward_metadata(batch)
    got = backend.forward(q, k, v, 0, batch)
    assert (backend.num_cascade_forwards > before) == (prefix_len >= torch_backend.MIN_SHARED_PREFIX)
    args = (pool.k_buffer[0], pool.v_buffer[0], reqs.req_to_token, batch.req_pool_indices, batch.seq_lens)
    if mode == "decode":
        want = decode_attention_ref(q, *args, DIM**-0.5)
    else:
        want = extend_attention_ref(q, *args, batch.extend_lens, DIM**-0.5)
    assert torch.allclose(got, want, atol=1e-5)
