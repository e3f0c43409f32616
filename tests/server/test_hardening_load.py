"""Load and faults through the real server (tiny random model, real processes, loopback HTTP).

- 64 concurrent clients (native /generate and /v1/chat/completions streams, native batches;
  shared prefixes, regex / JSON-schema constraints; some abort mid-stream, some drop the
  connection) against a KV pool small enough to force cache eviction and decode retraction:
  every request not cut short returns what a sequential run returned, none waits forever, and
  the pool is whole afterwards.
- A slow grammar compile, clients that never read their streams, a prompt larger than the pool.
- A killed detokenizer, then (after a restart on the same port) a killed scheduler, under load:
  /health says 503 and why, in-flight clients fail at once, the server exits non-zero.
test_lifecycle.py covers start-up, the API key, graceful shutdown and a killed scheduler with one
non-streamed request in flight.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import socket
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerHandle, free_port, start_server
from radixlm_testing import assert_engine_clean, process_children

from radixlm.runtime.bench.soak import (
    ACTIONS,
    LoadRequest,
    Outcome,
    request_shapes,
    send,
    wait_idle_and_flush,
    with_action,
)
from radixlm.runtime.server.serve import SHUTDOWN_GRACE_S

POOL = 768  # KV tokens: a few requests' worth, so 64 clients force eviction and retraction
NUM_CLIENTS = 64
NUM_SHAPES = 12
MIN_REQUESTS = 3  # per client: a slow machine still sees every kind of request
LOAD_SECONDS = 6.0  # after MIN_REQUESTS, clients start new requests until then
REQUEST_TIMEOUT = 120.0  # no request may wait longer than this
LIMITS = httpx.Limits(max_connections=2 * NUM_CLIENTS, max_keepalive_connections=2 * NUM_CLIENTS)


@pytest.fixture(scope="module")
def load_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    log = tmp_path_factory.mktemp("load") / "server.log"
    server = start_server(tiny_model_dir, log, "--max-total-tokens", str(POOL), "--chunked-prefill-size", "128",
                          "--random-seed", "0", "--dtype", "float32")  # outputs compared across batches
    yield server
    server.stop()


def server_info(server: ServerHandle) -> dict[str, Any]:
    return dict(httpx.get(server.url + "/get_server_info", timeout=30).json())


def wait_until_running(server: ServerHandle, num_running: int) -> None:
    """Wait for the event (with a hang guard), not for a number of seconds."""
    deadline = time.monotonic() + 120
    while server_info(server)["num_running_reqs"] < num_running:
        assert time.monotonic() < deadline, f"fewer than {num_running} requests ever ran"
        time.sleep(0.05)


async def flushed_info(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=60) as client:
        return await wait_idle_and_flush(client, url)


def assert_pool_whole(server: ServerHandle) -> None:
    info = asyncio.run(flushed_info(server.url))
    assert info["kv_pool"]["free_tokens"] == info["max_total_num_tokens"], info["kv_pool"]


# ------------------------------------------------------------------------------------ load
def burst_shapes(count: int, new_tokens: int) -> list[LoadRequest]:
    """Short prompts, long outputs: started together, they outgrow any admission estimate."""
    return [LoadRequest("generate", {"text": f"Burst {i}:", "sampling_params": {
        "temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}}) for i in range(count)]


Result = tuple[int, LoadRequest, Outcome]  # (shape index, the request sent, what the client saw)


async def mixed_clients(
    url: str, shapes: list[LoadRequest], num_burst: int
) -> tuple[list[Outcome], list[Result]]:
    """A sequential reference run of every shape, then NUM_CLIENTS clients: each starts at once with
    one of the first `num_burst` shapes, then sends random shapes (complete, aborted or
    disconnected), at least MIN_REQUESTS in all and until LOAD_SECONDS have passed.
    Returns (reference, [(shape, request, outcome)])."""
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT, limits=LIMITS) as client:
        reference = [await send(client, url, shape, REQUEST_TIMEOUT) for shape in shapes]
        results: list[Result] = []
        deadline = time.monotonic() + LOAD_SECONDS

        async def one_client(index: int) -> None:
            rng = random.Random(index)
            count = 0
            while count < MIN_REQUESTS or time.monotonic() < deadline:
                shape_index = index % num_burst if count == 0 else rng.randrange(len(shapes))
                action = "complete" if count == 0 else rng.choices(ACTIONS, weights=(6, 2, 2))[0]
                req = with_action(shapes[shape_index], action, f"load-{index}-{count}", rng.randint(1, 3))
                results.append((shape_index, req, await send(client, url, req, REQUEST_TIMEOUT)))
                count += 1

        await asyncio.gather(*(one_client(i) for i in range(NUM_CLIENTS)))
    return reference, results


def test_64_mixed_clients_match_a_sequential_run(load_server: ServerHandle) -> None:
    shapes = burst_shapes(4, 40) + request_shapes(NUM_SHAPES, seed=1, max_new_tokens=24)
    before = server_info(load_server)
    reference, results = asyncio.run(mixed_clients(load_server.url, shapes, num_burst=4))
    assert all(r.kind == "ok" for r in reference), [(r.kind, r.detail) for r in reference]
    errors = [(req.api, req.action, o.kind, o.detail) for _, req, o in results if o.is_error]
    assert not errors, errors
    kinds = Counter(o.kind for _, _, o in results)
    assert kinds["ok"] >= NUM_CLIENTS and kinds["aborted"] > 0 and kinds["disconnected"] > 0, kinds
    for shape_index, req, outcome in results:
        want = reference[shape_index]
        if outcome.kind == "ok":  # greedy: the same text and ids as alone, whatever the batch did
            assert outcome.texts == want.texts, (req, outcome, want)
            assert outcome.output_ids == want.output_ids, (req, outcome, want)
        elif outcome.kind == "aborted":  # cut short: a prefix of the full output
            assert outcome.output_ids is not None and want.output_ids is not None
            got = outcome.output_ids[0]
            assert got == want.output_ids[0][: len(got)], (req, outcome, want)
    after = server_info(load_server)
    assert after["num_retractions"] > before["num_retractions"], "the load never retracted a request"
    assert after["radix_cache"]["num_evicted_tokens"] > before["radix_cache"]["num_evicted_tokens"], "no eviction"
    metrics = httpx.get(load_server.url + "/metrics", timeout=30).text
    assert "radixlm_retractions_total{" in metrics and "radixlm_evicted_tokens_total{" in metrics
    assert_pool_whole(load_server)


# ------------------------------------------------------------------------------------ stalls
def big_schema(num_fields: int) -> dict[str, Any]:
    """A schema whose token index takes seconds to build (unique names: never cached)."""
    tag = uuid.uuid4().hex[:6]
    kinds = ({"type": "string", "maxLength": 12}, {"type": "integer"},
             {"type": "array", "items": {"type": "number"}, "maxItems": 3})
    props = {f"f{tag}_{i}": kinds[i % 3] for i in range(num_fields)}
    return {"type": "object", "properties": props, "required": list(props)}


async def timed(client: httpx.AsyncClient, url: str, req: LoadRequest) -> tuple[Outcome, float]:
    outcome = await send(client, url, req, REQUEST_TIMEOUT)
    return outcome, time.monotonic()


async def others_during_compile(url: str) -> None:
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT, limits=LIMITS) as client:
        greedy = {"temperature": 0, "max_new_tokens": 8}
        cached = LoadRequest("generate", {"text": "n:", "sampling_params": {**greedy, "regex": "[0-9]{4}"}})
        assert (await send(client, url, cached, REQUEST_TIMEOUT)).kind == "ok"  # compiled once, now cached
        big = LoadRequest("batch", {"text": ["JSON:"], "sampling_params": {
            "json_schema": json.dumps(big_schema(36)), "max_new_tokens": 1, "temperature": 0}})
        big_task = asyncio.ensure_future(timed(client, url, big))
        # the big request is in the scheduler, waiting for its grammar (compiled off the loop)
        while (await client.get(url + "/get_server_info")).json()["num_grammar_queue_reqs"] < 1:
            assert not big_task.done(), await big_task
            await asyncio.sleep(0.05)
        # a grammar never compiled before gets the other compile worker; cached grammars and free
        # requests need none
        new_regex = f"id-{uuid.uuid4().hex[:4]}-[0-9]{{2}}"
        new = LoadRequest("generate", {"text": "id:", "sampling_params": {
            "temperature": 0, "max_new_tokens": 32, "regex": new_regex}})
        free = [LoadRequest("generate", {"text": f"free {i}", "sampling_params": greedy}) for i in range(4)]
        others = await asyncio.gather(*(timed(client, url, r) for r in [new, cached, *free]))
        assert all(o.kind == "ok" for o, _ in others), others
        new_outcome, new_done = others[0]
        assert new_outcome.finish_reasons == ["stop"] and re.fullmatch(new_regex, new_outcome.texts[0]), new_outcome
        big_outcome, big_done = await big_task
        # answered once compiled: one token cannot hold its shortest output, a 400 saying so
        assert big_outcome.kind == "http_400" and "cannot hold the shortest output" in big_outcome.detail, big_outcome
        # order of events, not seconds: everything sent after the big compile started (a new grammar
        # on the other compile worker, a cached one, free requests) finished before it
        assert max(done for _, done in others) < big_done, "a request waited for the big grammar's compile"


def test_slow_grammar_compile_does_not_stall_others(tiny_outlines_server: ServerHandle) -> None:
    """On the outlines backend, whose token index for a wide schema takes seconds (xgrammar and
    llguidance compile it in milliseconds; all three compile in the same worker threads)."""
    asyncio.run(others_during_compile(tiny_outlines_server.url))
    assert_pool_whole(tiny_outlines_server)


def open_unread_stream(url: str, max_new_tokens: int) -> socket.socket:
    """A streaming /generate whose client never reads. Each event carries every top-20 logprob so
    far, so the server's writes back up within a few dozen tokens (the socket buffers fill)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    body = json.dumps({"text": "never read", "stream": True, "return_logprob": True, "top_logprobs_num": 20,
                       "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True}}).encode()
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def test_clients_that_never_read_do_not_stall_others(load_server: ServerHandle) -> None:
    shapes = request_shapes(6, seed=2, max_new_tokens=16)

    async def run_all() -> list[Outcome]:
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT, limits=LIMITS) as client:
            runs = (send(client, load_server.url, shape, REQUEST_TIMEOUT) for shape in shapes)
            return list(await asyncio.gather(*runs))

    want = asyncio.run(run_all())
    readers = [open_unread_stream(load_server.url, 300) for _ in range(3)]
    try:
        wait_until_running(load_server, 3)
        got = asyncio.run(run_all())
        assert [(o.kind, o.texts) for o in got] == [(o.kind, o.texts) for o in want]
    finally:
        for sock in readers:
            sock.close()
    assert_pool_whole(load_server)  # the unread requests were aborted or finished, their KV freed


def test_prompt_larger_than_the_pool_is_400(load_server: ServerHandle) -> None:
    ids = [5] * (POOL + 10)
    url = load_server.url
    for body in ({"input_ids": ids}, {"input_ids": ids, "stream": True}, {"input_ids": [[5, 6], ids]},
                 {"text": "word " * POOL}):
        resp = httpx.post(url + "/generate", json=body, timeout=60)
        assert resp.status_code == 400 and "tokens" in resp.json()["error"]["message"], resp.text
    chat = httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "word " * POOL}], "stream": True})
    assert chat.status_code == 400, chat.text
    assert server_info(load_server)["num_running_reqs"] == 0
    assert httpx.get(url + "/health", timeout=30).status_code == 200


def test_sigterm_with_a_client_that_never_reads_exits(load_server: ServerHandle) -> None:
    """The last test on load_server: it stops it. Graceful shutdown waits for in-flight requests,
    but not forever for a client that never reads."""
    unread = open_unread_stream(load_server.url, 400)
    try:
        wait_until_running(load_server, 1)
        # a hang guard: graceful shutdown gives in-flight requests SHUTDOWN_GRACE_S, then drops them
        assert load_server.stop(signal.SIGTERM, timeout=SHUTDOWN_GRACE_S + 120) == 0
    finally:
        unread.close()


def test_a_resumed_chunked_prompt_waits_for_memory(tiny_engine: Any, tiny_model_dir: Path) -> None:
    """Regression: the rest of a chunked prompt (here a retracted request resuming) was taken
    without a memory check, and the scheduler died on an assertion when the pool was short."""
    from radixlm.runtime.engine import Engine

    prompts = [f"never read {i}" for i in range(3)]
    params = {"temperature": 0, "max_new_tokens": 110, "ignore_eos": True}
    want = [r["output_ids"] for r in tiny_engine.generate(prompt=prompts, sampling_params=params)]
    small = Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=150, chunked_prefill_size=16)
    try:
        assert [r["output_ids"] for r in small.generate(prompt=prompts, sampling_params=params)] == want
        assert small.scheduler.num_retractions > 0
        assert_engine_clean(small)
    finally:
        small.shutdown()


# ------------------------------------------------------------------------------------ faults
def detokenizer_pid(server: ServerHandle, scheduler_pid: int) -> int:
    """The server's other spawned child (the resource tracker is a child too, but not spawn_main)."""
    for pid in process_children(server.proc.pid):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if pid != scheduler_pid and b"spawn_main" in cmdline:
            return pid
    raise AssertionError("no detokenizer process found")


@dataclass
class KillResult:
    outcomes: list[tuple[Outcome, float]]  # each in-flight request's outcome, seconds after the kill
    health: list[tuple[int, str]]  # /health answers after the kill, until the server was gone
    exit_code: int
    exit_seconds: float  # from the kill to the server's exit


async def kill_under_load(server: ServerHandle, victim: int) -> KillResult:
    """Stream 12 long requests (native, chat), send 2 plain ones and one stream that is never
    read, SIGKILL `victim` once they run, poll /health until the server is gone, wait for its exit."""
    url = server.url
    long = {"max_new_tokens": 400, "ignore_eos": True, "temperature": 0}
    reqs = [LoadRequest("generate", {"text": f"stream {i}", "sampling_params": long}) for i in range(6)]
    reqs += [LoadRequest("chat", {"messages": [{"role": "user", "content": f"chat {i}"}], "max_tokens": 400,
                                  "ignore_eos": True}) for i in range(6)]
    reqs += [LoadRequest("batch", {"text": [f"plain {i}"], "sampling_params": long}) for i in range(2)]
    killed_at = 0.0
    health: list[tuple[int, str]] = []
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT, limits=LIMITS) as client:

        async def run(req: LoadRequest) -> tuple[Outcome, float]:
            outcome = await send(client, url, req, REQUEST_TIMEOUT)
            return outcome, time.monotonic() - killed_at

        async def poll_health() -> None:
            async with httpx.AsyncClient(timeout=5) as poller:
                while True:
                    try:
                        resp = await poller.get(url + "/health")
                    except httpx.HTTPError:
                        return  # the server is gone
                    health.append((resp.status_code, resp.text))
                    await asyncio.sleep(0.05)

        tasks = [asyncio.ensure_future(run(r)) for r in reqs]
        unread = open_unread_stream(url, 400)  # must not keep the dying server alive
        try:
            while (await client.get(url + "/get_server_info")).json()["num_running_reqs"] < 4:
                await asyncio.sleep(0.2)
            killed_at = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            poller = asyncio.ensure_future(poll_health())
            outcomes = await asyncio.gather(*tasks)
            await asyncio.wait_for(poller, 60)
            exit_code = await asyncio.to_thread(server.proc.wait, 60)
        finally:
            unread.close()
    return KillResult(list(outcomes), health, exit_code, time.monotonic() - killed_at)


def assert_failed_fast(server: ServerHandle, result: KillResult, child: str) -> None:
    kinds = Counter(o.kind for o, _ in result.outcomes)
    assert set(kinds) == {"stream_error", "http_503"}, kinds  # SSE error events; 503 for plain requests
    assert all(child in o.detail for o, _ in result.outcomes), [o.detail for o, _ in result.outcomes]
    # (each failure is the server's own answer, an SSE error or a 503, not a client timeout)
    unhealthy = [body for status, body in result.health if status == 503]
    assert unhealthy and f"the {child} process died" in unhealthy[0], result.health
    assert result.exit_code != 0, result.exit_code
    assert f"the {child} process died" in server.log()


def test_killed_child_under_load_fails_fast_and_a_restart_serves(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    args = ("--max-total-tokens", "4096", "--random-seed", "0")
    first = start_server(tiny_model_dir, tmp_path / "first.log", *args, port=port)
    scheduler = server_info(first)["scheduler_pid"]
    result = asyncio.run(kill_under_load(first, detokenizer_pid(first, scheduler)))
    assert_failed_fast(first, result, "detokenizer")
    # a new server on the same port serves, then loses its scheduler the same way
    second = start_server(tiny_model_dir, tmp_path / "second.log", *args, port=port)
    again = {"text": "again", "sampling_params": {"max_new_tokens": 4}}
    ok = httpx.post(second.url + "/generate", json=again, timeout=60)
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 4
    result = asyncio.run(kill_under_load(second, server_info(second)["scheduler_pid"]))
    assert_failed_fast(second, result, "scheduler")
