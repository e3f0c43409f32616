"""Prefix caches: token-id sequences -> KV slot indices (a radix tree), and a no-op stand-in.

The cache knows nothing of requests, models or HTTP. It holds KV slots (int64 CPU tensors of
indices into the KV pool), lends them out by prefix, and hands them back to the pool when it
evicts. `NoopRadixCache` (`--disable-radix-cache`) has the same interface and contract and caches
nothing, so the caller's code is identical for both.

Ownership contract. A slot is always owned exactly once: free in the pool, held by the cache, or
held by a running request.
  - `match_prefix(ids)` lends the caller the cache's slots of the longest cached prefix of `ids`.
    They stay the cache's: the caller never frees them. They are valid only while locked:
    `inc_lock_ref(last_node)` before anything may call `evict`, `dec_lock_ref(last_node)` when done.
  - `n = insert(ids, slots)` (one slot per token) returns the number of LEADING positions whose
    slots the cache did NOT take. The cache takes ownership of `slots[n:]`; `slots[:n]` stay the
    caller's. RadixCache: n = the length of `ids`' prefix that was cached before the call; there
    the cache keeps its own slots, so the caller's slots at those positions are either the very
    slots it got from `match_prefix` (still the cache's: not freed) or duplicates (freed by the
    caller). NoopRadixCache: n = len(ids), and match_prefix never lends anything. So a caller that
    got `prefix_len` slots from `match_prefix` and still holds the lock (so n >= prefix_len) does,
    with either cache:
        n = cache.insert(ids, slots); kv_pool.free(slots[prefix_len:n]); cache.dec_lock_ref(node)
  - `evict(k)` and `flush()` return the cache's slots to the pool.

Namespaces (a request's `cache_salt`, as SGLang and vLLM take it): `match_prefix` and `insert`
take an optional `namespace`; each namespace is a tree of its own under its own root, so token ids
cached in one are never matched from another (a salted request shares no prefix with an unsalted
one or one of another salt). Eviction, locks and counts span all trees alike; a namespace's root
is dropped when its last node is evicted, so distinct salts cannot grow the cache's memory beyond
its cached tokens. The observer and the tree view see the unsalted tree (namespace None) only.

Tree invariants (verified by `check_invariants`):
  - every non-root node has a non-empty key, `value.numel() == len(key)`, and is
    `parent.children[key[0]]`; the keys on the path from the root spell the cached prefix and the
    values are its KV slots; no slot appears twice in the tree.
  - `lock_ref` of a node >= that of each child (a lock covers a whole root path); a node's tokens
    are locked iff lock_ref > 0, else evictable; evictable + locked == tree_tokens.
  - `last_access_time` of a node >= that of each child (a touch covers the whole root path), so
    LRU eviction of leaves never prefers a parent over one of its children.
  - `_evictable_leaves` is exactly the set of unlocked non-root nodes without children.
Node handles: a split keeps the node object as the deeper half, so a `last_node` still ends at
the same position after later splits; an unlocked handle is invalid after `evict` or `flush`.

Observer (`CacheObserver`, optional): told of every change to the set of cached prefixes (a leaf
added, a node split, a leaf evicted, a flush), e.g. to publish KV events (`kv_events`). Without
one the cache does no work for it beyond one `is None` test per change.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import NamedTuple, Protocol

import torch


class SlotFreer(Protocol):
    """What the cache needs of the KV pool (`KVPool`): taking back the slots it evicts."""

    def free(self, slots: torch.Tensor) -> None: ...


class CacheObserver(Protocol):
    """What RadixCache reports, each call made after the tree has changed."""

    def on_insert(self, leaf: TreeNode, path_ids: tuple[int, ...], start: int) -> None:
        """A new leaf holds `path_ids[start:]`; its root path spells `path_ids`."""

    def on_split(self, upper: TreeNode, lower: TreeNode) -> None:
        """`lower`'s first tokens moved to the new node `upper`, now its parent (no prefix changed)."""

    def on_evict(self, leaf: TreeNode) -> None:
        """`leaf` (whose `parent` is still set) left the tree: its prefixes are no longer cached."""

    def on_flush(self) -> None:
        """Every prefix left the cache."""


class TreeNode:
    """One edge of the radix tree: `key` tokens and their KV slots `value` (int64, same length)."""

    __slots__ = ("key", "value", "children", "parent", "lock_ref", "last_access_time", "node_id")

    def __init__(
        self, key: tuple[int, ...], value: torch.Tensor, parent: TreeNode | None, time: int, node_id: int
    ):
        self.key = key
        self.value = value
        self.children: dict[int, TreeNode] = {}  # first token of the child's key -> child
        self.parent = parent
        self.lock_ref = 0
        self.last_access_time = time
        self.node_id = node_id  # creation order: the deterministic LRU tie-break


class MatchResult(NamedTuple):
    slots: torch.Tensor  # int64, one per matched token; the cache's (see the ownership contract)
    last_node: TreeNode  # its root path covers exactly the matched prefix (the root if none)


def _empty_slots() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


def _as_key(token_ids: Sequence[int] | torch.Tensor) -> tuple[int, ...]:
    return tuple(token_ids.tolist()) if isinstance(token_ids, torch.Tensor) else tuple(token_ids)


def _common_prefix_len(key: tuple[int, ...], token_ids: tuple[int, ...], start: int) -> int:
    n = min(len(key), len(token_ids) - start)
    i = 0
    while i < n and key[i] == token_ids[start + i]:
        i += 1
    return i


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"RadixCache invariant broken: {message}")


class BasePrefixCache(ABC):
    """The interface the scheduler uses. Token counts and hit statistics live here."""

    def __init__(self) -> None:
        self._evictable_tokens = 0  # cached tokens on unlocked nodes
        self._locked_tokens = 0  # cached tokens on locked nodes
        self._num_nodes = 0  # excluding the root
        self.num_queried_tokens = 0  # over match_prefix(..., record_stats=True) calls
        self.num_matched_tokens = 0

    @property
    def evictable_tokens(self) -> int:
        return self._evictable_tokens

    @property
    def locked_tokens(self) -> int:
        return self._locked_tokens

    @property
    def tree_tokens(self) -> int:
        """Tokens the tree holds: evictable + locked."""
        return self._evictable_tokens + self._locked_tokens

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @property
    def hit_rate(self) -> float:
        return self.num_matched_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0

    def record_stats(self, num_queried: int, num_matched: int) -> None:
        self.num_queried_tokens += num_queried
        self.num_matched_tokens += num_matched

    @abstractmethod
    def match_prefix(self, token_ids: Sequence[int], *, record_stats: bool = False,
                     namespace: str | None = None) -> MatchResult: ...

    @abstractmethod
    def insert(self, token_ids: Sequence[int], slots: torch.Tensor, namespace: str | None = None) -> int: ...

    @abstractmethod
    def inc_lock_ref(self, node: TreeNode) -> None: ...

    @abstractmethod
    def dec_lock_ref(self, node: TreeNode) -> None: ...

    @abstractmethod
    def evict(self, num_tokens: int) -> int: ...

    @abstractmethod
    def flush(self) -> None: ...

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise AssertionError if the internal state is inconsistent (for tests)."""


class RadixCache(BasePrefixCache):
    """Radix tree of cached prefixes with LRU eviction of unlocked leaves."""

    def __init__(self, kv_pool: SlotFreer, observer: CacheObserver | None = None):
        super().__init__()
        self.kv_pool = kv_pool
        self.observer = observer
        self._time = 0  # a counter, not a clock: deterministic LRU order
        self._node_ids = itertools.count()
        self._reset()

    def _reset(self) -> None:
        self.root_node = TreeNode((), _empty_slots(), None, self._time, next(self._node_ids))
        # the other namespaces' roots (parentless, like root_node), each with at least one child
        self.namespace_to_root: dict[str, TreeNode] = {}
        self._root_to_namespace: dict[TreeNode, str] = {}
        self._evictable_leaves: set[TreeNode] = set()
        self._evictable_tokens = self._locked_tokens = self._num_nodes = 0

    def _tick(self) -> int:
        self._time += 1
        self.root_node.last_access_time = self._time
        return self._time

    def _root(self, namespace: str | None, create: bool) -> TreeNode | None:
        if namespace is None:
            return self.root_node
        root = self.namespace_to_root.get(namespace)
        if root is None and create:
            root = TreeNode((), _empty_slots(), None, self._time, next(self._node_ids))
            self.namespace_to_root[namespace] = root
            self._root_to_namespace[root] = namespace
        return root

    def match_prefix(self, token_ids: Sequence[int], *, record_stats: bool = False,
                     namespace: str | None = None) -> MatchResult:
        """Longest cached prefix of `token_ids` in `namespace`'s tree; splits a node so
        `last_node` ends exactly there (a root when nothing matched)."""
        key = _as_key(token_ids)
        now = self._tick()
        root = self._root(namespace, create=False)
        if root is None:  # nothing cached under this namespace
            if record_stats:
                self.record_stats(len(key), 0)
            return MatchResult(_empty_slots(), self.root_node)
        root.last_access_time = now
        node, pos, values = root, 0, []
        while pos < len(key) and (child := node.children.get(key[pos])) is not None:
            n = _common_prefix_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)  # its only child starts with a token != key[pos + n]
            child.last_access_time = now
            values.append(child.value)
            node, pos = child, pos + n
        if record_stats:
            self.record_stats(len(key), pos)
        return MatchResult(torch.cat(values) if values else _empty_slots(), node)

    def insert(self, token_ids: Sequence[int], slots: torch.Tensor, namespace: str | None = None) -> int:
        """Cache `token_ids` -> `slots`; return how many leading slots the cache did NOT take.

        That is the length of the prefix already cached: the cache keeps its own slots there and
        takes ownership of `slots[returned:]` (see the module docstring for who frees what).
        """
        key = _as_key(token_ids)
        if slots.numel() != len(key):
            raise ValueError(f"insert: {len(key)} tokens but {slots.numel()} slots")
        now = self._tick()
        if not key:
            return 0
        node = self._root(namespace, create=True)
        assert node is not None
        node.last_access_time = now
        pos = 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                leaf = self._add_leaf(node, key[pos:], slots[pos:], now)
                if self.observer is not None and namespace is None:
                    self.observer.on_insert(leaf, key, pos)
                return pos
            n = _common_prefix_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access_time = now
            node, pos = child, pos + n
        return pos

    def _add_leaf(self, parent: TreeNode, key: tuple[int, ...], slots: torch.Tensor, now: int) -> TreeNode:
        value = slots.to(device="cpu", dtype=torch.int64, copy=True)
        leaf = TreeNode(key, value, parent, now, next(self._node_ids))
        parent.children[key[0]] = leaf
        self._evictable_leaves.discard(parent)
        self._evictable_leaves.add(leaf)
        self._evictable_tokens += len(key)
        self._num_nodes += 1
        return leaf

    def _split(self, node: TreeNode, n: int) -> TreeNode:
        """Cut `node` after its first `n` tokens (0 < n < len) and return the new upper half.

        `node` keeps the deeper half, so handles to it stay valid. The upper half copies lock_ref
        and last_access_time, so token counts, leaf set and both orderings are unchanged.
        """
        parent = node.parent
        assert parent is not None and 0 < n < len(node.key)
        upper = TreeNode(node.key[:n], node.value[:n], parent, node.last_access_time, next(self._node_ids))
        upper.lock_ref = node.lock_ref
        upper.children[node.key[n]] = node
        parent.children[node.key[0]] = upper
        node.key, node.value, node.parent = node.key[n:], node.value[n:], upper
        self._num_nodes += 1
        if self.observer is not None and self._is_unsalted(upper):
            self.observer.on_split(upper, node)
        return upper

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect the path root..node from eviction (a running request reads it)."""
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable_tokens -= len(node.key)
                self._locked_tokens += len(node.key)
                self._evictable_leaves.discard(node)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one `inc_lock_ref(node)`."""
        if node.parent is not None and node.lock_ref <= 0:
            raise RuntimeError("dec_lock_ref on a node that is not locked")
        while node.parent is not None:  # ancestors' lock_ref >= node's, so none goes negative
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable_tokens += len(node.key)
                self._locked_tokens -= len(node.key)
                if not node.children:
                    self._evictable_leaves.add(node)
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` (or all evictable) tokens, least recently used leaves first.

        A heap over the current evictable leaves; a parent left an unlocked leaf joins the heap.
        Popped times never decrease (a parent is never older than its child), so every evicted
        node is at most as recent as every evictable leaf that remains. Returns the count freed.
        """
        if num_tokens <= 0:
            return 0
        heap = [(leaf.last_access_time, leaf.node_id, leaf) for leaf in self._evictable_leaves]
        heapq.heapify(heap)
        num_evicted, freed = 0, []
        while num_evicted < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self._evictable_leaves.remove(leaf)
            self._evictable_tokens -= len(leaf.key)
            self._num_nodes -= 1
            num_evicted += len(leaf.key)
            freed.append(leaf.value)
            if self.observer is not None and self._is_unsalted(leaf):
                self.observer.on_evict(leaf)
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                self._evictable_leaves.add(parent)
                heapq.heappush(heap, (parent.last_access_time, parent.node_id, parent))
            elif not parent.children and parent in self._root_to_namespace:  # an emptied namespace
                del self.namespace_to_root[self._root_to_namespace.pop(parent)]
        if freed:
            self.kv_pool.free(torch.cat(freed))
        return num_evicted

    def flush(self) -> None:
        """Drop every cached prefix, freeing its slots. Raises if any prefix is locked."""
        if self._locked_tokens:
            raise RuntimeError(
                f"flush: {self._locked_tokens} cached tokens are locked by running requests"
            )
        values = [node.value for node in self._iter_nodes()]
        if values:
            self.kv_pool.free(torch.cat(values))
        self._reset()
        if self.observer is not None:
            self.observer.on_flush()

    def _is_unsalted(self, node: TreeNode) -> bool:
        """Whether `node` is in the tree of namespace None (O(depth): for the observer only)."""
        while node.parent is not None:
            node = node.parent
        return node is self.root_node

    def _iter_nodes(self) -> Iterator[TreeNode]:
        """Every node except the roots (depth first), of every namespace."""
        stack = [child for root in (self.root_node, *self.namespace_to_root.values()) for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_invariants(self) -> None:
        """Recount by a full walk and compare with the incremental state (for tests; O(tree))."""
        evictable = locked = 0
        leaves: set[TreeNode] = set()
        values = []
        for node in self._iter_nodes():
            parent = node.parent
            assert parent is not None  # only the root has none
            _require(parent.children.get(node.key[0]) is node, "parent link")
            _require(len(node.key) > 0 and node.value.numel() == len(node.key), "key/value length")
            _require(
                node.lock_ref >= 0 and (parent.parent is None or parent.lock_ref >= node.lock_ref), "lock_ref"
            )
            _require(parent.last_access_time >= node.last_access_time, "parent older than child")
            evictable += 0 if node.lock_ref else len(node.key)
            locked += len(node.key) if node.lock_ref else 0
            if not node.children and not node.lock_ref:
                leaves.add(node)
            values.append(node.value)
        _require((evictable, locked) == (self._evictable_tokens, self._locked_tokens), "token counts")
        _require(
            len(values) == self._num_nodes and leaves == self._evictable_leaves, "node count or leaf set"
        )
        slots = torch.cat(values) if values else _empty_slots()
        _require(slots.unique().numel() == slots.numel(), "a slot is cached twice")
        _require(all(root.children and root.parent is None and self._root_to_namespace.get(root) == namespace
                     for namespace, root in self.namespace_to_root.items())
                 and len(self._root_to_namespace) == len(self.namespace_to_root), "namespace roots")


class NoopRadixCache(BasePrefixCache):
    """`--disable-radix-cache`: matches nothing and takes nothing; the same contract as RadixCache."""

    def __init__(self, kv_pool: SlotFreer | None = None):
        super().__init__()
        self.root_node = TreeNode((), _empty_slots(), None, 0, 0)

    def match_prefix(self, token_ids: Sequence[int], *, record_stats: bool = False,
                     namespace: str | None = None) -> MatchResult:
        if record_stats:
            self.record_stats(len(token_ids), 0)
        return MatchResult(_empty_slots(), self.root_node)

    def insert(self, token_ids: Sequence[int], slots: torch.Tensor, namespace: str | None = None) -> int:
        """Take nothing: all `len(token_ids)` leading slots stay the caller's."""
        if slots.numel() != len(token_ids):
            raise ValueError(f"insert: {len(token_ids)} tokens but {slots.numel()} slots")
        return len(token_ids)

    def inc_lock_ref(self, node: TreeNode) -> None:
        pass

    def dec_lock_ref(self, node: TreeNode) -> None:
        pass

    def evict(self, num_tokens: int) -> int:
        return 0

    def flush(self) -> None:
        pass

    def check_invariants(self) -> None:
        pass
