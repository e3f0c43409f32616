"""SGLang-native endpoints through the real server (tiny random model, real processes, real HTTP)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerHandle, start_server

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


def post(server: ServerHandle, path: str, body: Any, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=timeout)


def sse_events(server: ServerHandle, body: dict[str, Any]) -> list[Any]:
    events = []
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def wait_idle(server: ServerHandle) -> dict[str, Any]:
    """After requests end: nothing running, and the pool is full once the cache is flushed."""
    deadline = time.monotonic() + 120  # a hang guard
    while time.monotonic() < deadline:
        info = httpx.get(server.url + "/get_server_info", timeout=30).json()
        if info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0:
            assert post(server, "/flush_cache", None).status_code == 200
            info = httpx.get(server.url + "/get_server_info", timeout=30).json()
            assert info["kv_pool"]["free_tokens"] == info["max_total_num_tokens"]
            return info
        time.sleep(0.1)
    raise AssertionError("requests still running after 120 s")


def test_health_and_model_info(tiny_server: ServerHandle) -> None:
    assert httpx.get(tiny_server.url + "/health").status_code == 200
    assert httpx.get(tiny_server.url + "/health_generate", timeout=60).status_code == 200
    info = httpx.get(tiny_server.url + "/get_model_info").json()
    assert info["is_generation"] is True and info["model_path"]
    a = httpx.get(tiny_server.url + "/get_server_info").json()
    b = httpx.get(tiny_server.url + "/server_info").json()
    assert a["max_total_num_tokens"] == b["max_total_num_tokens"] == 4096
    assert {"tree_tokens", "evictable_tokens", "hit_rate"} <= set(a["radix_cache"])


def test_generate_single_batch_and_ids(tiny_server: ServerHandle) -> None:
    one = post(tiny_server, "/generate", {"text": "Hello there", "sampling_params": GREEDY}).json()
    assert isinstance(one["text"], str) and len(one["output_ids"]) == 12
    meta = one["meta_info"]
    assert meta["completion_tokens"] == 12 and meta["finish_reason"] == {"type": "length", "matched": 12}
    assert meta["e2e_latency"] > 0 and meta["id"]
    again = post(tiny_server, "/generate", {"text": "Hello there", "sampling_params": GREEDY}).json()
    assert again["output_ids"] == one["output_ids"]
    assert again["meta_info"]["cached_tokens"] >= meta["prompt_tokens"] - 1
    batch = post(tiny_server, "/generate", {"text": ["Hello there", "Bye now"], "sampling_params": GREEDY}).json()
    assert isinstance(batch, list) and len(batch) == 2 and batch[0]["output_ids"] == one["output_ids"]
    ids = post(tiny_server, "/generate", {"input_ids": [[5, 6, 7], [8, 9]], "sampling_params": GREEDY}).json()
    assert [r["meta_info"]["prompt_tokens"] for r in ids] == [3, 2]
    n = post(tiny_server, "/generate", {"text": "Hello there", "sampling_params": {**GREEDY, "n": 3}}).json()
    assert len(n) == 3 and all(r["output_ids"] == one["output_ids"] for r in n)
    wait_idle(tiny_server)


def test_generate_logprobs(tiny_server: ServerHandle) -> None:
    body = {"text": "Hello there", "sampling_params": GREEDY, "return_logprob": True, "logprob_start_len": 0,
            "top_logprobs_num": 2, "return_text_in_logprobs": True}
    meta = post(tiny_server, "/generate", body).json()["meta_info"]
    assert len(meta["output_token_logprobs"]) == 12
    assert meta["input_token_logprobs"][0][0] is None and len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    lp, tok, text = meta["output_token_logprobs"][0]
    assert lp <= 0 and isinstance(tok, int) and isinstance(text, str)
    assert len(meta["output_top_logprobs"][0]) == 2


def test_generate_stream(tiny_server: ServerHandle) -> None:
    full = post(tiny_server, "/generate", {"text": "Stream me", "sampling_params": GREEDY}).json()
    events = sse_events(tiny_server, {"text": "Stream me", "sampling_params": GREEDY, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2 and chunks[-1]["text"] == full["text"]
    assert all(b["text"].startswith(a["text"]) for a, b in zip(chunks, chunks[1:]))
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    batch = sse_events(tiny_server, {"text": ["a b", "c d"], "sampling_params": GREEDY, "stream": True})
    assert {e["index"] for e in batch[:-1]} == {0, 1}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"text": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"text": "hi", "sampling_params": {"top_p": 2.0}}, "top_p"),
        ({"text": "hi", "sampling_params": {"bogus": 1}}, "bogus"),
        ({"text": "hi", "bogus_field": 1}, "bogus_field"),
        ({"input_ids": []}, "empty"),  # "" is taken: it starts from BOS (else EOS)
        ({"input_ids": [1, 10**9]}, "input_ids"),
        ({"input_ids": [1] * 600}, "context length"),
        ({}, "text"),
        ({"text": 5}, "text"),
        ({"text": "hi", "stream": "yes"}, "stream"),
        ({"text": "hi", "top_logprobs_num": -3}, "top_logprobs_num"),
    ],
)
def test_bad_requests_get_400_naming_the_problem(tiny_server: ServerHandle, body: dict[str, Any], needle: str) -> None:
    resp = post(tiny_server, "/generate", body)
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]["message"]


def test_invalid_json_is_400(tiny_server: ServerHandle) -> None:
    resp = httpx.post(tiny_server.url + "/generate", content=b"{not json", timeout=30)
    assert resp.status_code == 400 and "JSON" in resp.json()["error"]["message"]
    assert httpx.get(tiny_server.url + "/health").status_code == 200


def wait_for_log(server: ServerHandle, line: str) -> None:
    """Wait for the server to log `line` (a hang guard, not a timing assert)."""
    deadline = time.monotonic() + 120
    while line not in server.log():
        assert time.monotonic() < deadline and server.proc.poll() is None, f"the server never logged {line!r}"
        time.sleep(0.05)


def test_abort_request_and_disconnect_free_the_pool(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The scheduler is stopped (SIGSTOP) while the request and its abort reach it, so the abort
    finds the request unfinished whatever the machine's speed; it drains both messages in order."""
    server = start_server(tiny_model_dir, tmp_path / "log", "--max-total-tokens", "2048", "--log-level", "debug")
    try:
        scheduler = httpx.get(server.url + "/get_server_info", timeout=30).json()["scheduler_pid"]
        long = {"text": "Run for a while", "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}, "rid": "abort-me"}
        result: dict[str, Any] = {}

        def run() -> None:
            result["resp"] = post(server, "/generate", long).json()

        os.kill(scheduler, signal.SIGSTOP)
        try:
            thread = threading.Thread(target=run)
            thread.start()
            wait_for_log(server, "request abort-me sent to the scheduler")
            assert post(server, "/abort_request", {"rid": "abort-me"}).status_code == 200
        finally:
            os.kill(scheduler, signal.SIGCONT)
        thread.join(timeout=120)
        assert result["resp"]["meta_info"]["finish_reason"]["type"] == "abort"
        assert result["resp"]["meta_info"]["completion_tokens"] < 400
        # a streaming client that disconnects before its request finishes aborts it
        os.kill(scheduler, signal.SIGSTOP)
        try:
            with httpx.stream("POST", server.url + "/generate", json={**long, "rid": "gone", "stream": True},
                              timeout=120) as resp:
                assert resp.status_code == 200
                wait_for_log(server, "request gone sent to the scheduler")
            wait_for_log(server, "request gone aborted before it finished")
        finally:
            os.kill(scheduler, signal.SIGCONT)
        wait_idle(server)
        metrics = httpx.get(server.url + "/metrics").text
        # the disconnected stream counts as aborted (the /abort_request one ends with finish_reason abort)
        assert re.search(r"^radixlm_requests_aborted_total\{[^}]*\} 1$", metrics, re.M), metrics
    finally:
        server.stop()


def test_concurrent_clients(tiny_server: ServerHandle) -> None:
    prompts = [f"Client {i} says hello" for i in range(8)]
    want = [post(tiny_server, "/generate", {"text": p, "sampling_params": GREEDY}).json()["output_ids"] for p in prompts]
    got: dict[int, list[int]] = {}

    def run(i: int) -> None:
        got[i] = post(tiny_server, "/generate", {"text": prompts[i], "sampling_params": GREEDY}).json()["output_ids"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [got[i] for i in range(8)] == want
    wait_idle(tiny_server)


def test_metrics(tiny_server: ServerHandle) -> None:
    post(tiny_server, "/generate", {"text": "count me", "sampling_params": GREEDY})
    text = httpx.get(tiny_server.url + "/metrics").text
    for name in ("radixlm_requests_total", "radixlm_generation_tokens_total", "radixlm_cache_hit_rate",
                 "radixlm_num_running_reqs", "radixlm_kv_pool_usage", "radixlm_time_to_first_token_seconds_bucket",
                 "radixlm_inter_token_latency_seconds_count"):
        assert name in text
    assert "request rid=" in tiny_server.log()  # --log-level info: one structured line per request


def test_constrained_generate_and_bad_grammars(tiny_server: ServerHandle) -> None:
    import re

    ok = post(tiny_server, "/generate", {"text": "n:", "sampling_params": {"regex": "[0-9]{2,4}", "temperature": 1.0}})
    assert ok.status_code == 200 and re.fullmatch("[0-9]{2,4}", ok.json()["text"])
    quick = post(tiny_server, "/generate", {"text": "n:", "sampling_params": {"regex": "(unclosed"}})
    assert quick.status_code == 400 and "regex" in quick.json()["error"]["message"]
    schema = post(tiny_server, "/generate", {"text": "n:", "sampling_params": {"json_schema": "{not json"}})
    assert schema.status_code == 400 and "json_schema" in schema.json()["error"]["message"]
    # passes the door, refused once compiled (the shortest output is known then)
    late = post(tiny_server, "/generate", {"text": "n:", "sampling_params": {"regex": "[0-9]{40}", "max_new_tokens": 4}})
    assert late.status_code == 400
    assert "invalid grammar: max_new_tokens=4 cannot hold the shortest output" in late.json()["error"]["message"]
    lookbehind = post(tiny_server, "/generate", {"text": "n:", "sampling_params": {"regex": "(?<=a)b"}})
    assert lookbehind.status_code == 400 and "grammar" in lookbehind.json()["error"]["message"]
    assert httpx.get(tiny_server.url + "/health").status_code == 200


def test_oversized_body_is_refused(tiny_server: ServerHandle) -> None:
    big = b'{"text": "' + b"a" * (33 * 1024 * 1024) + b'"}'
    resp = httpx.post(tiny_server.url + "/generate", content=big, headers={"content-type": "application/json"}, timeout=60)
    assert resp.status_code == 413 and "larger than" in resp.json()["error"]["message"]
    assert httpx.get(tiny_server.url + "/health").status_code == 200
