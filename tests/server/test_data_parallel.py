"""`--dp-size 2` through the real server (tiny model): same greedy outputs as dp 1, every rank
reported, each load-balance method's dispatch seen from the ranks' counters, and a dead rank
reported as 503 like any child's death.

Where each request went is read from /server_info's `internal_states[r].num_dispatched_reqs`
before and after it (requests are sent one at a time, so the difference names its rank)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq
from conftest import ServerHandle, free_port, start_server, stream_while_killing
from kv_events_testing import DECODER
from radixlm_testing import wait_until

PROMPTS = ["The capital of France is", "One, two, three,", "def fib(n):", "Hello"]
GREEDY = {"max_new_tokens": 12, "temperature": 0}
# two families whose shared prefix is most of each prompt (prefix_affinity's threshold is 30%)
FAMILY = {name: f"{name} " * 60 for name in ("apples", "rivers")}
TRAFFIC = [("apples", 0), ("apples", 1), ("rivers", 0), ("rivers", 1), ("apples", 2), ("rivers", 2),
           ("apples", 3), ("rivers", 3)]


def start_dp(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, method: str, *extra: str) -> ServerHandle:
    log = tmp_path_factory.mktemp("dp") / f"{method}.log"
    return start_server(tiny_model_dir, log, "--dp-size", "2", "--load-balance-method", method,
                        "--max-total-tokens", "4096", "--random-seed", "0", *extra)


@pytest.fixture(scope="module")
def kv_event_subscribers() -> Iterator[list[zmq.Socket]]:
    """A SUB socket for each rank's KV events, bound on 127.0.0.1 (ports P and P + 1: rank r's
    publisher connects to the configured port + r)."""
    ctx = zmq.Context()
    for _ in range(20):
        port = free_port()
        subs = [ctx.socket(zmq.SUB) for _ in range(2)]
        try:
            for rank, sub in enumerate(subs):
                sub.setsockopt(zmq.LINGER, 0)
                sub.setsockopt(zmq.SUBSCRIBE, b"kv")
                sub.bind(f"tcp://127.0.0.1:{port + rank}")
            break
        except zmq.ZMQError:  # port + 1 was taken: try another pair
            for sub in subs:
                sub.close()
    yield subs
    for sub in subs:
        sub.close()
    ctx.term()


@pytest.fixture(scope="module")
def dp_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
              kv_event_subscribers: list[zmq.Socket]) -> Iterator[ServerHandle]:
    port = int(kv_event_subscribers[0].getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1])
    events = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv"}
    server = start_dp(tiny_model_dir, tmp_path_factory, "prefix_affinity",  # the default, named for the log
                      "--kv-events-config", json.dumps(events))
    yield server
    server.stop()


def states(server: ServerHandle) -> list[dict[str, Any]]:
    info = httpx.get(server.url + "/server_info", timeout=30).json()
    return list(info["internal_states"])


def dispatched(server: ServerHandle) -> list[int]:
    return [s["num_dispatched_reqs"] for s in states(server)]


def generate_on_rank(server: ServerHandle, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Send one request (nothing else in flight but what the test holds) and say which rank took it."""
    before = dispatched(server)
    out = httpx.post(server.url + "/generate", json=body, timeout=60).json()
    after = dispatched(server)
    [rank] = [r for r in range(len(after)) if after[r] != before[r]]
    return rank, out


def family_traffic(server: ServerHandle) -> tuple[dict[str, set[int]], list[int]]:
    """TRAFFIC sent in order: each family's ranks, and each request's cached tokens."""
    assert httpx.post(server.url + "/flush_cache", timeout=30).status_code == 200
    ranks: dict[str, set[int]] = {name: set() for name in FAMILY}
    cached = []
    for name, i in TRAFFIC:
        rank, out = generate_on_rank(server, {"text": FAMILY[name] + f"question {i}?",
                                              "sampling_params": {"max_new_tokens": 1}})
        ranks[name].add(rank)
        cached.append(out["meta_info"]["cached_tokens"])
    return ranks, cached


def stream_texts(url: str, body: dict[str, Any]) -> list[str]:
    texts = []
    with httpx.stream("POST", url, json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                texts.append(json.loads(line[len("data: "):])["text"])
    return texts


def greedy_outputs(url: str, model: str, new_tokens: int = 12) -> list[Any]:
    """Greedy texts of PROMPTS through /generate (batched, and streamed) and both OpenAI routes."""
    greedy = {"max_new_tokens": new_tokens, "temperature": 0}
    native = [o["text"] for o in httpx.post(url + "/generate", json={"text": PROMPTS, "sampling_params": greedy},
                                            timeout=120).json()]
    streamed = stream_texts(url + "/generate", {"text": PROMPTS[0], "sampling_params": greedy, "stream": True})
    completion = httpx.post(url + "/v1/completions", timeout=120, json={
        "model": model, "prompt": PROMPTS[1], "max_tokens": new_tokens, "temperature": 0}).json()
    chat = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": PROMPTS[2]}], "max_tokens": new_tokens,
        "temperature": 0}).json()
    return [native, streamed[-1], completion["choices"][0]["text"], chat["choices"][0]["message"]["content"]]


def test_same_greedy_outputs_as_dp1(dp_server: ServerHandle, tiny_server: ServerHandle, tiny_model_name: str) -> None:
    assert greedy_outputs(dp_server.url, tiny_model_name) == greedy_outputs(tiny_server.url, tiny_model_name)


def test_every_rank_is_reported(dp_server: ServerHandle) -> None:
    info = httpx.get(dp_server.url + "/server_info", timeout=30).json()
    assert info["dp_size"] == 2
    ranks = info["internal_states"]
    assert [s["dp_rank"] for s in ranks] == [0, 1]
    assert len({s["scheduler_pid"] for s in ranks}) == 2  # two scheduler processes
    assert info["max_total_num_tokens"] == sum(s["max_total_num_tokens"] for s in ranks) == 2 * 4096
    load = httpx.get(dp_server.url + "/get_load", timeout=30).json()
    assert [entry["dp_rank"] for entry in load] == [0, 1]
    metrics = httpx.get(dp_server.url + "/metrics", timeout=30).text.splitlines()
    [pool] = [line for line in metrics if line.startswith("radixlm_kv_pool_total_tokens{")]
    assert pool.split()[-1] == str(2 * 4096)  # the metrics sum the ranks


def test_each_rank_publishes_its_kv_events(dp_server: ServerHandle, kv_event_subscribers: list[zmq.Socket]) -> None:
    """Each rank publishes on the configured port + its rank, stamped with its rank. A flush
    reaches every rank, and each publishes AllBlocksCleared; flushed until both have arrived (a
    subscription is live only some time after the publisher connects)."""
    ranks: list[set[int]] = [set(), set()]
    deadline = time.monotonic() + 60
    while not all(ranks):
        assert time.monotonic() < deadline, f"KV events seen from ranks {ranks}"
        assert httpx.post(dp_server.url + "/flush_cache", timeout=30).status_code == 200
        for got, sub in zip(ranks, kv_event_subscribers):
            while sub.poll(200):
                _, _, payload = sub.recv_multipart()
                got.add(DECODER.decode(payload).data_parallel_rank)
    assert ranks == [{0}, {1}]


def test_a_requested_rank_is_honoured(dp_server: ServerHandle, tiny_server: ServerHandle, tiny_model_name: str) -> None:
    """SGLang's data_parallel_rank / routed_dp_rank (what a --dp-aware sglang-router sends) pick the
    rank; a rank the server does not have is a 400 before anything runs."""
    for rank in (1, 1, 0):
        assert generate_on_rank(dp_server, {"text": "hi", "sampling_params": GREEDY, "data_parallel_rank": rank})[0] == rank
    before = dispatched(dp_server)
    chat = {"model": tiny_model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "routed_dp_rank": 1}
    assert httpx.post(dp_server.url + "/v1/chat/completions", json=chat, timeout=60).status_code == 200
    assert [a - b for a, b in zip(dispatched(dp_server), before)] == [0, 1]
    for server, rank in ((dp_server, 2), (tiny_server, 1)):
        resp = httpx.post(server.url + "/generate", json={"text": "hi", "data_parallel_rank": rank}, timeout=60)
        assert resp.status_code == 400 and f"data_parallel_rank {rank}: this server has" in resp.text, resp.text


def test_prefix_affinity_keeps_each_family_on_one_rank(dp_server: ServerHandle) -> None:
    before = [s["radix_cache"]["num_matched_tokens"] for s in states(dp_server)]
    ranks, cached = family_traffic(dp_server)
    assert all(len(r) == 1 for r in ranks.values()), ranks
    assert ranks["apples"] != ranks["rivers"]  # a new family goes to the rank whose index is smaller
    first = {TRAFFIC.index((name, 0)) for name in FAMILY}
    prefix_tokens = min(cached[i] for i in range(len(TRAFFIC)) if i not in first)
    assert prefix_tokens >= 50, cached  # every later request of a family found its prefix cached
    hits = [s["radix_cache"]["num_matched_tokens"] - b for s, b in zip(states(dp_server), before)]
    assert all(h >= 3 * 50 for h in hits), hits  # each rank served its own family's three repeats


def test_round_robin_alternates_and_splits_families(tiny_model_dir: Path,
                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    server = start_dp(tiny_model_dir, tmp_path_factory, "round_robin")
    try:
        ranks = [generate_on_rank(server, {"text": p, "sampling_params": GREEDY})[0] for p in PROMPTS]
        assert ranks in ([0, 1, 0, 1], [1, 0, 1, 0])
        family_ranks, _ = family_traffic(server)
        assert family_ranks == {"apples": {0, 1}, "rivers": {0, 1}}  # each family on both ranks
        kill_a_rank(server)
    finally:
        server.stop(signal.SIGKILL)


def kill_a_rank(server: ServerHandle) -> None:
    """A rank's death fails its in-flight request with 503 and stops the server (as any child's).
    The rank is stopped before the request is sent, so it cannot finish whatever the machine's speed."""
    pids = [s["scheduler_pid"] for s in states(server)]
    next_rank = sum(dispatched(server)) % 2  # round_robin: nothing else was sent meanwhile
    os.kill(pids[next_rank], signal.SIGSTOP)
    body = {"text": "go on", "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}, "stream": True}
    events = stream_while_killing(server.url, body, pids[next_rank])
    errors = [e for e in events if isinstance(e, str) or "error" in e]
    assert errors, events
    if isinstance(errors[0], dict):
        assert errors[0]["error"]["code"] == 503, errors[0]
    assert server.wait_exit() != 0
    assert f"the scheduler dp{next_rank} process died" in server.log()


def test_total_tokens_avoids_the_busy_rank(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A long request held in flight on rank 0 (its scheduler stopped before the request is sent,
    so it stays there whatever the machine's speed): the next requests all go to rank 1. (The
    other methods' choices are shown on the balancer itself, tests/server/test_load_balance.py.)"""
    server = start_dp(tiny_model_dir, tmp_path_factory, "total_tokens", "--log-level", "debug")
    try:
        pids = [s["scheduler_pid"] for s in states(server)]
        os.kill(pids[0], signal.SIGSTOP)  # (no /server_info now: a stopped rank cannot answer it)
        try:
            long = {"text": "word " * 200, "sampling_params": {"max_new_tokens": 100}, "stream": True}
            with httpx.stream("POST", server.url + "/generate", json=long, timeout=120) as resp:
                assert resp.status_code == 200
                wait_until(lambda: "sent to the scheduler" in server.log(), "the request reached a scheduler")  # on an idle server, ties go to rank 0
                for prompt in PROMPTS:
                    httpx.post(server.url + "/generate", json={"text": prompt, "sampling_params": GREEDY},
                               timeout=60).raise_for_status()
        finally:
            os.kill(pids[0], signal.SIGCONT)
        assert dispatched(server) == [1, len(PROMPTS)]
    finally:
        server.stop()
