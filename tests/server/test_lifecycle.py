"""Server start-up, API key, graceful shutdown and a dying child process (own servers each)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
from conftest import ipc_dirs_of, start_server, stream_while_killing
from radixlm_testing import process_alive, process_children


def test_api_key_and_graceful_shutdown(tiny_model_dir: Path, tmp_path: Path) -> None:
    template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    server = start_server(tiny_model_dir, tmp_path / "log", "--api-key", "sekret", "--max-total-tokens", "2048",
                          "--chat-template", template)
    kids = process_children(server.proc.pid)
    own = ipc_dirs_of(server.proc.pid)  # the server's socket directory (by /proc: other processes' aside)
    assert own
    assert len(kids) >= 2
    assert httpx.get(server.url + "/health").status_code == 200  # open without the key
    assert httpx.get(server.url + "/get_model_info").status_code == 401
    assert httpx.get(server.url + "/get_model_info", headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = httpx.post(server.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}},
                    headers={"Authorization": "Bearer sekret"}, timeout=60)
    assert ok.status_code == 200
    chat = httpx.post(server.url + "/v1/chat/completions", headers={"Authorization": "Bearer sekret"}, timeout=60,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    plain = httpx.post(server.url + "/generate", headers={"Authorization": "Bearer sekret"}, timeout=60,
                       json={"text": "[user]hi", "sampling_params": {"max_new_tokens": 1}})
    assert chat.json()["usage"]["prompt_tokens"] == plain.json()["meta_info"]["prompt_tokens"]  # --chat-template used
    assert server.stop(signal.SIGTERM) == 0
    # the scheduler and detokenizer were joined before the exit; helpers such as multiprocessing's
    # resource tracker end when they see their parent gone: wait for that event (a hang guard)
    deadline = time.monotonic() + 120
    while alive := [k for k in kids if process_alive(k)]:
        assert time.monotonic() < deadline, f"children outlived the server: {alive}"
        time.sleep(0.05)
    assert not [d for d in own if d.exists()], "the socket directory was not removed"


def test_killed_scheduler_fails_requests_and_exits(tiny_model_dir: Path, tmp_path: Path) -> None:
    server = start_server(tiny_model_dir, tmp_path / "log", "--max-total-tokens", "2048")
    scheduler = httpx.get(server.url + "/get_server_info", timeout=30).json()["scheduler_pid"]
    assert scheduler in process_children(server.proc.pid)
    long = {"text": "go on", "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}, "stream": True}
    # The scheduler is stopped before the request is sent, so the request cannot finish before the
    # kill whatever the machine's speed: the response has started (the server accepted and queued
    # it) and no token can come.
    os.kill(scheduler, signal.SIGSTOP)
    events = stream_while_killing(server.url, long, scheduler)
    finished = [e for e in events if isinstance(e, dict) and (e.get("meta_info") or {}).get("finish_reason")]
    assert not finished, f"the request finished although its scheduler was killed: {finished}"
    errors = [e for e in events if isinstance(e, str) or "error" in e]
    assert errors, f"the in-flight request got no error: {events}"
    if isinstance(errors[0], dict):
        assert errors[0]["error"]["code"] == 503, errors[0]
    code = server.wait_exit()
    assert code != 0
    assert "died" in server.log()

