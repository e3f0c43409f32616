"""Streamed tool calls and continuous usage through the real server (tiny random model; the
forced choices constrain the arguments, so the outcome does not depend on model quality):
OpenAI's shape (a call's index, id, type and name first, then its arguments in fragments), the
same calls as the non-streamed response, the official `openai` client's stream helper,
instructor's `create_partial` growing an object as the arguments arrive, and langchain-openai's
streamed tool-call chunks adding up to the call it gets whole."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import instructor
import openai
import pytest
from conftest import ServerHandle
from pydantic import BaseModel, Field

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
           "additionalProperties": False}
SMALL_INT = {"type": "integer", "minimum": -999, "maximum": 999}
ADD = {"type": "object", "properties": {"a": SMALL_INT, "b": SMALL_INT}, "required": ["a", "b"],
       "additionalProperties": False}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
]
MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
# what the model is made to write under `auto` (SGLang's `regex` extension): content, then two calls
TWO_CALLS = ('Checking. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
             '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')


@pytest.fixture(scope="module")
def client(tiny_server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _streamed(client: openai.OpenAI, **kwargs: Any) -> tuple[str, list[tuple[str, str]], str, list[Any]]:
    """(content, [(name, arguments)], finish_reason, the tool-call deltas) of a streamed reply,
    checking OpenAI's shape: a call's first delta has its index, id, type and name."""
    content, finish = "", ""
    calls: dict[int, list[str]] = {}
    deltas: list[Any] = []
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                deltas.append(delta)
                assert delta.function is not None
                if delta.index not in calls:
                    assert delta.id and delta.id.startswith("call_") and delta.type == "function"
                    assert delta.function.name and delta.function.arguments == ""
                    calls[delta.index] = [delta.function.name, ""]
                else:
                    assert delta.id is None and delta.function.name is None
                    calls[delta.index][1] += delta.function.arguments or ""
    assert sorted(calls) == list(range(len(calls)))
    return content, [(calls[i][0], calls[i][1]) for i in sorted(calls)], finish, deltas


def _created(client: openai.OpenAI, **kwargs: Any) -> tuple[str, list[tuple[str, str]], str]:
    choice = client.chat.completions.create(**kwargs).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.message.content or "", calls, str(choice.finish_reason)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_streams_its_arguments_as_the_response_has_them(client: openai.OpenAI, tool_choice: Any) -> None:
    kwargs: dict[str, Any] = {"model": "default", "messages": MESSAGES, "tools": TOOLS, "tool_choice": tool_choice,
                              "temperature": 0, "max_tokens": 80}
    content, calls, finish, deltas = _streamed(client, **kwargs)
    assert (content, calls, finish) == _created(client, **kwargs)
    assert finish == "tool_calls" and len(calls) == 1
    json.loads(calls[0][1])
    assert sum(1 for d in deltas if d.function.arguments) > 2  # fragments, not the whole at once


def test_auto_streams_content_and_parallel_calls(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": "default", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto",
                              "temperature": 0, "max_tokens": 200, "extra_body": {"regex": re.escape(TWO_CALLS)}}
    content, calls, finish, deltas = _streamed(client, **kwargs)
    assert (content, calls, finish) == _created(client, **kwargs)
    assert content == "Checking." and finish == "tool_calls"
    assert calls == [("get_weather", '{"city": "Paris"}'), ("add", '{"a": 1, "b": 2}')]
    for index in (0, 1):
        assert sum(1 for d in deltas if d.index == index and d.function.arguments) > 1
    single = _streamed(client, **kwargs, parallel_tool_calls=False)[1]
    assert single == calls[:1]


def test_the_openai_stream_helper_accumulates_the_same_call(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": "default", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
                              "temperature": 0, "max_tokens": 80}
    argument_events = 0
    with client.chat.completions.stream(**kwargs) as stream:
        for event in stream:
            argument_events += event.type == "tool_calls.function.arguments.delta"
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert [(call.function.name, call.function.arguments)] == _created(client, **kwargs)[1]
    assert final.choices[0].finish_reason == "tool_calls" and argument_events > 2


class Weather(BaseModel):
    city: str = Field(max_length=24)
    country: str = Field(max_length=24)
    days: int = Field(ge=1, le=9)


def test_instructor_create_partial_grows_the_object(tiny_server: ServerHandle) -> None:
    """instructor (Mode.TOOLS forces the function) yields more than one partial object, each
    extending the last, ending at the object of the whole call."""
    client = instructor.from_openai(
        openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=120),
        mode=instructor.Mode.TOOLS)
    partials = [p.model_dump() for p in client.chat.completions.create_partial(
        model="default", response_model=Weather, messages=MESSAGES, temperature=0, max_tokens=120, max_retries=0)]
    distinct = [p for i, p in enumerate(partials) if i == 0 or p != partials[i - 1]]
    assert len(distinct) > 2, partials
    for before, after in zip(distinct, distinct[1:]):
        for key, value in before.items():
            if value is None:
                continue
            now = after[key]
            assert now == value or (isinstance(value, str) and isinstance(now, str) and now.startswith(value)), \
                (before, after)
    Weather.model_validate(distinct[-1])


def test_langchain_streams_the_call_it_gets_whole(tiny_server: ServerHandle) -> None:
    """langchain-openai's ChatOpenAI with a bound, forced tool: its streamed chunks carry the
    call in pieces (the name once, the arguments in fragments), and their sum is the call
    `invoke` returns."""
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=tiny_server.url + "/v1", api_key="unused", model="default", temperature=0,
                      max_tokens=80, max_retries=0, timeout=120)
    bound = chat.bind_tools([TOOLS[0]], tool_choice="get_weather")
    chunks = list(bound.stream("What is the weather in Paris?"))
    pieces = [piece for chunk in chunks for piece in chunk.tool_call_chunks]
    assert [p["name"] for p in pieces if p["name"]] == ["get_weather"] and len(pieces) > 2
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    (streamed,) = total.tool_calls
    (whole,) = bound.invoke("What is the weather in Paris?").tool_calls
    assert (streamed["name"], streamed["args"]) == (whole["name"], whole["args"]) == ("get_weather", whole["args"])
    assert set(whole["args"]) == {"city"}


def _sse(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", url, json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        lines = [line[len("data: "):] for line in resp.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize(("path", "extra"), [
    ("/v1/completions", {"prompt": "Once upon a time", "n": 2}),
    ("/v1/chat/completions", {"messages": MESSAGES}),
    ("/v1/chat/completions", {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required"}),
])
def test_continuous_usage_stats_puts_usage_in_every_chunk(tiny_server: ServerHandle, path: str,
                                                          extra: dict[str, Any]) -> None:
    body = {"model": "default", "max_tokens": 12, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}, **extra}
    chunks = _sse(tiny_server.url + path, body)
    *per_choice, last = chunks
    seen: dict[int, int] = {}
    for chunk in per_choice:
        usage = chunk["usage"]
        (choice,) = chunk["choices"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] >= seen.get(choice["index"], 0)
        seen[choice["index"]] = usage["completion_tokens"]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == sum(seen.values())
    plain = _sse(tiny_server.url + path, {**body, "stream_options": {"include_usage": True}})
    assert all("usage" not in c for c in plain[:-1]) and plain[-1]["usage"]["completion_tokens"] == sum(seen.values())
