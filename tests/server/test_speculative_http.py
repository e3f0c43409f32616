"""--speculative-algorithm NGRAM behind the real server (tiny random model): /generate and a
tool call through the official `openai` client give what `tiny_server` (no speculation, same
model and seed) gives, with SGLang's speculative counters in meta_info and /get_server_info."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import ServerHandle, running_server

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
           "additionalProperties": False}
TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


@pytest.fixture(scope="module")
def spec_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    with running_server(tiny_model_dir, tmp_path_factory, "spec", "--max-total-tokens", "4096", "--random-seed", "0",
                        "--dtype", "float32", "--speculative-algorithm", "NGRAM",
                        "--speculative-ngram-min-match-window-size", "1") as server:
        yield server


def generate_ok(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST /generate with `body`; the JSON response, which must be a 200."""
    resp = httpx.post(url + "/generate", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def test_native_and_openai_outputs_equal_with_speculation(spec_server: ServerHandle, tiny_server: ServerHandle) -> None:
    loop = "one two three one two three one two three one two"
    bodies = [
        {"text": loop, "sampling_params": {"temperature": 0, "max_new_tokens": 32}},
        {"text": loop, "sampling_params": {"temperature": 0, "max_new_tokens": 24, "stop": ["three one"]}},
        {"text": '{"city": "Paris"} {"city": "Par', "sampling_params": {
            "temperature": 0, "max_new_tokens": 32, "json_schema": json.dumps(WEATHER)}},
    ]
    for body in bodies:
        on, off = generate_ok(spec_server.url, body), generate_ok(tiny_server.url, body)
        assert on["output_ids"] == off["output_ids"] and on["text"] == off["text"]
        meta = on["meta_info"]
        assert 1 <= meta["spec_verify_ct"] <= meta["completion_tokens"]
        assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
        if "json_schema" not in body["sampling_params"]:  # by default only constrained requests draft
            assert "spec_verify_ct" not in off["meta_info"]
    info = httpx.get(spec_server.url + "/get_server_info", timeout=30).json()
    assert info["speculative_algorithm"] == "NGRAM" and info["avg_spec_accept_length"] > 1
    assert info["spec_num_correct_drafts"] > 0

    def call(url: str) -> Any:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        model = client.models.list().data[0].id
        return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                              tools=TOOLS, tool_choice="required", temperature=0, max_tokens=48)

    on_call, off_call = call(spec_server.url), call(tiny_server.url)
    on_tool, off_tool = on_call.choices[0].message.tool_calls[0], off_call.choices[0].message.tool_calls[0]
    assert on_tool.function.name == off_tool.function.name == "get_weather"
    assert on_tool.function.arguments == off_tool.function.arguments
    assert set(json.loads(on_tool.function.arguments)) == {"city"}


def test_a_program_gets_speculation_without_a_change(spec_server: ServerHandle, tiny_server: ServerHandle) -> None:
    """The language through RuntimeEndpoint: the same `@function` (a free gen, then one with
    a JSON schema) against both servers gives the same text; the speculative server verified drafts."""
    import radixlm as rl

    @rl.function
    def extract(s: Any) -> None:
        s += "one two three one two three one two three " + rl.gen("loop", max_tokens=16, temperature=0)
        s += '\n{"city": "Paris"} ' + rl.gen("city", max_tokens=24, temperature=0, json_schema=json.dumps(WEATHER))

    on = extract.run(backend=rl.RuntimeEndpoint(spec_server.url))
    off = extract.run(backend=rl.RuntimeEndpoint(tiny_server.url))
    assert on.text() == off.text() and json.loads(on["city"]).keys() == {"city"}
    for name in ("loop", "city"):
        meta = on.get_meta_info(name)
        assert 1 <= meta["spec_verify_ct"] <= meta["completion_tokens"]
    # the default server drafts for the constrained gen only
    assert "spec_verify_ct" not in off.get_meta_info("loop") and off.get_meta_info("city")["spec_verify_ct"] >= 1


def test_standalone_through_the_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                                       tiny_server: ServerHandle) -> None:
    """`radixlm serve --speculative-algorithm STANDALONE --speculative-draft-model-path P` (the
    target as its own draft): /generate gives tiny_server's tokens, every drafted token kept."""
    with running_server(tiny_model_dir, tmp_path_factory, "standalone", "--max-total-tokens", "4096", "--random-seed",
                        "0", "--dtype", "float32", "--speculative-algorithm", "STANDALONE",
                        "--speculative-draft-model-path", str(tiny_model_dir)) as server:
        body = {"text": "one two three one two", "sampling_params": {"temperature": 0, "max_new_tokens": 24}}
        on, off = generate_ok(server.url, body), generate_ok(tiny_server.url, body)
        assert on["output_ids"] == off["output_ids"]
        meta = on["meta_info"]
        assert meta["spec_num_proposed_drafts"] > 0 and meta["spec_num_correct_drafts"] == meta["spec_num_proposed_drafts"]
        info = httpx.get(server.url + "/get_server_info", timeout=30).json()
        assert info["speculative_algorithm"] == "STANDALONE" and info["avg_spec_accept_length"] > 1
