"""The language over HTTP: RuntimeEndpoint against the real server on the tiny model. Prefix
reuse is checked with the server's numbers (cached_tokens, radix cache statistics)."""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
import jsonschema
import pytest
from conftest import ServerHandle, free_port

import radixlm as rl
from radixlm.backend.base import BackendError


@pytest.fixture(scope="module")
def endpoint(tiny_server: ServerHandle) -> rl.RuntimeEndpoint:
    return rl.RuntimeEndpoint(tiny_server.url)


def native_greedy(url: str, prompt: str, max_new_tokens: int) -> str:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    return httpx.post(url + "/generate", json=body, timeout=120).json()["text"]


def test_roles_use_the_chat_template_the_server_publishes(endpoint: rl.RuntimeEndpoint, tiny_server: ServerHandle) -> None:
    template = endpoint.chat_template
    assert template.roles["user"] == ("<|im_start|>user\n", "<|im_end|>\n")
    assert "SmolLM" in template.prefix("user", True)  # the model's default system prompt

    @rl.function
    def chat(s: Any) -> None:
        s += rl.user("Hi there")
        s += rl.assistant(rl.gen("reply", max_tokens=8, temperature=0))

    state = chat.run(backend=endpoint)
    prompt = state.text()[: -len(state["reply"] + "<|im_end|>\n")]
    assert prompt.startswith(template.prefix("user", True) + "Hi there<|im_end|>\n<|im_start|>assistant\n")
    assert state["reply"] == native_greedy(tiny_server.url, prompt, 8)


def test_select_and_fork_reuse_the_prefix(endpoint: rl.RuntimeEndpoint, tiny_server: ServerHandle) -> None:
    assert rl.flush_cache(endpoint)
    stem = "A long shared context that several requests will reuse from the cache. " * 3

    @rl.function
    def program(s: Any) -> None:
        s += stem + "Pick:" + rl.select("pick", ["one", "two", "three"])
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f" Branch {i}:" + rl.gen("b", max_tokens=4, temperature=0)
        forks.join()

    before = rl.get_server_info(endpoint)["radix_cache"]
    state = program.run(backend=endpoint)
    select_meta = state.get_meta_info("pick")
    assert state["pick"] in ("one", "two", "three")
    stem_tokens = select_meta["prompt_tokens"] - 4  # "Pick:" + the choice are a few tokens
    assert select_meta["cached_tokens"] >= stem_tokens - 2  # each choice reused the cached prompt
    branches = state["b"]
    assert len(branches) == 2
    for i, text in enumerate(branches):
        assert text == native_greedy(tiny_server.url, stem + "Pick:" + state["pick"] + f" Branch {i}:", 4)
    after = rl.get_server_info(endpoint)["radix_cache"]
    assert after["hit_rate"] > before.get("hit_rate", 0.0) or after["hit_rate"] > 0.5


def test_run_batch_over_http(endpoint: rl.RuntimeEndpoint) -> None:
    assert rl.flush_cache(endpoint)
    shared = "System: answer with one word about the capital cities of Europe. " * 3
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}

    @rl.function
    def ask(s: Any, question: str) -> None:
        if not question:
            raise ValueError("empty question")
        s += shared + "Q: " + question + "\nA:" + rl.gen("a", max_tokens=4, temperature=0)
        s += "\nJSON:" + rl.gen("j", json_schema=schema, max_tokens=24)

    questions = ["France?", "", "Spain?", "Italy?", "Greece?"]
    states = ask.run_batch([{"question": q} for q in questions], backend=endpoint, num_threads=3)
    assert isinstance(states[1].error(), ValueError)
    for i in (0, 2, 3, 4):
        assert states[i].error() is None
        jsonschema.validate(json.loads(states[i]["j"]), schema)
        assert states[i].get_meta_info("a")["cached_tokens"] > 30  # the shared part was cached up front


def test_streaming_and_tool_calls_over_http(endpoint: rl.RuntimeEndpoint) -> None:
    def convert(value: int, unit: Literal["km", "mi"]) -> str:
        """Convert a distance."""
        return f"{value * 1.609 if unit == 'mi' else value / 1.609:.1f}"

    @rl.function
    def agent(s: Any) -> None:
        s += rl.user("How far is 10 miles in km?")
        s += rl.assistant(rl.gen("call", tools=[convert], tool_choice="required", max_tokens=48, temperature=0))
        s.run_tool("call")
        s += rl.assistant(rl.gen("answer", max_tokens=6, temperature=0))

    plain = agent.run(backend=endpoint)
    call = plain["call"]
    assert isinstance(call, rl.ToolCall) and call.name == "convert" and call.arguments["unit"] in ("km", "mi")
    assert [m["role"] for m in plain.messages()] == ["user", "assistant", "tool", "assistant"]
    streamed = agent.run(backend=endpoint, stream=True)
    assert "".join(streamed.text_iter()) == plain.text()


def test_bad_requests_and_a_down_server_give_clear_errors(endpoint: rl.RuntimeEndpoint) -> None:
    @rl.function
    def bad(s: Any) -> None:
        s += "x" + rl.gen("a", regex="(unclosed", max_tokens=4)

    with pytest.raises(BackendError, match=r"answered 400: .*regex"):
        bad.run(backend=endpoint)
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BackendError, match=f"cannot reach the server at {url}"):
        rl.RuntimeEndpoint(url)


def test_runtime_starts_and_stops_its_own_server(tiny_model_dir: Any, tmp_path: Any) -> None:
    @rl.function
    def hello(s: Any) -> None:
        s += "Hello" + rl.gen("x", max_tokens=3, temperature=0)

    with rl.Runtime(str(tiny_model_dir), max_total_tokens=2048, random_seed=0, enable_metrics=False) as runtime:
        state = hello.run(backend=runtime)
        assert state["x"] == native_greedy(runtime.base_url, "Hello", 3)
        process = runtime.process
    assert process.poll() is not None  # stopped with the block
    with pytest.raises(BackendError, match="exited"):
        rl.Runtime(str(tmp_path / "no-such-model"))
