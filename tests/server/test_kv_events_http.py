"""KV events through the real server (`--kv-events-config`): a zmq SUB socket follows the
scheduler's radix cache over /generate with a shared prefix, eviction and /flush_cache; the
replay socket resends what was published; a bad config stops the server at startup."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ServerHandle, start_server
from kv_events_testing import Subscriber, replay

from radixlm.runtime.config.kv_events_config import KVEventsConfig
from radixlm.runtime.config.server_args import ServerArgs
from radixlm.runtime.mem_cache.kv_events import chain_block_hashes

BLOCK = 4
GREEDY = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def events_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerHandle, dict]]:
    folder = tmp_path_factory.mktemp("kv-events")
    config = {"publisher": "zmq", "endpoint": f"ipc://{folder}/pub", "replay_endpoint": f"ipc://{folder}/replay",
              "topic": "kv-events", "block_size": BLOCK}
    server = start_server(tiny_model_dir, folder / "server.log", "--max-total-tokens", "192",
                          "--kv-events-config", json.dumps(config))
    yield server, config
    server.stop()


def generate(server: ServerHandle, input_ids: list[int] | list[list[int]]) -> None:
    resp = httpx.post(server.url + "/generate", json={"input_ids": input_ids, "sampling_params": GREEDY}, timeout=120)
    assert resp.status_code == 200, resp.text


def radix_info(server: ServerHandle) -> dict:
    return httpx.get(server.url + "/get_server_info", timeout=30).json()["radix_cache"]


def flush(server: ServerHandle) -> None:
    assert httpx.post(server.url + "/flush_cache", timeout=30).status_code == 200


def test_server_events_follow_the_cache(events_server: tuple[ServerHandle, dict]) -> None:
    server, config = events_server
    sub = Subscriber(config["endpoint"], config["topic"], BLOCK)
    try:
        sub.handshake(lambda: flush(server))
        prefix = list(range(1000, 1022))
        first, second = prefix + [7, 8, 9], prefix + [5, 6, 7, 8, 9, 10]
        generate(server, first)
        want = set(chain_block_hashes(first, BLOCK))
        sub.wait_for(lambda live: want <= set(live.blocks), "the first prompt's blocks")
        num_stored = sub.live.num_stored
        generate(server, second)
        want |= set(chain_block_hashes(second, BLOCK))
        sub.wait_for(lambda live: want <= set(live.blocks), "the second prompt's blocks")
        # only the second prompt's own blocks were stored (each block at most once: LiveBlocks)
        assert sub.live.num_stored - num_stored < len(chain_block_hashes(second, BLOCK))

        others = [[2000 + 40 * i + j for j in range(30)] for i in range(6)]  # overflow the 192-token pool
        generate(server, others)
        sub.wait_for(lambda live: live.num_removed > 0, "blocks removed by eviction")
        info = radix_info(server)
        assert info["num_evicted_tokens"] > 0
        sub.wait_for(lambda live: set(chain_block_hashes(others[-1], BLOCK)) <= set(live.blocks), "the last prompt")
        tree_tokens = radix_info(server)["tree_tokens"]  # the server is idle: its cache is still
        sub.wait_for(lambda live: BLOCK * len(live.blocks) <= tree_tokens, "as many blocks as the cache holds")

        num_cleared = sub.live.num_cleared
        flush(server)
        sub.wait_for(lambda live: live.num_cleared > num_cleared, "AllBlocksCleared after /flush_cache")
        assert not sub.live.blocks and radix_info(server)["tree_tokens"] == 0
        assert sub.ranks == {0}

        # the replay socket resends every batch so far, byte for byte, then its end marker
        last = max(sub.payloads)
        replayed = dict(replay(config["replay_endpoint"], 0))
        assert sorted(replayed)[: last + 1] == list(range(last + 1))
        assert all(replayed[seq] == payload for seq, payload in sub.payloads.items())
        assert [seq for seq, _ in replay(config["replay_endpoint"], last)][0] == last
    finally:
        sub.close()


@pytest.mark.parametrize(("config", "message"), [
    ("{not json", "not valid JSON"),
    ('["zmq"]', "must be a JSON object"),
    ('{"publisher": "zmq", "endpont": "tcp://*:5557"}', "unknown key(s) endpont"),
    ('{"publisher": "kafka"}', "publisher must be one of null, zmq"),
    ('{"publisher": "zmq", "endpoint": "localhost:5557"}', "tcp://, ipc:// or inproc://"),
    ('{"publisher": "zmq", "block_size": "16"}', "block_size must be int"),
    ('{"publisher": "zmq", "block_size": 0}', "block_size must be >= 1"),
])
def test_bad_config_is_a_startup_error(config: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ServerArgs(kv_events_config=config)


def test_config_defaults_are_sglangs() -> None:
    config = KVEventsConfig.from_json('{"publisher": "zmq"}')
    assert (config.endpoint, config.replay_endpoint, config.topic, config.buffer_steps) == ("tcp://*:5557", None, "", 10_000)
    assert ServerArgs(kv_events_config='{"endpoint": "tcp://*:5557"}').kv_events is None  # publisher "null"
    assert ServerArgs().kv_events is None


def test_bad_config_stops_the_server_with_its_message(capsys: pytest.CaptureFixture[str]) -> None:
    from radixlm.runtime.server import serve

    with pytest.raises(SystemExit) as exit_info:
        serve.main(["--kv-events-config", '{"publisher": "zmq", "topik": "kv"}'])
    assert exit_info.value.code == 2
    assert "unknown key(s) topik" in capsys.readouterr().err
