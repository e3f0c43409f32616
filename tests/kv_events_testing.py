"""A KV events consumer for tests: structs written from SGLang's / vLLM's spec (msgspec,
array_like + tag: the form their subscribers decode with), a subscriber's view of the cached
blocks, and a real zmq SUB socket that waits for events (never for time)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from radixlm.runtime.mem_cache.kv_events import block_hash, chain_block_hashes
from radixlm.runtime.mem_cache.radix_cache import RadixCache


class WireBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class WireEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class WireBlockStored(WireEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class WireBlockRemoved(WireEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class WireAllBlocksCleared(WireEvent, tag="AllBlocksCleared"):
    pass


class WireKVEventBatch(WireBatch):
    events: list[WireBlockStored | WireBlockRemoved | WireAllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(WireKVEventBatch)


class LiveBlocks:
    """A subscriber's view: the blocks the events say are cached (hash -> (parent, tokens)),
    checking as it goes that the events are consistent (chains rooted in cached blocks, the pinned
    hash scheme, nothing stored twice or removed before its children)."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.blocks: dict[int, tuple[int | None, tuple[int, ...]]] = {}
        self.num_stored = self.num_removed = self.num_cleared = 0

    def apply(self, event: Any) -> None:
        if isinstance(event, WireAllBlocksCleared):
            self.blocks.clear()
            self.num_cleared += 1
        elif isinstance(event, WireBlockRemoved):
            for h in event.block_hashes:
                assert self.blocks.pop(h, None) is not None, "removed a block that was not stored"
            removed = set(event.block_hashes)
            assert all(parent not in removed for parent, _ in self.blocks.values()), "removed a block before its child"
            self.num_removed += len(event.block_hashes)
        else:
            assert event.block_size == self.block_size
            assert len(event.token_ids) == self.block_size * len(event.block_hashes)
            parent = event.parent_block_hash
            assert parent is None or parent in self.blocks, "stored after a block that is not cached"
            for i, h in enumerate(event.block_hashes):
                tokens = tuple(event.token_ids[i * self.block_size : (i + 1) * self.block_size])
                assert block_hash(parent, tokens) == h, "the hash chain does not follow the pinned scheme"
                assert h not in self.blocks, "stored a block that was already cached"
                self.blocks[h] = (parent, tokens)
                parent = h
            self.num_stored += len(event.block_hashes)


def full_blocks(cache: RadixCache, block_size: int) -> set[int]:
    """The hashes of every full block of every root path of the cache's tree (by a full walk)."""
    hashes: set[int] = set()
    stack = [(c, c.key) for c in cache.root_node.children.values()]
    while stack:
        node, path = stack.pop()
        if not node.children:
            hashes.update(chain_block_hashes(path, block_size))
        stack.extend((c, path + c.key) for c in node.children.values())
    return hashes


class Subscriber:
    """A SUB socket on a KV events endpoint; every batch received is checked and applied in order."""

    def __init__(self, endpoint: str, topic: str, block_size: int):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.topic = topic.encode()
        self.live = LiveBlocks(block_size)
        self.payloads: dict[int, bytes] = {}  # by seq
        self.ranks: set[int | None] = set()

    def receive(self, timeout_ms: int) -> bool:
        """Take one batch if one comes within timeout_ms (a failure guard, not an ordering)."""
        if not self.sock.poll(timeout_ms):
            return False
        topic, seq_bytes, payload = self.sock.recv_multipart()
        assert topic == self.topic
        seq = int.from_bytes(seq_bytes, "big")
        if self.payloads:
            assert seq == max(self.payloads) + 1, f"a gap in the sequence numbers: {max(self.payloads)} -> {seq}"
        self.payloads[seq] = payload
        batch = DECODER.decode(payload)
        self.ranks.add(batch.data_parallel_rank)
        for event in batch.events:
            self.live.apply(event)
        return True

    def handshake(self, flush: Callable[[], object], timeout: float = 60) -> None:
        """Flush until an event arrives: from then on the subscription is live (a PUB socket drops
        what it sends before a subscriber has joined) and the cache is empty."""
        deadline = time.monotonic() + timeout
        while not self.payloads:
            assert time.monotonic() < deadline, "no KV event arrived"
            flush()
            self.receive(200)

    def wait_for(self, condition: Callable[[LiveBlocks], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not condition(self.live):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"timed out waiting for {what}"
            self.receive(int(min(remaining, 1.0) * 1000))

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def replay(endpoint: str, start_seq: int, timeout: float = 60) -> list[tuple[int, bytes]]:
    """Ask a replay socket for the batches from start_seq on: [(seq, payload)] until its end marker."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart((b"", start_seq.to_bytes(8, "big")))
        got = []
        while True:
            assert sock.poll(int(timeout * 1000)), "no replay answer"
            _, seq_bytes, payload = sock.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == -1:
                return got
            got.append((seq, payload))
    finally:
        sock.close()
        ctx.term()
