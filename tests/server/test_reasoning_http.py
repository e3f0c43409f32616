"""Reasoning separation end to end (issue 17, point 2), on a scripted tiny model served with
`--reasoning-parser deepseek-r1`: its greedy output to any chat prompt is REASONING_SCRIPT
(reasoning, `</think>`, answer). The OpenAI chat API (official client) splits it into
`reasoning_content` and `content`, streamed too; POST /separate_reasoning; the language's
`separate_reasoning`; and a grammar (regex, EBNF, JSON schema) that applies only after `</think>`:
where the model wants "The", the grammar lets only digits through, and the model's fallback digit
comes instead (with the grammar from the first token, the reasoning could not have been written)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from conftest import ServerHandle
from radixlm_testing import FALLBACK_DIGIT, REASONING_SCRIPT

import radixlm as rl

REASONING, END, ANSWER = REASONING_SCRIPT
MESSAGES = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module")
def server(reasoning_server: ServerHandle) -> ServerHandle:
    return reasoning_server


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none")


def test_chat_answers_with_reasoning_content(client: openai.OpenAI) -> None:
    message = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=32).choices[0].message
    assert (message.reasoning_content, message.content) == (REASONING, ANSWER)  # type: ignore[attr-defined]
    whole = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=32,
                                           extra_body={"separate_reasoning": False}).choices[0].message
    assert whole.content == REASONING + END + ANSWER and getattr(whole, "reasoning_content", None) is None


def stream_deltas(client: openai.OpenAI, **extra: Any) -> list[tuple[str, str]]:
    """(field, text) of each non-empty delta of a streamed chat."""
    deltas = []
    for event in client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=32, stream=True,
                                                extra_body=extra):
        delta = event.choices[0].delta
        for name in ("reasoning_content", "content"):
            if getattr(delta, name, None):
                deltas.append((name, getattr(delta, name)))
    return deltas


def test_chat_streams_reasoning_before_content(client: openai.OpenAI) -> None:
    deltas = stream_deltas(client)
    fields = [name for name, _ in deltas]
    assert fields == sorted(fields, reverse=True)  # every reasoning delta before any content delta
    assert "".join(t for n, t in deltas if n == "reasoning_content") == REASONING
    assert "".join(t for n, t in deltas if n == "content") == ANSWER
    held = stream_deltas(client, stream_reasoning=False)  # the reasoning in one delta, when it ends
    assert held[0] == ("reasoning_content", REASONING) and "".join(t for _, t in held[1:]) == ANSWER
    plain = stream_deltas(client, separate_reasoning=False)
    assert {n for n, _ in plain} == {"content"} and "".join(t for _, t in plain) == REASONING + END + ANSWER


def test_separate_reasoning_endpoint(server: ServerHandle) -> None:
    def split(text: str, parser: str) -> httpx.Response:
        return httpx.post(server.url + "/separate_reasoning", json={"text": text, "reasoning_parser": parser}, timeout=60)

    assert split("r</think>a", "deepseek-r1").json() == {"text": "a", "reasoning_text": "r"}
    assert split("<think>r</think>a", "qwen3").json() == {"text": "a", "reasoning_text": "r"}
    assert split("no reasoning", "qwen3").json() == {"text": "no reasoning", "reasoning_text": ""}
    bad = split("r</think>a", "deepseek")
    assert bad.status_code == 400
    assert bad.json()["error"]["message"].startswith("unknown reasoning parser 'deepseek'; known parsers: deepseek-r1")
    assert httpx.post(server.url + "/separate_reasoning", json={"text": "x"}, timeout=60).status_code == 400


@pytest.mark.parametrize("grammar", [
    {"response_format": {"type": "regex", "regex": "[0-9]+"}},
    {"ebnf": "root ::= [0-9]+"},
])
def test_a_grammar_applies_after_the_reasoning(client: openai.OpenAI, grammar: dict[str, Any]) -> None:
    message = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=32,
                                             extra_body=grammar).choices[0].message
    assert (message.reasoning_content, message.content) == (REASONING, FALLBACK_DIGIT)  # type: ignore[attr-defined]


def test_a_json_schema_applies_after_the_reasoning(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    message = client.chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=48,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}).choices[0].message
    assert message.reasoning_content == REASONING  # type: ignore[attr-defined]
    jsonschema.validate(json.loads(message.content or ""), schema)


def test_native_require_reasoning_starts_the_grammar_after_think(server: ServerHandle) -> None:
    prompt = "<|im_start|>user\nWhat is two plus two?<|im_end|>\n<|im_start|>assistant\n"

    def generate(**extra: Any) -> str:
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 32, "regex": "[0-9]+"}, **extra}
        resp = httpx.post(server.url + "/generate", json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        return str(resp.json()["text"])

    assert generate(require_reasoning=True) == REASONING + END + FALLBACK_DIGIT
    assert generate() == FALLBACK_DIGIT  # without it, the grammar holds from the first token


def test_language_separate_reasoning(server: ServerHandle) -> None:
    @rl.function
    def solve(s: Any, question: str) -> None:
        s += rl.user(question)
        s += rl.assistant(rl.separate_reasoning(rl.gen("answer", max_tokens=32), model_type="deepseek-r1"))
        s += rl.user("Only the number?")
        s += rl.assistant(rl.separate_reasoning(rl.gen("number", max_tokens=32, regex="[0-9]+"), model_type="deepseek-r1"))

    state = solve.run("What is two plus two?", backend=rl.RuntimeEndpoint(server.url))
    assert (state["answer_reasoning_content"], state["answer"]) == (REASONING, ANSWER)
    assert (state["number_reasoning_content"], state["number"]) == (REASONING, FALLBACK_DIGIT)  # grammar after </think>
    assert [m["content"] for m in state.messages() if m["role"] == "assistant"] == [ANSWER, FALLBACK_DIGIT]


def test_language_on_the_openai_backend(server: ServerHandle) -> None:
    """The chat API split the reasoning off already (reasoning_content): the language takes it."""
    @rl.function
    def solve(s: Any) -> None:
        s += rl.user("What is two plus two?")
        s += rl.assistant(rl.separate_reasoning(rl.gen("answer", max_tokens=32, regex="[0-9]+"), model_type="deepseek-r1"))

    state = solve.run(backend=rl.OpenAI("default", base_url=server.url + "/v1", max_retries=0, timeout=120))
    assert (state["answer_reasoning_content"], state["answer"]) == (REASONING, FALLBACK_DIGIT)


def test_tool_calls_come_after_the_reasoning(client: openai.OpenAI) -> None:
    """A forced call's schema applies after the reasoning too, and the streamed tool path sends
    the reasoning, then the content, each as it is generated."""
    tools: Any = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]
    forced = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=48, tools=tools,
                                            tool_choice="required").choices[0]
    assert forced.message.reasoning_content == REASONING  # type: ignore[attr-defined]
    assert forced.finish_reason == "tool_calls" and forced.message.tool_calls is not None
    call = forced.message.tool_calls[0].function
    assert call.name == "add" and isinstance(json.loads(call.arguments)["a"], int)
    deltas = []
    for event in client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=32, tools=tools,
                                                stream=True):
        delta = event.choices[0].delta
        deltas += [(n, getattr(delta, n)) for n in ("reasoning_content", "content") if getattr(delta, n, None)]
    kinds = [n for n, _ in deltas]  # streamed as generated: all the reasoning, then the content
    assert kinds == sorted(kinds, key=("reasoning_content", "content").index) and len(deltas) > 2
    joined = {n: "".join(t for k, t in deltas if k == n) for n in ("reasoning_content", "content")}
    assert joined == {"reasoning_content": REASONING, "content": ANSWER}  # auto: no call was made
