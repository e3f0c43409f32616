"""KV events: the radix cache's stored / removed / cleared blocks, as SGLang and vLLM publish them.

`BlockEventRecorder` observes a `RadixCache` (its `CacheObserver`) and turns each change of the
set of cached prefixes into events; the scheduler takes them after every step and publishes them
(`scheduler/kv_events_publisher.py`), as `--kv-events-config` says (`config/kv_events_config.py`).
Nothing here does I/O.

Wire format (pinned from SGLang's `python/sglang/srt/disaggregation/kv_events.py`, commit
612d579, and vLLM's `vllm/distributed/kv_events.py` of the same form: msgspec structs with
`array_like=True`, events with `tag=True`, so each is a msgpack array whose first element is the
class name). `to_wire()` gives exactly these lists:
    KVEventBatch     [ts, events, data_parallel_rank]
                     ts: float, Unix seconds; events: [event, ...]; data_parallel_rank: int
                     (SGLang calls the third field attn_dp_rank)
    BlockStored      ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
                      lora_id, medium]
                     block_hashes: [int], one per block, in path order; parent_block_hash: int, the
                     hash of the block before the first one, or nil for a path's first block;
                     token_ids: [int], the blocks' tokens (block_size per block); block_size: int;
                     lora_id: nil; medium: nil (no tier named)
    BlockRemoved     ["BlockRemoved", block_hashes, medium]    (medium: nil)
    AllBlocksCleared ["AllBlocksCleared"]
`medium` is the last field of both, so a decoder with the older structs (no `medium`: msgspec
ignores trailing array elements) and one with it (vLLM's `medium: str | None`) both decode it.
Not followed: newer vLLM (commit 0181ea3) drops `array_like` from the batch and events (maps, with
`lora_name`, `extra_keys`, `group_idx`, ...).

Blocks. The cache holds tokens in 1-token pages along a radix tree's root paths; events speak of
blocks of `block_size` tokens (the config's `block_size`, default 16): block k of a cached root
path is its tokens [k * block_size, (k + 1) * block_size), and only full blocks exist (a path's
last partial block is never published). A block is identified by the whole prefix it ends, as
its hash chain says:
    block_hash(parent, tokens) = first 8 bytes of SHA-256(P + T) as a big-endian signed int64
    P = b"" for a path's first block, else parent (the previous block's hash) as 8 bytes
        big-endian two's complement; T = the block's token ids, each 4 bytes little-endian
So a router hashes a prompt's full blocks the same way to find how much of it a worker caches.
A block is stored when a new leaf makes its prefix cached (one BlockStored per new leaf, for all
the full blocks ending in that leaf) and removed when eviction drops its prefix (one BlockRemoved
per evicted leaf); `flush` publishes AllBlocksCleared. Splits change no prefix and publish nothing.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixlm.runtime.config.kv_events_config import DEFAULT_BLOCK_SIZE

if TYPE_CHECKING:
    from radixlm.runtime.mem_cache.radix_cache import RadixCache, TreeNode

@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None

    def to_wire(self) -> list[Any]:
        return ["BlockStored", list(self.block_hashes), self.parent_block_hash, list(self.token_ids),
                self.block_size, self.lora_id, self.medium]


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str | None = None

    def to_wire(self) -> list[Any]:
        return ["BlockRemoved", list(self.block_hashes), self.medium]


@dataclass(frozen=True)
class AllBlocksCleared:
    def to_wire(self) -> list[Any]:
        return ["AllBlocksCleared"]


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class KVEventBatch:
    ts: float
    events: tuple[KVCacheEvent, ...]
    data_parallel_rank: int = 0

    def to_wire(self) -> list[Any]:
        return [self.ts, [e.to_wire() for e in self.events], self.data_parallel_rank]


def block_hash(parent: int | None, token_ids: Sequence[int]) -> int:
    """The hash of a block of `token_ids` after the block hashed `parent` (None: a path's first)."""
    prefix = b"" if parent is None else parent.to_bytes(8, "big", signed=True)
    digest = hashlib.sha256(prefix + struct.pack(f"<{len(token_ids)}I", *token_ids)).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def chain_block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The hashes of every full block of a root path spelling `token_ids`, in order."""
    hashes: list[int] = []
    for end in range(block_size, len(token_ids) + 1, block_size):
        hashes.append(block_hash(hashes[-1] if hashes else None, token_ids[end - block_size : end]))
    return hashes


class _NodeBlocks:
    """The blocks whose last token lies in one node's key: their end positions (in tokens from
    the root, increasing) and hashes; `end` is the node's own end position."""

    __slots__ = ("end", "ends", "hashes")

    def __init__(self, end: int, ends: list[int], hashes: list[int]):
        self.end, self.ends, self.hashes = end, ends, hashes


class BlockEventRecorder:
    """A RadixCache observer that records KV events (`take_events` hands them over).

    Invariant: `_blocks[node]` holds exactly the full blocks that end within `node`'s key, for
    every node that has any; the union over the tree is every full block of every cached path.
    """

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self._blocks: dict[TreeNode, _NodeBlocks] = {}
        self._events: list[KVCacheEvent] = []

    def take_events(self) -> list[KVCacheEvent]:
        """The events recorded since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    def on_insert(self, leaf: TreeNode, path_ids: tuple[int, ...], start: int) -> None:
        size, end = self.block_size, len(path_ids)
        first_end = (start // size + 1) * size  # the first block end past `start`
        if first_end > end:
            return
        parent = None if first_end == size else self._hash_ending_at(first_end - size, leaf.parent, start)
        ends = list(range(first_end, end + 1, size))
        hashes = []
        prev = parent
        for block_end in ends:
            prev = block_hash(prev, path_ids[block_end - size : block_end])
            hashes.append(prev)
        self._blocks[leaf] = _NodeBlocks(end, ends, hashes)
        self._events.append(BlockStored(tuple(hashes), parent, path_ids[first_end - size : ends[-1]], size))

    def on_split(self, upper: TreeNode, lower: TreeNode) -> None:
        blocks = self._blocks.get(lower)
        if blocks is None:
            return
        upper_end = blocks.end - len(lower.key)
        n = bisect.bisect_right(blocks.ends, upper_end)
        if n:
            self._blocks[upper] = _NodeBlocks(upper_end, blocks.ends[:n], blocks.hashes[:n])
            if n == len(blocks.ends):
                del self._blocks[lower]
            else:
                del blocks.ends[:n], blocks.hashes[:n]

    def on_evict(self, leaf: TreeNode) -> None:
        blocks = self._blocks.pop(leaf, None)
        if blocks is not None:
            self._events.append(BlockRemoved(tuple(blocks.hashes)))

    def on_flush(self) -> None:
        self._blocks.clear()
        self._events.append(AllBlocksCleared())

    def _hash_ending_at(self, pos: int, node: TreeNode | None, node_end: int) -> int:
        """The hash of the block ending at `pos` on the root path through `node` (ending at
        `node_end` >= pos > 0): found in the node whose key holds position `pos`."""
        while node is not None and node.parent is not None:
            node_start = node_end - len(node.key)
            if node_start < pos:
                blocks = self._blocks[node]
                return blocks.hashes[bisect.bisect_left(blocks.ends, pos)]
            node, node_end = node.parent, node_start
        raise AssertionError(f"no cached block ends at position {pos}")

    def block_hashes(self) -> set[int]:
        """Every block the recorder holds as cached (for tests)."""
        return {h for blocks in self._blocks.values() for h in blocks.hashes}

    def check(self, cache: RadixCache) -> None:
        """Raise AssertionError unless the recorded blocks are exactly the full blocks of the
        cache's root paths, each held by the node it ends in (for tests; O(tree))."""
        expected: dict[TreeNode, list[int]] = {}
        stack: list[tuple[TreeNode, tuple[int, ...]]] = [(c, c.key) for c in cache.root_node.children.values()]
        while stack:
            node, path = stack.pop()
            hashes = chain_block_hashes(path, self.block_size)
            first = (len(path) - len(node.key)) // self.block_size
            if hashes[first:]:
                expected[node] = hashes[first:]
            stack.extend((c, path + c.key) for c in node.children.values())
        actual = {node: blocks.hashes for node, blocks in self._blocks.items()}
        if actual != expected:
            raise AssertionError("KV event blocks differ from the cache's full blocks")
