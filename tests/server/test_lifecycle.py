"""Server start-up, API key, graceful shutdown and a dying child process (own servers each)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from conftest import start_server


def children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def ipc_dirs() -> set[str]:
    import tempfile

    return {p.name for p in Path(tempfile.gettempdir()).glob("radixlm-ipc-*")}


def test_api_key_and_graceful_shutdown(tiny_model_dir: Path, tmp_path: Path) -> None:
    before = ipc_dirs()
    template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    server = start_server(tiny_model_dir, tmp_path / "log", "--api-key", "sekret", "--max-total-tokens", "2048",
                          "--chat-template", template)
    kids = children_of(server.proc.pid)
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
    time.sleep(0.5)
    assert not any(Path(f"/proc/{k}").exists() and "zombie" not in Path(f"/proc/{k}/status").read_text().lower()
                   for k in kids), "children outlived the server"
    assert ipc_dirs() <= before, "the socket directory was not removed"


def test_killed_scheduler_fails_requests_and_exits(tiny_model_dir: Path, tmp_path: Path) -> None:
    server = start_server(tiny_model_dir, tmp_path / "log", "--max-total-tokens", "2048")
    scheduler = httpx.get(server.url + "/get_server_info", timeout=30).json()["scheduler_pid"]
    assert scheduler in children_of(server.proc.pid)
    long = {"text": "go on", "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}}
    result: dict[str, Any] = {}

    def inflight() -> None:
        try:
            result["status"] = httpx.post(server.url + "/generate", json=long, timeout=60).status_code
        except httpx.HTTPError as e:
            result["status"] = type(e).__name__

    thread = threading.Thread(target=inflight)
    thread.start()
    time.sleep(1.0)
    os.kill(scheduler, signal.SIGKILL)
    start = time.monotonic()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the in-flight request hung"
    assert result["status"] in (503, "RemoteProtocolError", "ReadError", "ConnectError")
    code = server.proc.wait(timeout=30)
    assert code != 0 and time.monotonic() - start < 30
    assert "died" in server.log()
