"""The bounded picture of a RadixCache behind GET /cache_tree (`mem_cache.tree_view`): on a cache
of 100,000 nodes built through RadixCache itself, the answer holds at most `max_nodes` nodes and
at most a fixed number of KB, and the nodes the walk reads are counted (not timed) and bounded;
on small trees, the picture is exact (every node, the right counts, the largest nodes first)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.runtime.api.protocol import CacheTreeView
from radixlm.runtime.config.limits import MAX_CACHE_TREE_NODES
from radixlm.runtime.mem_cache.radix_cache import RadixCache, TreeNode
from radixlm.runtime.mem_cache.tree_view import (
    LABEL_CHARS,
    MAX_CHILDREN_SCANNED,
    VISIT_BUDGET_PER_NODE,
    TreeView,
    shown_ancestor,
    view_tree,
)
from radixlm.runtime.scheduler.cache_tree_state import tree_dict

NUM_NODES = 100_000
# the largest answer: every label MAX LABEL_CHARS characters of 4 UTF-8 bytes each, every number large
MAX_ANSWER_KB = 400


class CountingPool:
    """What the cache needs of a KV pool (`free`), with an endless supply of slots."""

    def __init__(self) -> None:
        self.next_slot = 1

    def slots(self, n: int) -> torch.Tensor:
        out = torch.arange(self.next_slot, self.next_slot + n, dtype=torch.int64)
        self.next_slot += n
        return out

    def free(self, slots: torch.Tensor) -> None:
        pass


def insert(cache: RadixCache, pool: CountingPool, ids: list[int]) -> None:
    cache.insert(ids, pool.slots(len(ids)))  # the cache takes only the new positions' slots


def widest_label(ids: tuple[int, ...]) -> str:
    return "\U0001f600" * (LABEL_CHARS + 10)  # 4 bytes in UTF-8; cut to LABEL_CHARS


@pytest.fixture(scope="module")
def big_cache() -> RadixCache:
    """>= 100,000 nodes: a shared 64-token prefix, then a random tree of short branches."""
    pool = CountingPool()
    cache = RadixCache(pool)
    rng = random.Random(0)
    shared = list(range(1000, 1064))
    while cache.num_nodes < NUM_NODES:
        ids = shared[: rng.choice((0, 64))] + [rng.randrange(50) for _ in range(rng.randrange(3, 12))]
        insert(cache, pool, ids)
    return cache


def all_nodes(cache: RadixCache) -> list[TreeNode]:
    stack, out = list(cache.root_node.children.values()), []
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


@pytest.mark.parametrize("max_nodes", [1, 50, 200, MAX_CACHE_TREE_NODES])
def test_a_cache_of_100000_nodes_gives_a_bounded_answer(big_cache: RadixCache, max_nodes: int) -> None:
    assert big_cache.num_nodes >= NUM_NODES
    view = view_tree(big_cache, max_nodes, widest_label)
    assert len(view.nodes) == max_nodes  # there are more than enough
    assert view.num_visited <= 1 + VISIT_BUDGET_PER_NODE * max_nodes  # counted, not timed
    assert view.num_nodes == big_cache.num_nodes
    assert (view.tree_tokens, view.evictable_tokens, view.locked_tokens) == (
        big_cache.tree_tokens, big_cache.evictable_tokens, big_cache.locked_tokens)
    body = CacheTreeView.model_validate(tree_dict(view)).model_dump_json().encode()
    assert len(body) <= MAX_ANSWER_KB * 1024 * max_nodes / MAX_CACHE_TREE_NODES + 1024
    check_connected(view)


def check_connected(view: TreeView) -> None:
    """Parents come before their children; every parent is in the picture; hidden counts add up."""
    seen: dict[int, int] = {}
    for node in view.nodes:
        assert node.parent_id is None or node.parent_id in seen
        if node.parent_id is not None:
            seen[node.parent_id] += 1
        seen[node.node_id] = 0
        assert len(node.label) <= LABEL_CHARS
    for node in view.nodes:
        assert node.num_hidden_children == node.num_children - seen[node.node_id] >= 0


def test_the_shared_prefix_is_shown_first_with_its_token_count(big_cache: RadixCache) -> None:
    view = view_tree(big_cache, 5, lambda ids: " ".join(map(str, ids)))
    first = view.nodes[0]
    assert first.parent_id is None and first.num_tokens == 64 and first.label.startswith("1000 1001")


def test_a_node_with_a_huge_fan_out_is_read_only_in_part() -> None:
    pool = CountingPool()
    cache = RadixCache(pool)
    for token in range(5000):
        insert(cache, pool, [7, 7, token])
    view = view_tree(cache, 10, str)
    assert view.num_visited <= 1 + VISIT_BUDGET_PER_NODE * 10
    assert view.nodes[0].num_tokens == 2 and view.nodes[0].num_children == 5000
    assert view.nodes[0].num_hidden_children == 5000 - 9
    assert MAX_CHILDREN_SCANNED < 5000


def test_locks_and_ancestors() -> None:
    pool = CountingPool()
    cache = RadixCache(pool)
    insert(cache, pool, [1, 2, 3, 4])
    insert(cache, pool, [1, 2, 5, 6, 7])
    node = cache.match_prefix([1, 2, 5, 6, 7]).last_node
    cache.inc_lock_ref(node)
    view = view_tree(cache, 10, str)
    by_label = {n.label: n for n in view.nodes}
    assert set(by_label) == {"(1, 2)", "(3, 4)", "(5, 6, 7)"}
    assert by_label["(1, 2)"].lock_ref == 1 and by_label["(5, 6, 7)"].lock_ref == 1
    assert not by_label["(3, 4)"].is_locked and by_label["(5, 6, 7)"].is_locked
    assert view.locked_tokens == 5 and view.evictable_tokens == 2
    assert shown_ancestor(node, {n.node_id for n in view.nodes}, 10) == node.node_id
    only_top = view_tree(cache, 1, str)
    assert shown_ancestor(node, {n.node_id for n in only_top.nodes}, 10) == only_top.nodes[0].node_id
    assert shown_ancestor(node, set(), 10) is None and shown_ancestor(cache.root_node, set(), 10) is None
    cache.dec_lock_ref(node)
    cache.check_invariants()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), max_size=25))
def test_a_small_tree_is_shown_whole_and_exact(seqs: list[list[int]]) -> None:
    pool = CountingPool()
    cache = RadixCache(pool)
    for ids in seqs:
        insert(cache, pool, ids)
    nodes = all_nodes(cache)
    view = view_tree(cache, len(nodes) + 1, str)
    assert {n.node_id for n in view.nodes} == {n.node_id for n in nodes}
    assert all(n.num_hidden_children == 0 for n in view.nodes)
    assert sum(n.num_tokens for n in view.nodes) == cache.tree_tokens
    check_connected(view)
    if nodes:  # with room for one node only, the root's largest child is it
        top = view_tree(cache, 1, str).nodes
        assert top[0].num_tokens == max(len(c.key) for c in cache.root_node.children.values())
