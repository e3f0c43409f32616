"""`radixlm serve --tp-size 2` (tiny model, 4 query / 2 KV heads): the same greedy outputs as tp 1
on the native, streaming and both OpenAI routes; /server_info names the ranks; rank 1's process
ends with the server; a size the model's heads do not divide stops the start with a clear message."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ServerHandle, start_server, stream_while_killing
from radixlm_testing import process_alive, wait_until
from test_data_parallel import greedy_outputs

GREEDY = {"max_new_tokens": 16, "temperature": 0}


@pytest.fixture(scope="module")
def tp_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("tp") / "server.log", "--tp-size", "2",
                          "--max-total-tokens", "4096", "--random-seed", "0", "--dtype", "float32")  # as tiny_server
    yield server
    server.stop()


def test_same_greedy_outputs_as_tp1(tp_server: ServerHandle, tiny_server: ServerHandle, tiny_model_name: str) -> None:
    assert greedy_outputs(tp_server.url, tiny_model_name, 16) == greedy_outputs(tiny_server.url, tiny_model_name, 16)


def test_ranks_reported_and_rank_1_ends_with_the_server(tiny_model_dir: Path,
                                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("tp-stop") / "server.log", "--tp-size", "2",
                          "--max-total-tokens", "2048")
    try:
        info = httpx.get(server.url + "/server_info", timeout=30).json()
        assert info["tp_size"] == 2 and info["dp_size"] == 1
        [rank1] = info["tp_worker_pids"]
        assert rank1 not in (info["scheduler_pid"], server.proc.pid)
        out = httpx.post(server.url + "/generate", json={"text": "Hello", "sampling_params": GREEDY}, timeout=60)
        assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 16
    finally:
        server.stop(signal.SIGTERM)
    wait_until(lambda: not process_alive(rank1), "tensor-parallel rank 1 to exit with the server")


def test_tp_size_the_heads_do_not_divide_is_refused(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    log = tmp_path_factory.mktemp("tp-bad") / "server.log"
    with pytest.raises(RuntimeError, match=r"--tp-size 3 does not divide this model's KV heads \(2\) and query heads "
                                           r"\(4\) and MLP intermediate size \(128\).*tp sizes that fit this model: 1, 2"):
        start_server(tiny_model_dir, log, "--tp-size", "3")


def test_a_dead_rank_stops_the_server_with_503(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rank 1 is stopped (SIGSTOP) before the request is sent, so the request cannot finish
    whatever the machine's speed, then killed once the response has started: rank 0, waiting
    for its sums, sees it gone; the request ends in an error and the server exits non-zero, as
    when any of its processes dies."""
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("tp-kill") / "server.log", "--tp-size", "2",
                          "--max-total-tokens", "2048")
    try:
        [rank1] = httpx.get(server.url + "/server_info", timeout=30).json()["tp_worker_pids"]
        os.kill(rank1, signal.SIGSTOP)
        body = {"text": "go on", "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}, "stream": True}
        events = stream_while_killing(server.url, body, rank1)
        errors = [e for e in events if isinstance(e, str) or "error" in e]
        assert errors, events
        if isinstance(errors[0], dict):
            assert errors[0]["error"]["code"] == 503, errors[0]
        assert server.wait_exit() != 0
        assert "tensor-parallel rank 1 exited" in server.log()
    finally:
        server.stop(signal.SIGKILL)
