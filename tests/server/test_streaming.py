"""Streaming as SGLang streams, at a cost that does not grow with the output or with a slow client.

Native /generate streams keep `text` cumulative while each chunk's logprob lists hold that
chunk's new entries (and `output_token_logprobs_length` the running count); the real `sglang`
frontend's own `test_stream_logprobs` runs against us. OpenAI streams carry `logprobs` per chunk.
A client that never reads holds a small, bounded amount of the server's memory, and a heavy
logprob stream sends bytes in proportion to its tokens.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import ServerHandle, start_server

HANG_GUARD_S = 300  # a bound on waiting for an event, never an assertion on speed


def stream_events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", url + "/generate", json={**body, "stream": True}, timeout=HANG_GUARD_S) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                events.append(json.loads(line[5:]))
    return events


LOGPROB_BODY = {
    "text": "The weather today",
    "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True},
    "return_logprob": True,
    "top_logprobs_num": 3,
    "return_text_in_logprobs": True,
}


def test_native_stream_sends_each_logprob_entry_once(tiny_server: ServerHandle) -> None:
    whole = httpx.post(tiny_server.url + "/generate", json=LOGPROB_BODY, timeout=HANG_GUARD_S).json()
    chunks = stream_events(tiny_server.url, LOGPROB_BODY)
    entries: list[Any] = []
    tops: list[Any] = []
    text = ""
    for chunk in chunks:
        meta = chunk["meta_info"]
        entries += meta["output_token_logprobs"]
        tops += meta["output_top_logprobs"]
        assert len(meta["output_top_logprobs"]) == len(meta["output_token_logprobs"])
        assert meta["output_token_logprobs_length"] == len(entries) == meta["completion_tokens"]
        assert chunk["text"].startswith(text)  # cumulative
        text = chunk["text"]
    assert text == whole["text"] and chunks[-1]["output_ids"] == whole["output_ids"]
    want = whole["meta_info"]["output_token_logprobs"]
    assert [e[1:] for e in entries] == [e[1:] for e in want]  # token ids and their texts
    assert [e[0] for e in entries] == pytest.approx([e[0] for e in want], abs=1e-4)
    assert [[t[1] for t in row] for row in tops] == [[t[1] for t in row] for row in whole["meta_info"]["output_top_logprobs"]]


# sglang's stream iterator (StreamExecutor's gen thread sets an event per chunk; text_async_iter,
# woken in a thread pool, reads the latest chunk's meta_info) misses a chunk whenever two arrive
# before it wakes: its test then sees one chunk's logprobs under two chunks' token count. This
# harness paces the frontend's own reader, never our server: the gen thread hands on the next
# chunk only once the iterator is back waiting with nothing unread (stream_var_event's wait()
# entered while the event is clear: a wait entered while it is set returns at once, and the
# iterator reads before it waits again). Everything else runs unchanged.
PACED_SGLANG_STREAM = """
import threading
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint
from sglang.lang.interpreter import StreamExecutor

iterator_waiting = threading.Semaphore(0)


class PacedEvent(threading.Event):
    def wait(self, timeout=None):
        iterator_waiting.release()
        return super().wait(timeout)


current = []


class PacedEvents(dict):
    def __setitem__(self, name, event):
        current.append(PacedEvent())
        super().__setitem__(name, current[-1])


def init_var_event(self, expr, _init=StreamExecutor._init_var_event):
    if self.stream and type(self.stream_var_event) is dict:
        self.stream_var_event = PacedEvents(self.stream_var_event)
    _init(self, expr)


def generate_stream(self, s, sampling_params, _generate=RuntimeEndpoint.generate_stream):
    for chunk in _generate(self, s, sampling_params):
        while True:
            if not iterator_waiting.acquire(timeout=%d):
                raise TimeoutError("the stream iterator stopped waiting for chunks")
            if not current[-1].is_set():
                break
        yield chunk


StreamExecutor._init_var_event = init_var_event
RuntimeEndpoint.generate_stream = generate_stream
"""


def test_sglang_frontend_stream_logprobs(default_server: ServerHandle, sglang_paths: tuple[Path, Path]) -> None:
    """sglang 0.5.23's own `sglang.test.test_programs.test_stream_logprobs`, unchanged, against us,
    on the real default model, its stream reader paced (PACED_SGLANG_STREAM) so that the result
    does not depend on when the frontend's threads wake."""
    program = (
        "import sys\n"
        "sys.path.insert(0, sys.argv[2]); sys.path.append(sys.argv[3])\n"
        "import sglang as sgl\n"
        + PACED_SGLANG_STREAM % HANG_GUARD_S +
        "from sglang.test.test_programs import test_stream_logprobs\n"
        "sgl.set_default_backend(RuntimeEndpoint(sys.argv[1]))\n"
        "test_stream_logprobs()\n"
        "print('passed')\n"
    )
    pkg, deps = sglang_paths
    run = subprocess.run([sys.executable, "-c", program, default_server.url, str(pkg), str(deps)],
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert run.returncode == 0 and run.stdout.strip().endswith("passed"), run.stdout[-2000:] + run.stderr[-4000:]


def test_our_runtime_endpoint_joins_streamed_logprobs(tiny_server: ServerHandle) -> None:
    import radixlm as rl

    @rl.function
    def answer(s: Any) -> None:
        s += "Question: why?\nAnswer:" + rl.gen("a", max_tokens=12, temperature=0, return_logprob=True, ignore_eos=True)

    backend = rl.RuntimeEndpoint(tiny_server.url)
    try:
        streamed = answer.run(backend=backend, stream=True)
        text = "".join(streamed.text_iter("a"))
        meta = streamed.get_meta_info("a")
        whole = answer.run(backend=backend)
    finally:
        backend.shutdown()
    assert text == whole["a"]
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] == 12
    assert [e[1] for e in meta["output_token_logprobs"]] == [e[1] for e in whole.get_meta_info("a")["output_token_logprobs"]]


def test_openai_streams_carry_logprobs(tiny_server: ServerHandle) -> None:
    client = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="none")
    common: dict[str, Any] = {"model": "default", "max_tokens": 10, "temperature": 0, "extra_body": {"ignore_eos": True}}
    messages = [{"role": "user", "content": "Say something"}]
    whole_chat = client.chat.completions.create(messages=messages, logprobs=True, top_logprobs=2, **common)
    streamed_chat = []
    for chunk in client.chat.completions.create(messages=messages, logprobs=True, top_logprobs=2, stream=True, **common):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed_chat += chunk.choices[0].logprobs.content or []
    want = whole_chat.choices[0].logprobs.content
    assert len(want) == 10
    assert [e.token for e in streamed_chat] == [e.token for e in want]
    assert [e.logprob for e in streamed_chat] == pytest.approx([e.logprob for e in want], abs=1e-4)
    assert all(len(e.top_logprobs) == 2 for e in streamed_chat)

    whole = client.completions.create(prompt="Count: one", logprobs=2, **common)
    tokens: list[str] = []
    offsets: list[int] = []
    for chunk in client.completions.create(prompt="Count: one", logprobs=2, stream=True, **common):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens or []
            offsets += chunk.choices[0].logprobs.text_offset or []
    assert tokens == whole.choices[0].logprobs.tokens and len(tokens) == 10
    assert offsets == whole.choices[0].logprobs.text_offset  # offsets run on across chunks


# ------------------------------------------------------------------ slow and hostile clients
LONG_POSITIONS = 4_608  # a 1,000-token prompt + 300 tokens, and a 4,000-token stream, fit


@pytest.fixture(scope="module")
def long_server(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[ServerHandle]:
    """The tiny model with a 4,608-position context behind a real server (debug log: the tests
    wait for its request lines)."""
    from radixlm_testing import save_tiny_model

    path = tmp_path_factory.mktemp("tiny-long")
    save_tiny_model(path, "llama", vocab_size=49152, tokenizer_dir=default_model_dir,
                    max_position_embeddings=LONG_POSITIONS)
    log = tmp_path_factory.mktemp("server") / "long.log"
    server = start_server(path, log, "--max-total-tokens", "16384", "--random-seed", "0", "--log-level", "debug")
    yield server
    server.stop()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not predicate():
        assert time.monotonic() < deadline, f"hang guard: {what}"
        time.sleep(0.05)


def scheduler_idle(url: str) -> bool:
    info = httpx.get(url + "/get_server_info", timeout=HANG_GUARD_S).json()
    return info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0


def never_reader_body(rid: str) -> dict[str, Any]:
    return {
        "input_ids": [(7 * i) % 40_000 + 100 for i in range(1_000)],
        "sampling_params": {"max_new_tokens": 300, "temperature": 0, "ignore_eos": True},
        "return_logprob": True, "top_logprobs_num": 50, "return_text_in_logprobs": True,
        "stream": True, "rid": rid,
    }


def open_stream(url: str, body: dict[str, Any]) -> socket.socket:
    """Send a streaming /generate over a raw socket (HTTP/1.0: no chunked encoding, closed after
    the stream) with a small receive buffer, reading nothing yet."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    payload = json.dumps(body).encode()
    sock.sendall(b"POST /generate HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    return sock


def test_clients_that_never_read_hold_little_memory(long_server: ServerHandle) -> None:
    """Three streaming clients send a request and read nothing of the answer. Once the scheduler
    has produced all of it, the main process is within 100 MB of where it started (it grew by
    ~1.2 GB per such client when every update queued a full snapshot)."""
    url = long_server.url
    stream_events(url, {**never_reader_body("warm-up"), "rid": None})  # warm every path once, read fully
    before = rss_mb(long_server.proc.pid)
    sockets = []
    try:
        for k in range(3):
            sockets.append(open_stream(url, never_reader_body(f"never-reader-{k}")))
        for k in range(3):  # the request reached the scheduler: later info replies count it
            wait_for(lambda k=k: f"request never-reader-{k} sent to the scheduler" in long_server.log(), "request sent")
        wait_for(lambda: scheduler_idle(url), "the scheduler finishing the never-read requests")
        grown = rss_mb(long_server.proc.pid) - before
        assert grown < 100, f"the main process grew by {grown:.0f} MB for three clients that never read"
    finally:
        for sock in sockets:
            sock.close()
    for k in range(3):  # once their connections close, the tokenizer manager lets them go
        wait_for(lambda k=k: f"rid=never-reader-{k} " in long_server.log()
                 or f"request never-reader-{k} aborted" in long_server.log(), "the never-read request ending")
    assert httpx.get(url + "/health", timeout=HANG_GUARD_S).status_code == 200


def test_a_reader_that_falls_behind_gets_the_whole_stream(long_server: ServerHandle) -> None:
    """A client reads nothing until the scheduler has produced all 2,000 tokens (~30 MB of
    stream: the server's buffers fill and it waits on the client with deltas pending), then
    reads: every token's logprob entry arrives once, the last chunk carries the finish reason,
    then [DONE]."""
    body = {"input_ids": list(range(600, 620)), "rid": "slow-reader", "stream": True,
            "sampling_params": {"max_new_tokens": 2_000, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 100}
    sock = open_stream(long_server.url, body)
    try:
        wait_for(lambda: "request slow-reader sent to the scheduler" in long_server.log(), "request sent")
        wait_for(lambda: scheduler_idle(long_server.url), "the scheduler finishing the request")
        sock.settimeout(HANG_GUARD_S)
        received = b"".join(iter(lambda: sock.recv(1 << 16), b""))
    finally:
        sock.close()
    events = [line[5:].strip() for line in received.decode().split("\r\n\r\n", 1)[1].split("\n")
              if line.startswith("data:")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert chunks[-1]["meta_info"]["completion_tokens"] == len(chunks[-1]["output_ids"]) == 2_000
    assert sum(len(c["meta_info"]["output_token_logprobs"]) for c in chunks) == 2_000


def test_heavy_logprob_stream_sends_bytes_in_proportion_to_its_tokens(long_server: ServerHandle) -> None:
    """200 tokens with 100 top logprobs each and their texts: each entry is sent once (~40 bytes),
    so a few MB in all (the cumulative lists made it 120 MB)."""
    body = {"input_ids": list(range(500, 520)),
            "sampling_params": {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 100, "return_text_in_logprobs": True, "stream": True}
    num_bytes = 0
    last: dict[str, Any] = {}
    with httpx.stream("POST", long_server.url + "/generate", json=body, timeout=HANG_GUARD_S) as response:
        for line in response.iter_lines():
            num_bytes += len(line) + 2
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                last = json.loads(line[5:])
    assert last["meta_info"]["output_token_logprobs_length"] == 200
    per_token = num_bytes / 200
    # 101 entries of at most ~60 bytes, plus the cumulative text and ids of one chunk per token
    assert per_token < 101 * 60 + 4_000, f"{num_bytes} bytes for 200 tokens ({per_token:.0f} per token)"


def test_stream_interval_sends_the_first_token_then_every_interval_and_counts_each_token(
        tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """--stream-interval 4: a stream's chunks come at 1, 5, 9 ... tokens and at its end. A reader
    behind the server gets some of them merged (the first with the next, say), never split, so
    only the set of counts is asserted here; the exact messages, the first token's included, are
    tests/runtime/test_output_stream.py's. The text equals the unstreamed result; /metrics counts
    an inter-token gap per token, not per chunk."""
    from conftest import running_server

    body = {"text": "Count with me:", "sampling_params": {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}}
    with running_server(tiny_model_dir, tmp_path_factory, "stream-interval", "--stream-interval", "4",
                        "--max-total-tokens", "2048") as server:
        events = stream_events(server.url, body)
        counts = [e["meta_info"]["completion_tokens"] for e in events]
        assert counts == sorted(set(counts)) and counts[-1] == 10, counts
        assert set(counts) <= {1, 5, 9, 10}, counts  # at interval 1 a chunk per token: 2, 3, 4 ... too
        whole = httpx.post(server.url + "/generate", json=body, timeout=HANG_GUARD_S).json()
        assert events[-1]["text"] == whole["text"]
        metrics = httpx.get(server.url + "/metrics", timeout=HANG_GUARD_S).text.splitlines()
        itl_count = next(line for line in metrics if line.startswith("radixlm_inter_token_latency_seconds_count"))
        assert float(itl_count.rsplit(" ", 1)[1]) == 2 * 9  # two requests, 9 gaps each
