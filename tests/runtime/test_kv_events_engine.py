"""KV events from an in-process Engine on the tiny model, received by a real zmq SUB socket and
checked against the radix cache's own contents: shared prefixes, eviction, flush."""

from __future__ import annotations

import json
from pathlib import Path

from kv_events_testing import LiveBlocks, Subscriber, full_blocks

from radixlm.runtime.engine import Engine

BLOCK = 4
GREEDY = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}


def test_engine_events_follow_the_cache(tiny_model_dir: Path, tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/kv-events"
    config = {"publisher": "zmq", "endpoint": endpoint, "topic": "kv", "block_size": BLOCK}
    engine = Engine(str(tiny_model_dir), max_total_tokens=160, random_seed=0, kv_events_config=json.dumps(config))
    sub = Subscriber(endpoint, "kv", BLOCK)
    cache = engine.scheduler.cache
    assert engine.scheduler.kv_events is not None

    def in_sync(live: LiveBlocks) -> bool:  # the engine is idle between calls: its cache is still
        return set(live.blocks) == full_blocks(cache, BLOCK)

    try:
        sub.handshake(engine.flush_cache)
        prefix = list(range(1000, 1022))  # 22 tokens: 5 full blocks and a partial one
        engine.generate(input_ids=prefix + [7, 8, 9], sampling_params=GREEDY)
        sub.wait_for(in_sync, "the first request's blocks")
        num_stored = sub.live.num_stored
        assert num_stored == len(full_blocks(cache, BLOCK)) >= 6

        engine.generate(input_ids=prefix + [5, 6, 7, 8, 9, 10], sampling_params=GREEDY)
        sub.wait_for(in_sync, "the second request's blocks")
        # the shared prefix's 5 blocks were not stored again (LiveBlocks refuses a block stored twice)
        assert sub.live.num_stored - num_stored == len(full_blocks(cache, BLOCK)) - num_stored >= 1
        engine.scheduler.kv_events.recorder.check(cache)

        # 5 more distinct 30-token prompts overflow the 160-token pool: the oldest leaves go
        others = [[2000 + 40 * i + j for j in range(30)] for i in range(5)]
        engine.generate(input_ids=others, sampling_params=GREEDY)
        assert engine.scheduler.bridge.num_evicted_tokens > 0
        sub.wait_for(lambda live: in_sync(live) and live.num_removed > 0, "blocks removed by eviction")
        engine.scheduler.kv_events.recorder.check(cache)

        num_cleared = sub.live.num_cleared
        assert engine.flush_cache()
        sub.wait_for(lambda live: live.num_cleared > num_cleared, "AllBlocksCleared after the flush")
        assert not sub.live.blocks and not full_blocks(cache, BLOCK)
        assert sub.ranks == {0}
    finally:
        sub.close()
        engine.shutdown()
