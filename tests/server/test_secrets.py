"""No secret leaves the server: the API key's text appears in no response of any route (with and
without the key, good and bad bodies, SSE streams, error bodies, /metrics, server info) and in
no line of the server's log at debug level."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerHandle, running_server

KEY = "sk-radixlm-SECRET-7f3a9c1e"
AUTH = {"Authorization": f"Bearer {KEY}"}
GOOD_BODIES: dict[str, list[Any]] = {
    "/generate": [{"text": "hi", "sampling_params": {"max_new_tokens": 2}},
                  {"text": "hi", "stream": True, "return_logprob": True, "top_logprobs_num": 2,
                   "sampling_params": {"max_new_tokens": 3}}],
    "/v1/completions": [{"prompt": "hi", "max_tokens": 2}, {"prompt": "hi", "max_tokens": 2, "stream": True}],
    "/v1/chat/completions": [{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                             {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}],
    "/abort_request": [{"rid": "nothing-here"}],
    "/separate_reasoning": [{"text": "r</think>a", "reasoning_parser": "deepseek-r1"}],
    "/flush_cache": [None],
}
# bad bodies (the key itself is only ever sent as a header: a client's own text may come back)
BAD_BODIES: list[Any] = [{"text": "hi", "sampling_params": {"bogus": 1}}, {"bogus_field": 1}, "text", [1, 2]]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    with running_server(tiny_model_dir, tmp_path_factory, "secrets", "--api-key", KEY, "--log-level", "debug",
                        "--max-total-tokens", "2048") as handle:
        yield handle


def routes(server: ServerHandle) -> dict[str, set[str]]:
    """Every route the app serves, from its own OpenAPI document: path -> methods."""
    spec = httpx.get(server.url + "/openapi.json", headers=AUTH, timeout=30).json()
    return {path: {m.upper() for m in ops} for path, ops in spec["paths"].items()}


def test_every_route_answers_without_the_key_in_it(server: ServerHandle) -> None:
    found = routes(server)
    assert {"/generate", "/v1/chat/completions", "/get_server_info", "/metrics", "/health"} <= set(found)
    texts: list[str] = []
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for path, methods in found.items():
            for headers in (AUTH, {}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                for method in methods:
                    bodies = GOOD_BODIES.get(path, [None]) + BAD_BODIES if method == "POST" else [None]
                    for body in bodies:
                        resp = client.request(method, path, json=body, headers=headers)
                        texts.append(f"{method} {path} {resp.status_code} {dict(resp.headers)} {resp.text}")
        for path in ("/docs", "/redoc", "/openapi.json", "/nonexistent"):
            texts.append(client.get(path, headers=AUTH).text)
    assert sum(f" {path} 200 " in t for t in texts for path in found) >= len(found), "some route never answered"
    leaks = [t[:300] for t in texts if KEY in t]
    assert not leaks, leaks


def test_server_info_shows_that_a_key_is_set_not_the_key(server: ServerHandle) -> None:
    for path in ("/get_server_info", "/server_info"):
        info = httpx.get(server.url + path, headers=AUTH, timeout=30).json()
        assert info["has_api_key"] is True and "api_key" not in info
        assert KEY not in str(info)


def test_the_log_never_holds_the_key(server: ServerHandle) -> None:
    # after the requests above (the module's server is shared): the whole debug log
    test_every_route_answers_without_the_key_in_it(server)
    assert server.stop(signal.SIGTERM) == 0
    log = server.log()
    assert "sent to the scheduler" in log, "the debug log is not being written"
    assert KEY not in log, [line for line in log.splitlines() if KEY in line][:5]
