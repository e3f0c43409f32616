"""Namespaces of the radix cache (a request's `cache_salt`): the same token ids cached under two
namespaces share nothing, eviction / locks / flush / counts span all of them, and an emptied
namespace leaves no root behind (distinct salts cannot grow the cache's memory)."""

from __future__ import annotations

import torch

from radixlm.runtime.mem_cache.mem_pool import KVPool
from radixlm.runtime.mem_cache.radix_cache import RadixCache


def make_cache(size: int) -> tuple[RadixCache, KVPool]:
    pool = KVPool(max_total_num_tokens=size, num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float32)
    return RadixCache(pool), pool


def insert(cache: RadixCache, pool: KVPool, ids: list[int], namespace: str | None) -> torch.Tensor:
    slots = pool.alloc(len(ids))
    assert slots is not None
    pool.free(slots[: cache.insert(ids, slots, namespace=namespace)])
    return slots


def test_the_same_ids_under_two_namespaces_share_nothing() -> None:
    cache, pool = make_cache(32)
    plain = insert(cache, pool, [1, 2, 3], None)
    salted = insert(cache, pool, [1, 2, 3], "a")  # nothing taken from the unsalted tree
    assert not set(plain.tolist()) & set(salted.tolist())
    assert cache.tree_tokens == 6 and pool.num_free == 32 - 6
    assert cache.match_prefix([1, 2, 3, 4]).slots.tolist() == plain.tolist()
    assert cache.match_prefix([1, 2, 3, 4], namespace="a").slots.tolist() == salted.tolist()
    other = cache.match_prefix([1, 2, 3], namespace="b", record_stats=True)
    assert other.slots.numel() == 0 and other.last_node is cache.root_node
    assert (cache.num_queried_tokens, cache.num_matched_tokens) == (3, 0)
    assert "b" not in cache.namespace_to_root  # a match creates nothing
    cache.check_invariants()


def test_locks_evict_and_flush_span_the_namespaces() -> None:
    cache, pool = make_cache(32)
    insert(cache, pool, [1, 2, 3], None)
    salted = insert(cache, pool, [1, 2, 3, 4], "a")
    node = cache.match_prefix([1, 2, 3, 4], namespace="a").last_node
    cache.inc_lock_ref(node)
    assert (cache.locked_tokens, cache.evictable_tokens) == (4, 3)
    assert cache.evict(100) == 3  # the locked salted path stays
    assert cache.match_prefix([1, 2, 3, 4], namespace="a").slots.tolist() == salted.tolist()
    cache.check_invariants()
    cache.dec_lock_ref(node)
    cache.flush()
    assert pool.num_free == 32 and cache.tree_tokens == 0 and cache.namespace_to_root == {}
    cache.check_invariants()


def test_emptied_namespaces_leave_no_root() -> None:
    cache, pool = make_cache(256)
    for i in range(50):
        insert(cache, pool, [7, 8, i], f"salt-{i}")
    assert len(cache.namespace_to_root) == 50
    cache.check_invariants()
    assert cache.evict(cache.evictable_tokens) == 150
    assert cache.namespace_to_root == {} and pool.num_free == 256
    cache.check_invariants()
