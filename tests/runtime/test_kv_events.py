"""KV events (mem_cache/kv_events.py): the recorder follows the radix cache block for block, and the
wire format decodes with structs written from SGLang's / vLLM's spec (msgspec, array_like + tag)."""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kv_events_testing import (
    DECODER,
    LiveBlocks,
    WireAllBlocksCleared,
    WireBatch,
    WireBlockRemoved,
    WireBlockStored,
    WireEvent,
    WireKVEventBatch,
    full_blocks,
)

from radixlm.runtime.config.kv_events_config import KVEventsConfig
from radixlm.runtime.mem_cache.kv_events import (
    AllBlocksCleared,
    BlockEventRecorder,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    block_hash,
    chain_block_hashes,
)
from radixlm.runtime.mem_cache.mem_pool import KVPool
from radixlm.runtime.mem_cache.radix_cache import RadixCache


# SGLang's structs before `medium` was added: trailing fields they lack are ignored.
class OldBlockStored(WireEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class OldBlockRemoved(WireEvent, tag="BlockRemoved"):
    block_hashes: list[int]


class OldKVEventBatch(WireBatch):
    events: list[OldBlockStored | OldBlockRemoved | WireAllBlocksCleared]


def decode(batch: KVEventBatch) -> WireKVEventBatch:
    return DECODER.decode(msgpack.packb(batch.to_wire()))


def make_cache(block_size: int, pool_size: int = 4096) -> tuple[RadixCache, KVPool, BlockEventRecorder]:
    pool = KVPool(pool_size, num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float32)
    recorder = BlockEventRecorder(block_size)
    return RadixCache(pool, recorder), pool, recorder


def insert(cache: RadixCache, pool: KVPool, ids: list[int]) -> None:
    slots = pool.alloc(len(ids))
    assert slots is not None
    taken_from = cache.insert(ids, slots)
    pool.free(slots[:taken_from])


def test_block_hash_is_pinned() -> None:
    """The scheme the README writes down, byte for byte (a router recomputes it)."""
    import hashlib
    import struct

    first = hashlib.sha256(struct.pack("<4I", 1, 2, 3, 4)).digest()[:8]
    assert block_hash(None, [1, 2, 3, 4]) == int.from_bytes(first, "big", signed=True)
    parent = block_hash(None, [1, 2, 3, 4])
    second = hashlib.sha256(parent.to_bytes(8, "big", signed=True) + struct.pack("<2I", 5, 70000)).digest()[:8]
    assert block_hash(parent, [5, 70000]) == int.from_bytes(second, "big", signed=True)
    assert chain_block_hashes([1, 2, 3, 4, 5, 70000, 9], 2) == [
        block_hash(None, [1, 2]), block_hash(block_hash(None, [1, 2]), [3, 4]),
        block_hash(block_hash(block_hash(None, [1, 2]), [3, 4]), [5, 70000])]


def test_wire_form_decodes_with_both_struct_versions() -> None:
    batch = KVEventBatch(12.5, (BlockStored((7, -8), None, (1, 2, 3, 4), 2), BlockRemoved((7,)), AllBlocksCleared()), 3)
    assert msgpack.unpackb(msgpack.packb(batch.to_wire())) == [
        12.5, [["BlockStored", [7, -8], None, [1, 2, 3, 4], 2, None, None], ["BlockRemoved", [7], None],
               ["AllBlocksCleared"]], 3]
    wire = decode(batch)
    assert (wire.ts, wire.data_parallel_rank) == (12.5, 3)
    assert wire.events == [WireBlockStored([7, -8], None, [1, 2, 3, 4], 2, None, None), WireBlockRemoved([7], None),
                           WireAllBlocksCleared()]
    old = msgspec.msgpack.decode(msgpack.packb(batch.to_wire()), type=OldKVEventBatch)
    assert old.events == [OldBlockStored([7, -8], None, [1, 2, 3, 4], 2, None), OldBlockRemoved([7]),
                          WireAllBlocksCleared()]


def test_shared_prefix_stores_each_block_once_and_splits_publish_nothing() -> None:
    cache, pool, recorder = make_cache(block_size=4)
    insert(cache, pool, list(range(10)))  # blocks [0:4) [4:8); 8, 9 are a partial block
    (stored,) = recorder.take_events()
    assert isinstance(stored, BlockStored) and stored.parent_block_hash is None
    assert stored.token_ids == tuple(range(8)) and len(stored.block_hashes) == 2
    cache.match_prefix(list(range(6)))  # splits a node: no prefix changes
    assert recorder.take_events() == []
    insert(cache, pool, [*range(6), 60, 61, 62, 63])  # shares 6 tokens: only the block [4:8) is new
    (stored,) = recorder.take_events()
    assert isinstance(stored, BlockStored)
    assert stored.token_ids == (4, 5, 60, 61) and stored.parent_block_hash == block_hash(None, [0, 1, 2, 3])
    insert(cache, pool, list(range(9)))  # already cached: nothing new
    assert recorder.take_events() == []
    recorder.check(cache)
    assert recorder.block_hashes() == full_blocks(cache, 4)


@given(
    block_size=st.sampled_from([1, 3, 4]),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("insert"), st.lists(st.integers(0, 3), min_size=1, max_size=14)),
            st.tuples(st.just("match"), st.lists(st.integers(0, 3), min_size=1, max_size=14)),
            st.tuples(st.just("evict"), st.integers(1, 12)),
            st.tuples(st.just("flush"), st.just(0)),
        ),
        max_size=30,
    ),
)
def test_events_replay_to_the_cache_full_blocks(block_size: int, ops: list[tuple[str, Any]]) -> None:
    """After any sequence of inserts, matches (splits), evictions and flushes, a subscriber that
    applies the decoded events holds exactly the full blocks of the tree's paths."""
    cache, pool, recorder = make_cache(block_size, pool_size=64)
    live = LiveBlocks(block_size)
    for op, arg in ops:
        if op == "insert":
            if pool.num_free < len(arg):
                cache.evict(len(arg) - pool.num_free)
            insert(cache, pool, arg)
        elif op == "match":
            cache.match_prefix(arg)
        elif op == "evict":
            cache.evict(arg)
        else:
            cache.flush()
        for event in decode(KVEventBatch(0.0, tuple(recorder.take_events()))).events:
            live.apply(event)
        cache.check_invariants()
        recorder.check(cache)
        assert set(live.blocks) == full_blocks(cache, block_size) == recorder.block_hashes()


def test_no_observer_no_recorder_work() -> None:
    """Events off: the cache has no observer and behaves as before."""
    pool = KVPool(64, num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float32)
    cache = RadixCache(pool)
    assert cache.observer is None
    insert(cache, pool, [1, 2, 3])
    cache.evict(3)
    cache.flush()
    cache.check_invariants()


def test_recorder_rejects_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block_size"):
        BlockEventRecorder(0)


@pytest.mark.parametrize(("endpoint", "rank", "want"), [
    ("tcp://*:5557", 0, "tcp://*:5557"),
    ("tcp://*:5557", 2, "tcp://*:5559"),
    ("tcp://10.0.0.1:6000", 1, "tcp://10.0.0.1:6001"),
    ("inproc://kv", 1, "inproc://kv_dp1"),
])
def test_each_data_parallel_rank_publishes_on_its_own_endpoint(endpoint: str, rank: int, want: str) -> None:
    from radixlm.runtime.config.kv_events_config import endpoint_for_rank

    assert endpoint_for_rank(endpoint, rank) == want


def test_publisher_connects_to_a_binding_subscriber_and_numbers_its_batches() -> None:
    """An endpoint without `*` makes the PUB socket connect (the subscriber binds), as SGLang's."""
    import json
    import time

    import zmq

    from radixlm.runtime.scheduler.kv_events_publisher import KVEventStream

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    config = KVEventsConfig.from_json(json.dumps({"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}",
                                                  "topic": "kv", "block_size": 2}))
    stream = KVEventStream(config)
    try:
        cache = RadixCache(KVPool(16, 1, 1, 1, torch.float32), stream.recorder)
        deadline = time.monotonic() + 60
        received: list[tuple[int, WireKVEventBatch]] = []
        while not received:  # a connecting PUB drops what it sends before the link is up
            assert time.monotonic() < deadline, "no batch arrived"
            cache.flush()
            stream.publish_pending()
            if sub.poll(200):
                topic, seq, payload = sub.recv_multipart()
                assert topic == b"kv"
                received.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
        slots = cache.kv_pool.alloc(4)
        cache.insert([1, 2, 3, 4], slots)
        stream.publish_pending()
        want = [WireBlockStored(chain_block_hashes([1, 2, 3, 4], 2), None, [1, 2, 3, 4], 2, None, None)]
        while received[-1][1].events != want:  # after the handshake's AllBlocksCleared batches
            assert sub.poll(60_000), "the BlockStored batch did not arrive"
            topic, seq, payload = sub.recv_multipart()
            assert int.from_bytes(seq, "big") == received[-1][0] + 1
            received.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
    finally:
        stream.shutdown()
        sub.close()
        ctx.term()
