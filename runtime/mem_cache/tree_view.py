"""A bounded picture of a RadixCache for display (`GET /cache_tree`, the dashboard).

The cache may hold 100,000 nodes; a picture holds at most `max_nodes` of them and reads at most
a fixed budget of nodes, whatever the tree's shape. It is a best-first walk from the root: the
shown nodes always form a connected tree (each one's parent is shown), and of the nodes it has
looked at, the walk shows those holding the most tokens first. A node with many children has
only the first `MAX_CHILDREN_SCANNED` of them looked at (dict order: the oldest first); what is
not shown is counted per shown node (`num_hidden_children`), and the cache's totals come from
its own counters (O(1)), not from the walk.

`num_visited` counts every node whose fields the walk read (the root included): the test of the
bound counts, it does not time. Like the cache, this module knows nothing of requests or
tokenizers: the caller passes `label`, which turns a node's first token ids into text.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

from radixlm.runtime.mem_cache.radix_cache import BasePrefixCache, TreeNode

MAX_CHILDREN_SCANNED = 32  # children of one node looked at
VISIT_BUDGET_PER_NODE = 4  # the walk reads at most this many nodes per node it may show
LABEL_TOKENS = 8  # a node's label is the text of its first tokens
LABEL_CHARS = 40


class NodeView(NamedTuple):
    node_id: int
    parent_id: int | None  # None: a child of the root
    label: str  # the text of the first LABEL_TOKENS tokens, at most LABEL_CHARS characters
    num_tokens: int
    lock_ref: int  # running requests reading this node (0: evictable)
    last_access: int  # the cache's logical clock (a counter, not seconds) at the last touch
    num_children: int
    num_hidden_children: int  # children not in the picture

    @property
    def is_locked(self) -> bool:
        return self.lock_ref > 0


class TreeView(NamedTuple):
    nodes: tuple[NodeView, ...]  # parents before children
    num_nodes: int  # in the whole cache
    tree_tokens: int
    evictable_tokens: int
    locked_tokens: int
    clock: int  # the cache's logical clock now (compare with last_access)
    num_visited: int  # nodes read to build this picture


def view_tree(cache: BasePrefixCache, max_nodes: int, label: Callable[[tuple[int, ...]], str]) -> TreeView:
    """At most `max_nodes` nodes of `cache`, reading at most 1 + VISIT_BUDGET_PER_NODE * max_nodes."""
    if max_nodes < 0:
        raise ValueError(f"max_nodes must be >= 0, got {max_nodes}")
    root = cache.root_node
    budget = VISIT_BUDGET_PER_NODE * max_nodes
    num_visited = 1
    order = itertools.count()  # tie-break: the order seen, so equal sizes keep the walk's order
    heap: list[tuple[int, int, TreeNode, int | None]] = []

    def look_at_children(node: TreeNode, node_id: int | None) -> int:
        """Push up to the remaining budget of `node`'s children; return how many were pushed."""
        nonlocal num_visited
        room = min(MAX_CHILDREN_SCANNED, budget - (num_visited - 1))
        pushed = 0
        for child in itertools.islice(node.children.values(), max(0, room)):
            heapq.heappush(heap, (-len(child.key), next(order), child, node_id))
            pushed += 1
        num_visited += pushed
        return pushed

    look_at_children(root, None)
    shown: list[tuple[TreeNode, int | None]] = []
    while heap and len(shown) < max_nodes:
        _, _, node, parent_id = heapq.heappop(heap)
        shown.append((node, parent_id))
        look_at_children(node, node.node_id)
    num_shown_children = Counter(parent_id for _, parent_id in shown)
    nodes = tuple(_node_view(node, parent_id, num_shown_children[node.node_id], label) for node, parent_id in shown)
    return TreeView(nodes, cache.num_nodes, cache.tree_tokens, cache.evictable_tokens,
                    cache.locked_tokens, root.last_access_time, num_visited)


def _node_view(node: TreeNode, parent_id: int | None, num_shown_children: int,
               label: Callable[[tuple[int, ...]], str]) -> NodeView:
    text = label(node.key[:LABEL_TOKENS])
    return NodeView(node.node_id, parent_id, text[:LABEL_CHARS], len(node.key), node.lock_ref, node.last_access_time,
                    len(node.children), len(node.children) - num_shown_children)


def shown_ancestor(node: TreeNode | None, shown_ids: set[int], max_steps: int) -> int | None:
    """The id of the deepest node on `node`'s root path (itself included) that is in the picture,
    walking up at most `max_steps` nodes; None if none is found within them (or at the root)."""
    steps = 0
    while node is not None and node.parent is not None and steps < max_steps:
        if node.node_id in shown_ids:
            return node.node_id
        node, steps = node.parent, steps + 1
    return None
