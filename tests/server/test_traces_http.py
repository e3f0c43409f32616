"""POST /traces and GET /traces through the real server (tiny model): a traced program's calls,
sent by `RuntimeEndpoint.send_trace`, come back with their cache hits; the body is validated
(entries per request, string lengths, unknown fields) and the server keeps a bounded ring."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import ServerHandle

import radixlm as rl
from radixlm.backend.runtime_endpoint import TRACE_CALLS_PER_POST
from radixlm.runtime.config.limits import MAX_TRACE_CALLS_PER_POST, TRACE_CALLS_KEPT


def call(index: int, **fields: Any) -> dict[str, Any]:
    return {"program": "p", "run_id": "r", "branch": "", "index": index, "primitive": "gen", "name": "x",
            "prompt_tokens": 10, "cached_tokens": 4, "completion_tokens": 2, "latency_s": 0.5,
            "started_at": 1.7e9 + index, **fields}


def post(url: str, entries: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(f"{url}/traces", json={"entries": entries}, timeout=60)


def newest(url: str, count: int) -> list[dict[str, Any]]:
    resp = httpx.get(f"{url}/traces", params={"max_entries": count}, timeout=60)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["entries"])


def test_a_traced_program_sends_its_calls_with_their_cache_hits(tiny_server: ServerHandle) -> None:
    assert TRACE_CALLS_PER_POST == MAX_TRACE_CALLS_PER_POST  # the language sends what the server takes
    endpoint = rl.RuntimeEndpoint(tiny_server.url)

    @rl.function
    def two_answers(s: Any) -> None:
        s += "A long shared preamble that both questions read first. " * 4
        s += "Q1:" + rl.gen("a1", max_tokens=3, temperature=0)
        s += "Q2:" + rl.gen("a2", max_tokens=3, temperature=0)

    state = two_answers.run(backend=endpoint, trace=True)
    trace = state.trace()
    assert endpoint.send_trace(trace) == len(trace) == 2
    sent = [e for e in newest(tiny_server.url, 50) if e["run_id"] == trace[0].run_id]
    assert [(e["primitive"], e["name"]) for e in sent] == [("gen", "a1"), ("gen", "a2")]
    assert sent[1]["cached_tokens"] >= sent[0]["prompt_tokens"]  # the second call read the first's prefix
    assert sent[0]["program"] == "two_answers" and all(e["latency_s"] > 0 for e in sent)


@pytest.mark.parametrize("entries, says", [
    ([call(i) for i in range(MAX_TRACE_CALLS_PER_POST + 1)], "entries"),
    ([call(0, program="p" * 257)], "entries[0].program"),
    ([call(0, sent={"prompt": "hi"})], "unknown field(s) in entries[0]: ['sent']"),
    ([call(0, primitive="fork")], "entries[0].primitive"),
    ([call(0, latency_s=-1)], "entries[0].latency_s"),
])
def test_a_bad_body_is_a_400_naming_the_field(tiny_server: ServerHandle, entries: list[dict[str, Any]], says: str) -> None:
    resp = post(tiny_server.url, entries)
    assert resp.status_code == 400 and resp.json()["error"]["message"].startswith(says), resp.text


def test_the_server_keeps_only_the_newest_entries(tiny_server: ServerHandle) -> None:
    url = tiny_server.url
    total = (TRACE_CALLS_KEPT // MAX_TRACE_CALLS_PER_POST + 1) * MAX_TRACE_CALLS_PER_POST  # more than kept
    for start in range(0, total, MAX_TRACE_CALLS_PER_POST):
        resp = post(url, [call(i, run_id="ring") for i in range(start, start + MAX_TRACE_CALLS_PER_POST)])
        assert resp.status_code == 200, resp.text
    assert resp.json() == {"accepted": MAX_TRACE_CALLS_PER_POST, "kept": TRACE_CALLS_KEPT}
    kept = newest(url, TRACE_CALLS_KEPT)
    assert [e["index"] for e in kept] == list(range(total - TRACE_CALLS_KEPT, total))
    assert [e["index"] for e in newest(url, 3)] == [total - 3, total - 2, total - 1]
    for bad in ("0", str(TRACE_CALLS_KEPT + 1)):
        assert httpx.get(f"{url}/traces", params={"max_entries": bad}, timeout=60).status_code == 400
