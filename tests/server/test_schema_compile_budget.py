"""A large schema's compile under `--grammar-compile-memory-mb` (issue 38 point 3): over the budget
it fails only its own request, with a 400 naming the budget, and the server goes on serving
(tiny random model, a real server on 127.0.0.1 with an 8 MB budget)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ServerHandle, running_server

from radixlm.runtime.bench.hard_schema_corpus import big_schema

BUDGET_MB = 8


@pytest.fixture(scope="module")
def budget_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    with running_server(tiny_model_dir, tmp_path_factory, "budget", "--max-total-tokens", "1024",
                        "--grammar-compile-memory-mb", str(BUDGET_MB)) as server:
        yield server


def _generate(server: ServerHandle, schema: dict[str, object], max_new_tokens: int = 24) -> httpx.Response:
    return httpx.post(server.url + "/generate", timeout=600, json={
        "text": "JSON:", "sampling_params": {"json_schema": json.dumps(schema), "max_new_tokens": max_new_tokens}})


def test_a_compile_over_the_budget_fails_only_its_request(budget_server: ServerHandle) -> None:
    # 16 objects of 60 optional properties (a 105 KB schema): a 1.5 MB xgrammar grammar, which goes
    # to the capped child (>= 1 MiB) and whose compile against the 49,152-token vocabulary needs
    # ~45 MB, well over 8 MB
    big = big_schema(16).schema
    resp = _generate(budget_server, big, max_new_tokens=400)  # room for its shortest output: only the budget fails
    assert resp.status_code == 400, resp.text
    assert f"schema compile exceeded the {BUDGET_MB} MB budget" in resp.json()["error"]["message"], resp.text
    assert budget_server.proc.poll() is None
    assert httpx.get(budget_server.url + "/health", timeout=30).status_code == 200
    small = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    resp = _generate(budget_server, small)
    assert resp.status_code == 200, resp.text
    assert isinstance(json.loads(resp.json()["text"])["n"], int)
    # the same big schema again: the same refusal (the failed compile is cached with its schema)
    resp = _generate(budget_server, big, max_new_tokens=400)
    assert resp.status_code == 400 and "MB budget" in resp.text, resp.text
