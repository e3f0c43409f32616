"""--speculative-algorithm NGRAM with data and with tensor parallelism (tiny random model, float32):
greedy outputs equal to `tiny_server`'s (no speculation, no parallelism, same model and seed),
every request verified in steps and some drafts accepted. With --tp-size 2 both ranks run each
verify step's rows (rank 0 drafts); with --dp-size 2 each rank's scheduler drafts its own requests
(round robin sends the four requests to both)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerHandle, running_server
from test_speculative_http import generate_ok

LOOP = "one two three one two three one two three one two"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
          "additionalProperties": False}
BODIES: list[dict[str, Any]] = [
    {"text": LOOP, "sampling_params": {"temperature": 0, "max_new_tokens": 32}},
    {"text": LOOP + " three", "sampling_params": {"temperature": 0, "max_new_tokens": 20, "stop": ["three one"]}},
    {"text": '{"city": "Paris"} {"city": "Par', "sampling_params": {
        "temperature": 0, "max_new_tokens": 32, "json_schema": json.dumps(SCHEMA)}},
    {"text": "Hello", "sampling_params": {"temperature": 0, "max_new_tokens": 12}},
]
SPECULATION = ("--speculative-algorithm", "NGRAM", "--speculative-ngram-min-match-window-size", "1")


@pytest.fixture(scope="module", params=["dp", "tp"])
def parallel_spec_server(request: pytest.FixtureRequest, tiny_model_dir: Path,
                         tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    size = ("--dp-size", "2", "--load-balance-method", "round_robin") if request.param == "dp" else ("--tp-size", "2")
    with running_server(tiny_model_dir, tmp_path_factory, f"spec-{request.param}", *size, "--max-total-tokens",
                        "4096", "--random-seed", "0", "--dtype", "float32", *SPECULATION) as server:
        yield server


def test_outputs_equal_and_drafts_accepted(parallel_spec_server: ServerHandle, tiny_server: ServerHandle) -> None:
    accepted = 0
    for body in BODIES:
        on, off = generate_ok(parallel_spec_server.url, body), generate_ok(tiny_server.url, body)
        assert on["output_ids"] == off["output_ids"] and on["text"] == off["text"], body
        meta = on["meta_info"]
        assert 1 <= meta["spec_verify_ct"] <= meta["completion_tokens"]
        accepted += meta["completion_tokens"] - meta["spec_verify_ct"]
    assert accepted > 0  # the loop prompt copies itself: some steps kept more than one token
    info = httpx.get(parallel_spec_server.url + "/get_server_info", timeout=30).json()
    assert info["speculative_algorithm"] == "NGRAM"
