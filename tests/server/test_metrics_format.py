"""/metrics is valid Prometheus text whatever the served model's name (prometheus_client's own
parser reads it back), and a client that leaves mid-body costs one INFO log line, not a traceback."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerHandle, start_server
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from radixlm_testing import wait_until

from radixlm.runtime.server.metrics import Metrics

HOSTILE_NAME = 'we"ird\\name\nx'  # a double quote, a backslash and a newline
GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
DISCONNECT_LINE = "client disconnected before sending the whole request body"
SERVER_INFO = {
    "num_running_reqs": 1, "num_waiting_reqs": 2, "num_retractions": 3, "max_total_num_tokens": 4096,
    "kv_pool": {"free_tokens": 4000},
    "radix_cache": {"hit_rate": 0.5, "tree_tokens": 64, "num_evicted_tokens": 7},
}


def samples_by_family(text: str) -> dict[str, list[Sample]]:
    """Parse with prometheus_client; a family name seen twice is a failure (the format forbids it)."""
    families: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in families, f"family {family.name} appears twice:\n{text}"
        families[family.name] = list(family.samples)
    return families


def assert_labels(families: dict[str, list[Sample]], model_name: str) -> None:
    """Every sample carries model_name (exactly the served name) and nothing else, but `le` on buckets."""
    for name, samples in families.items():
        assert samples, name
        for sample in samples:
            assert sample.labels.get("model_name") == model_name, sample
            extra = set(sample.labels) - {"model_name"}
            assert extra == ({"le"} if sample.name.endswith("_bucket") else set()), sample


@pytest.mark.parametrize("info", [None, SERVER_INFO], ids=["dead-scheduler", "with-gauges"])
def test_render_parses_with_hostile_name(info: dict[str, Any] | None) -> None:
    metrics = Metrics(HOSTILE_NAME)
    metrics.on_first_token(0.03)
    metrics.on_token(0.02)
    families = samples_by_family(metrics.render(info))
    assert_labels(families, HOSTILE_NAME)
    assert ("radixlm_radix_cache_tokens" in families) == (info is not None)
    assert families["radixlm_cached_tokens"][0].name == "radixlm_cached_tokens_total"  # the counter keeps its name
    for name in ("radixlm_time_to_first_token_seconds", "radixlm_inter_token_latency_seconds"):
        assert {s.name for s in families[name]} == {f"{name}_bucket", f"{name}_sum", f"{name}_count"}


@given(st.text())
def test_any_model_name_round_trips(name: str) -> None:
    assert_labels(samples_by_family(Metrics(name).render(SERVER_INFO)), name)


def test_help_text_is_escaped() -> None:
    from radixlm.runtime.server.metrics import escape_help

    assert escape_help("a\\b\nc") == "a\\\\b\\nc"


@pytest.fixture(scope="module")
def hostile_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    log = tmp_path_factory.mktemp("server") / "hostile.log"
    server = start_server(tiny_model_dir, log, "--max-total-tokens", "4096", "--random-seed", "0",
                          "--served-model-name", HOSTILE_NAME)
    yield server
    server.stop()


def test_metrics_parse_through_the_server(hostile_server: ServerHandle) -> None:
    url = hostile_server.url
    for text in ("count me", "count me too"):
        assert httpx.post(url + "/generate", json={"text": text, "sampling_params": GREEDY}, timeout=120).status_code == 200
    done = httpx.post(url + "/v1/completions", json={"model": HOSTILE_NAME, "prompt": "hi", "max_tokens": 2},
                      timeout=120)
    assert done.status_code == 200, done.text
    families = samples_by_family(httpx.get(url + "/metrics", timeout=30).text)
    assert_labels(families, HOSTILE_NAME)
    assert families["radixlm_requests"][0].value == 3
    for name in ("radixlm_cached_tokens", "radixlm_radix_cache_tokens", "radixlm_kv_pool_usage",
                 "radixlm_time_to_first_token_seconds", "radixlm_inter_token_latency_seconds"):
        assert name in families, sorted(families)
    ttft_count = next(s for s in families["radixlm_time_to_first_token_seconds"] if s.name.endswith("_count"))
    assert ttft_count.value == 3


def test_client_gone_mid_body_logs_one_info_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    server = start_server(tiny_model_dir, tmp_path / "log", "--max-total-tokens", "2048", "--log-level", "info")
    try:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n" + b'{"text": "')
        wait_until(lambda: DISCONNECT_LINE in server.log() or server.proc.poll() is not None, "the disconnect logged")
        assert server.proc.poll() is None, server.log()
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    finally:
        server.stop()  # the request's task has ended: whatever it logs is in the file now
    log = server.log()
    lines = [line for line in log.splitlines() if DISCONNECT_LINE in line]
    assert len(lines) == 1 and " INFO " in lines[0], log
    assert "Traceback" not in log and "ClientDisconnect" not in log and not re.search(r"\bERROR\b", log), log
