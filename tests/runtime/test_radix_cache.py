"""RadixCache / NoopRadixCache: unit tests, and a hypothesis state machine that checks the cache
against a brute-force model (a dict of every cached prefix -> the slot of its last token) and
checks slot ownership against a real KVPool after every step."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixlm.runtime.mem_cache.mem_pool import KVPool
from radixlm.runtime.mem_cache.radix_cache import BasePrefixCache, NoopRadixCache, RadixCache, TreeNode

Prefix = tuple[int, ...]


def make_pool(size: int) -> KVPool:
    return KVPool(max_total_num_tokens=size, num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float32)


def tree_contents(cache: RadixCache) -> dict[Prefix, int]:
    """Every cached prefix -> the KV slot of its last token, by walking the tree."""
    contents: dict[Prefix, int] = {}
    stack: list[tuple[Prefix, TreeNode]] = [((), cache.root_node)]
    while stack:
        prefix, node = stack.pop()
        for token, slot in zip(node.key, node.value.tolist(), strict=True):
            prefix = (*prefix, token)
            contents[prefix] = slot
        stack.extend((prefix, child) for child in node.children.values())
    return contents


def path_of(node: TreeNode) -> Prefix:
    """The tokens on the path root..node."""
    keys = []
    while node.parent is not None:
        keys.append(node.key)
        node = node.parent
    return tuple(token for key in reversed(keys) for token in key)


def check_slot_ownership(cache: RadixCache, pool: KVPool) -> None:
    """Every slot 1..size is exactly one of: free in the pool, or in the tree (once)."""
    cached = list(tree_contents(cache).values())
    free = pool._free_slots[: pool.num_free].tolist()
    assert len(cached) == len(set(cached)) == cache.tree_tokens
    assert len(free) == len(set(free))
    assert not set(cached) & set(free)
    assert pool.num_free + cache.tree_tokens == pool.max_total_num_tokens
    assert set(cached) | set(free) == set(range(1, pool.max_total_num_tokens + 1))


def insert_fresh(cache: BasePrefixCache, pool: KVPool, token_ids: list[int]) -> tuple[torch.Tensor, int]:
    """Insert with freshly allocated slots and free the ones the cache did not take."""
    slots = pool.alloc(len(token_ids))
    assert slots is not None
    num_not_taken = cache.insert(token_ids, slots)
    pool.free(slots[:num_not_taken])
    return slots, num_not_taken


def serve_request(cache: BasePrefixCache, pool: KVPool, token_ids: list[int]) -> None:
    """A request's whole life, as the scheduler bridge does it; the same code for both caches."""
    prefix_slots, node = cache.match_prefix(token_ids)
    cache.inc_lock_ref(node)
    new_slots = pool.alloc(len(token_ids) - len(prefix_slots))
    assert new_slots is not None
    slots = torch.cat([prefix_slots, new_slots])
    num_not_taken = cache.insert(token_ids, slots)
    pool.free(slots[len(prefix_slots) : num_not_taken])
    cache.dec_lock_ref(node)


# ---------------------------------------------------------------------------------------- unit


def test_insert_then_match() -> None:
    pool = make_pool(16)
    cache = RadixCache(pool)
    slots, num_not_taken = insert_fresh(cache, pool, [1, 2, 3])
    assert num_not_taken == 0
    match = cache.match_prefix([1, 2, 3, 4])
    assert match.slots.tolist() == slots.tolist()
    assert match.slots.dtype == torch.int64
    assert path_of(match.last_node) == (1, 2, 3)
    assert cache.match_prefix([2, 1]).slots.numel() == 0
    assert cache.match_prefix([2, 1]).last_node is cache.root_node
    assert cache.match_prefix(torch.tensor([1, 2])).slots.tolist() == slots[:2].tolist()
    cache.check_invariants()


def test_insert_returns_cached_prefix_and_keeps_its_own_slots() -> None:
    pool = make_pool(16)
    cache = RadixCache(pool)
    first, _ = insert_fresh(cache, pool, [1, 2, 3])
    second = pool.alloc(5)
    assert second is not None
    assert cache.insert([1, 2, 3, 4, 5], second) == 3
    pool.free(second[:3])
    assert cache.match_prefix([1, 2, 3, 4, 5]).slots.tolist() == first.tolist() + second[3:].tolist()
    assert insert_fresh(cache, pool, [1, 2])[1] == 2  # a cached prefix: nothing taken
    check_slot_ownership(cache, pool)


def test_match_splits_node_mid_key() -> None:
    pool = make_pool(16)
    cache = RadixCache(pool)
    slots, _ = insert_fresh(cache, pool, [1, 2, 3, 4])
    assert cache.num_nodes == 1
    match = cache.match_prefix([1, 2, 9])
    assert match.slots.tolist() == slots[:2].tolist()
    assert match.last_node.key == (1, 2)
    assert [child.key for child in match.last_node.children.values()] == [(3, 4)]
    assert cache.num_nodes == 2
    assert cache.match_prefix([1, 2, 3, 4]).slots.tolist() == slots.tolist()
    cache.check_invariants()


def test_insert_splits_on_divergence_and_on_prefix() -> None:
    pool = make_pool(16)
    cache = RadixCache(pool)
    insert_fresh(cache, pool, [1, 2, 3])
    assert insert_fresh(cache, pool, [1, 2, 4])[1] == 2
    assert cache.num_nodes == 3  # (1, 2) -> (3), (4)
    insert_fresh(cache, pool, [5, 6, 7, 8])
    assert insert_fresh(cache, pool, [5, 6])[1] == 2
    assert cache.num_nodes == 5  # (5, 6) -> (7, 8)
    assert cache.tree_tokens == 3 + 1 + 4
    cache.check_invariants()
    check_slot_ownership(cache, pool)


def test_lock_prevents_eviction_and_counts_follow() -> None:
    pool = make_pool(16)
    cache = RadixCache(pool)
    insert_fresh(cache, pool, [1, 2, 3])
    insert_fresh(cache, pool, [1, 2, 4, 5])
    node = cache.match_prefix([1, 2, 3]).last_node
    cache.inc_lock_ref(node)
    cache.inc_lock_ref(node)
    assert (cache.locked_tokens, cache.evictable_tokens, cache.tree_tokens) == (3, 2, 5)
    assert cache.evict(100) == 2  # only (4, 5)
    assert cache.match_prefix([1, 2, 3]).slots.numel() == 3
    cache.dec_lock_ref(node)
    assert cache.evict(100) == 0  # still locked once
    cache.dec_lock_ref(node)
    assert (cache.locked_tokens, cache.evictable_tokens) == (0, 3)
    with pytest.raises(RuntimeError):
        cache.dec_lock_ref(node)
    assert cache.evict(1) == 1  # the leaf (3) goes first; (1, 2) is then a leaf
    assert cache.evict(1) == 2
    assert cache.num_nodes == 0 and pool.num_free == pool.max_total_num_tokens
    cache.check_invariants()


def test_lru_order_evicts_oldest_leaf_first() -> None:
    pool = make_pool(16)
    cache = RadixCache(pool)
    for seq in ([1, 1], [2, 2], [3, 3]):
        insert_fresh(cache, pool, seq)
    cache.match_prefix([1, 1])  # now [2, 2] is the least recently used
    assert cache.evict(2) == 2
    assert cache.match_prefix([2, 2]).slots.numel() == 0
    assert cache.match_prefix([1, 1]).slots.numel() == 2
    assert cache.evict(1) == 2  # [3, 3] next: whole nodes go
    assert cache.match_prefix([1, 1]).slots.numel() == 2


def test_evict_reaches_parent_after_its_children() -> None:
    pool = make_pool(16)
    cache = RadixCache(pool)
    insert_fresh(cache, pool, [1, 2, 3])
    insert_fresh(cache, pool, [1, 2, 4])
    insert_fresh(cache, pool, [9])
    cache.match_prefix([9])
    assert cache.evict(3) == 4  # (3), (4), then their parent (1, 2) before the newer (9)
    assert tree_contents(cache).keys() == {(9,)}
    check_slot_ownership(cache, pool)


def test_evict_frees_into_pool() -> None:
    pool = make_pool(8)
    cache = RadixCache(pool)
    slots, _ = insert_fresh(cache, pool, [1, 2, 3, 4, 5])
    assert pool.num_free == 3
    assert cache.evict(0) == 0
    assert cache.evict(5) == 5
    assert pool.num_free == pool.max_total_num_tokens
    assert set(slots.tolist()) <= set(pool._free_slots[: pool.num_free].tolist())
    assert cache.evict(1) == 0


def test_flush() -> None:
    pool = make_pool(16)
    cache = RadixCache(pool)
    insert_fresh(cache, pool, [1, 2, 3])
    insert_fresh(cache, pool, [4, 5])
    node = cache.match_prefix([4, 5]).last_node
    cache.inc_lock_ref(node)
    with pytest.raises(RuntimeError):
        cache.flush()
    cache.dec_lock_ref(node)
    cache.flush()
    assert (cache.tree_tokens, cache.num_nodes, pool.num_free) == (0, 0, pool.max_total_num_tokens)
    assert cache.match_prefix([1, 2, 3]).slots.numel() == 0
    insert_fresh(cache, pool, [1, 2])  # usable after a flush
    check_slot_ownership(cache, pool)


def test_hit_rate_counts_only_recorded_matches() -> None:
    cache = RadixCache(make_pool(16))
    assert cache.hit_rate == 0.0
    cache.insert([1, 2, 3], torch.tensor([1, 2, 3]))
    cache.match_prefix([1, 2, 3, 4], record_stats=True)
    cache.match_prefix([9, 9, 9, 9], record_stats=True)
    cache.match_prefix([1, 2, 3])  # not recorded
    assert (cache.num_matched_tokens, cache.num_queried_tokens) == (3, 8)
    assert cache.hit_rate == pytest.approx(3 / 8)


def test_insert_rejects_length_mismatch() -> None:
    for cache in (RadixCache(make_pool(4)), NoopRadixCache()):
        with pytest.raises(ValueError):
            cache.insert([1, 2], torch.tensor([1]))


def test_noop_cache_matches_nothing_and_takes_nothing() -> None:
    pool = make_pool(8)
    cache = NoopRadixCache(pool)
    slots = pool.alloc(3)
    assert slots is not None
    assert cache.insert([1, 2, 3], slots) == 3
    match = cache.match_prefix([1, 2, 3], record_stats=True)
    assert match.slots.numel() == 0 and match.slots.dtype == torch.int64
    cache.inc_lock_ref(match.last_node)
    cache.dec_lock_ref(match.last_node)
    assert (cache.evict(10), cache.tree_tokens, cache.num_nodes, cache.hit_rate) == (0, 0, 0, 0.0)
    cache.flush()
    cache.check_invariants()


@pytest.mark.parametrize("cache_cls", [RadixCache, NoopRadixCache])
def test_same_caller_code_for_both_caches(cache_cls: type[BasePrefixCache]) -> None:
    pool = make_pool(32)
    cache = cache_cls(pool)  # type: ignore[call-arg]
    for seq in ([1, 2, 3], [1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 4]):
        serve_request(cache, pool, seq)
        assert pool.num_free + cache.tree_tokens == pool.max_total_num_tokens
        cache.check_invariants()
    assert cache.tree_tokens == (5 if cache_cls is RadixCache else 0)  # 1 2 (3 4 | 5)


# ------------------------------------------------------------------------ property-based model

ALPHABET = 3
MAX_LEN = 8
POOL_SIZE = 40
token_seqs = st.lists(st.integers(0, ALPHABET - 1), max_size=MAX_LEN)


class RadixCacheMachine(RuleBasedStateMachine):
    """Random insert / match / lock / unlock / evict / flush / whole-request sequences.

    Model: `cached` maps every cached prefix to the slot of its last token; `access_time` maps it
    to the model step that last touched it (match: the matched prefixes, insert: all of them).
    Locks simulate running requests: a matched, locked node and the prefix it stands for.
    """

    def __init__(self) -> None:
        super().__init__()
        self.pool = make_pool(POOL_SIZE)
        self.cache = RadixCache(self.pool)
        self.cached: dict[Prefix, int] = {}
        self.access_time: dict[Prefix, int] = {}
        self.clock = 0
        self.locks: list[tuple[TreeNode, Prefix]] = []

    # ------------------------------------------------------------------ model helpers

    def longest_cached(self, seq: Prefix) -> int:
        k = 0
        while k < len(seq) and seq[: k + 1] in self.cached:
            k += 1
        return k

    def touch(self, seq: Prefix, length: int) -> None:
        self.clock += 1
        for i in range(1, length + 1):
            self.access_time[seq[:i]] = self.clock

    def locked_prefixes(self) -> set[Prefix]:
        return {prefix[:i] for _, prefix in self.locks for i in range(1, len(prefix) + 1)}

    def checked_match(self, seq: Prefix) -> tuple[torch.Tensor, TreeNode]:
        expected_len = self.longest_cached(seq)
        slots, node = self.cache.match_prefix(list(seq))
        assert slots.tolist() == [self.cached[seq[: i + 1]] for i in range(expected_len)]
        assert path_of(node) == seq[:expected_len]
        self.touch(seq, expected_len)
        return slots, node

    def checked_evict(self, num_tokens: int) -> None:
        before, evictable_before, num_free_before = (
            dict(self.cached),
            self.cache.evictable_tokens,
            self.pool.num_free,
        )
        locked = self.locked_prefixes()
        num_evicted = self.cache.evict(num_tokens)
        after = tree_contents(self.cache)
        removed = before.keys() - after.keys()
        assert all(before.get(prefix) == slot for prefix, slot in after.items())  # nothing new or moved
        assert len(removed) == num_evicted == self.pool.num_free - num_free_before
        assert not removed & locked
        assert num_evicted <= evictable_before
        assert num_evicted >= min(num_tokens, evictable_before)  # enough, when possible
        assert num_evicted < max(num_tokens, 0) + MAX_LEN or num_evicted == 0  # whole leaves, then stop
        leaves = [p for p in after if p not in locked and all(p + (t,) not in after for t in range(ALPHABET))]
        if removed and leaves:  # LRU: nothing evicted is newer than an evictable leaf that stays
            assert max(self.access_time[p] for p in removed) <= min(self.access_time[p] for p in leaves)
        self.cached = after
        for prefix in removed:
            del self.access_time[prefix]

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        if self.pool.num_free < num_tokens:
            self.checked_evict(num_tokens - self.pool.num_free)
        return self.pool.alloc(num_tokens)

    def record_insert(self, seq: Prefix, slots: torch.Tensor, num_not_taken: int) -> None:
        assert num_not_taken == self.longest_cached(seq)
        for i in range(num_not_taken, len(seq)):
            self.cached[seq[: i + 1]] = int(slots[i])
        self.touch(seq, len(seq))

    # ------------------------------------------------------------------ rules

    @rule(seq=token_seqs)
    def insert(self, seq: list[int]) -> None:
        slots = self.alloc(len(seq))
        if slots is None:  # everything cached is locked
            return
        num_not_taken = self.cache.insert(seq, slots)
        self.record_insert(tuple(seq), slots, num_not_taken)
        self.pool.free(slots[:num_not_taken])

    @rule(seq=token_seqs)
    def match(self, seq: list[int]) -> None:
        self.checked_match(tuple(seq))

    @rule(seq=token_seqs)
    def lock(self, seq: list[int]) -> None:
        slots, node = self.checked_match(tuple(seq))
        self.cache.inc_lock_ref(node)
        self.locks.append((node, tuple(seq[: slots.numel()])))

    @precondition(lambda self: self.locks)
    @rule(index=st.integers(0, 100))
    def unlock(self, index: int) -> None:
        node, prefix = self.locks.pop(index % len(self.locks))
        assert path_of(node) == prefix  # the handle survived any splits
        self.cache.dec_lock_ref(node)

    @rule(num_tokens=st.integers(-1, 30))
    def evict(self, num_tokens: int) -> None:
        self.checked_evict(num_tokens)

    @rule(seq=token_seqs)
    def serve_request(self, seq: list[int]) -> None:
        """match + lock, compute the rest into fresh slots, insert, free duplicates, unlock."""
        key = tuple(seq)
        prefix_slots, node = self.checked_match(key)
        self.cache.inc_lock_ref(node)
        new_slots = self.alloc(len(seq) - prefix_slots.numel())
        if new_slots is not None:
            slots = torch.cat([prefix_slots, new_slots])
            num_not_taken = self.cache.insert(seq, slots)
            assert num_not_taken >= prefix_slots.numel()
            self.record_insert(key, slots, num_not_taken)
            self.pool.free(slots[prefix_slots.numel() : num_not_taken])
        self.cache.dec_lock_ref(node)

    @rule()
    def flush(self) -> None:
        if self.locked_prefixes():  # a lock on nothing (the root) does not block a flush
            with pytest.raises(RuntimeError):
                self.cache.flush()
            return
        self.cache.flush()
        self.cached.clear()
        self.access_time.clear()
        assert self.pool.num_free == self.pool.max_total_num_tokens

    # ------------------------------------------------------------------ invariants

    @invariant()
    def cache_agrees_with_model(self) -> None:
        self.cache.check_invariants()
        assert tree_contents(self.cache) == self.cached
        check_slot_ownership(self.cache, self.pool)
        locked = self.locked_prefixes()
        assert locked <= self.cached.keys()  # locked paths never shrink
        assert self.cache.locked_tokens == len(locked)
        assert self.cache.evictable_tokens + self.cache.locked_tokens == self.cache.tree_tokens
        assert self.cache.tree_tokens == len(self.cached)


RadixCacheMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
TestRadixCacheMachine = RadixCacheMachine.TestCase
