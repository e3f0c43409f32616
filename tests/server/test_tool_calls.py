"""Tool calls: the pure parts of `runtime.tool_calls`, then /v1/chat/completions with `tools`
through the official `openai` client against the real server (tiny random model)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from conftest import ServerHandle, start_server

from radixlm.formats.tool_calls import (
    Tool,
    ToolCall,
    ToolSpecError,
    add_tools_to_messages,
    parse_tool_choice,
    parse_tools,
    render_history_calls,
    tool_call_schema,
)
from radixlm.formats.tool_formats import parse_tool_calls
from radixlm.runtime.constrained.json_schema import schema_to_regex

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
           "additionalProperties": False}
SMALL_INT = {"type": "integer", "minimum": -999, "maximum": 999}  # bounded: a random model may not stop digits
ADD = {"type": "object", "properties": {"a": SMALL_INT, "b": SMALL_INT}, "required": ["a", "b"],
       "additionalProperties": False}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
]
PARAMS = {"get_weather": WEATHER, "add": ADD}
NAMES = {"get_weather", "add"}
MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


# --- unit: validation, schema, prompt, parsers -------------------------------------------------


def test_parse_tools_defaults_and_names() -> None:
    tools = parse_tools([{"type": "function", "function": {"name": "f"}}, *TOOLS])
    assert [t.name for t in tools] == ["f", "get_weather", "add"]
    assert tools[0].parameters == {"type": "object", "properties": {}} and tools[0].description is None
    assert tools[1].description == "Weather in a city" and tools[2].parameters == ADD


@pytest.mark.parametrize(("tools", "field"), [
    ([], "tools"),
    ({"type": "function"}, "tools"),
    (["f"], "tools[0]"),
    ([{"type": "code", "function": {"name": "f"}}], "tools[0].type"),
    ([{"type": "function"}], "tools[0].function"),
    ([{"type": "function", "function": {"description": "no name"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": "nope"}}], "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "wat": 1}}], "tools[0].function"),
    ([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}], "tools[1]"),
])  # fmt: skip
def test_parse_tools_rejects_bad_shapes(tools: Any, field: str) -> None:
    with pytest.raises(ToolSpecError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_tools(tools)


def test_parse_tool_choice() -> None:
    tools = parse_tools(TOOLS)
    assert parse_tool_choice(None, tools) == "auto" and parse_tool_choice(None, []) == "none"
    assert parse_tool_choice("none", tools) == "none" and parse_tool_choice("required", tools) == "required"
    named = parse_tool_choice({"type": "function", "function": {"name": "add"}}, tools)
    assert isinstance(named, Tool) and named.name == "add"
    for bad, match in [({"type": "function", "function": {"name": "nope"}}, "nope"), ("always", "tool_choice"),
                       ({"type": "function"}, "tool_choice.function.name")]:
        with pytest.raises(ToolSpecError, match=match):
            parse_tool_choice(bad, tools)
    with pytest.raises(ToolSpecError, match="required"):
        parse_tool_choice("required", [])


def test_tool_call_schema_accepts_exactly_the_calls() -> None:
    import re

    schema = tool_call_schema(parse_tools(TOOLS))
    jsonschema.validate({"name": "add", "arguments": {"a": 1, "b": 2}}, schema)
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Oslo"}}, schema)
    for bad in [{"name": "add", "arguments": {"city": "Oslo"}}, {"name": "sub", "arguments": {}},
                {"name": "add"}, {"name": "add", "arguments": {"a": 1, "b": 2}, "x": 1}]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    regex = schema_to_regex(schema)  # our grammar compiler takes it
    assert re.fullmatch(regex, '{"name": "add", "arguments": {"a": 1, "b": -2}}')
    assert not re.fullmatch(regex, '{"name": "get_weather", "arguments": {"a": 1, "b": 2}}')
    one = tool_call_schema(parse_tools(TOOLS[1:]))
    assert "anyOf" not in one and one["properties"]["name"] == {"const": "add"}


def test_tools_prompt_goes_into_the_system_message() -> None:
    tools = parse_tools(TOOLS)
    fresh = add_tools_to_messages([{"role": "user", "content": "hi"}], tools)
    assert [m["role"] for m in fresh] == ["system", "user"]
    assert "<tool_call>" in fresh[0]["content"] and '"name": "get_weather"' in fresh[0]["content"]
    merged = add_tools_to_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], tools)
    assert len(merged) == 2 and merged[0]["content"].startswith("Be brief.\n\n# Tools")
    history = render_history_calls("Let me see.", [{"id": "call_1", "type": "function",
                                                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}])
    assert history == 'Let me see.\n<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    with pytest.raises(ToolSpecError, match="arguments"):
        render_history_calls("", [{"function": {"name": "add", "arguments": "{bad"}}])


def test_parse_hermes_blocks() -> None:
    text = ('I will check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
            '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    content, calls = parse_tool_calls(text, NAMES)
    assert content == "I will check."
    assert calls == [ToolCall("get_weather", '{"city": "Paris"}'), ToolCall("add", '{"a": 1, "b": 2}')]
    # the last block may lack its closing tag; arguments given as a JSON string are accepted
    content, calls = parse_tool_calls('<tool_call>{"name": "add", "arguments": "{\\"a\\": 3}"}', NAMES)
    assert content is None and calls == [ToolCall("add", '{"a": 3}')]


def test_parse_leaves_bad_calls_as_content() -> None:
    unknown = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert parse_tool_calls(unknown, NAMES) == (unknown, [])
    broken = 'ok <tool_call>{"name": "add", "arguments": {</tool_call> <tool_call>{"name": "add"}</tool_call>'
    content, calls = parse_tool_calls(broken, NAMES)
    assert calls == [ToolCall("add", "{}")] and content == 'ok <tool_call>{"name": "add", "arguments": {</tool_call>'
    for text in ["plain words", '{"name": "nope", "arguments": {}}', "{not json", '[{"name": "add"}, 3]',
                 '{"name": "add", "arguments": [1]}', "[]", ""]:
        assert parse_tool_calls(text, NAMES) == (text, [])


def test_parse_bare_json() -> None:
    assert parse_tool_calls(' {"name": "add", "arguments": {"a": 1, "b": 2}} ', NAMES) == (
        None, [ToolCall("add", '{"a": 1, "b": 2}')])
    both = '[{"name": "add", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]'
    assert [c.name for c in parse_tool_calls(both, NAMES)[1]] == ["add", "get_weather"]


# --- end to end through the official client ---------------------------------------------------


@pytest.fixture(scope="module")
def client(tiny_server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _check_call(name: str, arguments: str) -> None:
    assert name in PARAMS
    jsonschema.validate(json.loads(arguments), PARAMS[name])


def test_required_gives_one_valid_call(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    out = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                         temperature=1.0, max_tokens=80, n=2)
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls
        assert calls is not None and len(calls) == 1 and calls[0].type == "function"
        assert calls[0].id.startswith("call_") and choice.message.content is None
        _check_call(calls[0].function.name, calls[0].function.arguments)


def test_named_tool_choice(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    out = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, temperature=1.0, max_tokens=80,
                                         tool_choice={"type": "function", "function": {"name": "add"}})
    calls = out.choices[0].message.tool_calls
    assert out.choices[0].finish_reason == "tool_calls" and calls is not None and len(calls) == 1
    assert calls[0].function.name == "add"
    _check_call("add", calls[0].function.arguments)


def test_streaming_required(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    chunks = list(client.chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required", temperature=1.0, max_tokens=80,
        stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                if delta.function and delta.function.name:
                    names[delta.index] = names.get(delta.index, "") + delta.function.name
                if delta.function and delta.function.arguments:
                    arguments[delta.index] = arguments.get(delta.index, "") + delta.function.arguments
    assert list(names) == [0]
    _check_call(names[0], arguments[0])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_none_and_auto(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    plain = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                           temperature=0, max_tokens=8, extra_body={"ignore_eos": True})
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason == "length"
    assert plain.choices[0].message.content
    for stream in (False, True):
        if stream:  # the buffered streaming path without calls still gives the content
            chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, temperature=0,
                                                         max_tokens=8, stream=True, extra_body={"ignore_eos": True}))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text and [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "tool_calls")
            continue
        auto = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="auto",
                                              temperature=1.0, max_tokens=16)
        message = auto.choices[0].message
        assert message.content is not None or message.tool_calls
        for call in message.tool_calls or []:
            _check_call(call.function.name, call.function.arguments)
    # a full round trip in the history: the assistant's call and the tool's result
    history = [*MESSAGES,
               {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                   "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    after = client.chat.completions.create(model=model, messages=history, tools=TOOLS, max_tokens=4, temperature=0)
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(("body", "match"), [
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope'"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "regex": "a+"}, "regex"),  # response_format yields to a forced call
])  # fmt: skip
def test_bad_tools_are_400(tiny_server: ServerHandle, body: dict[str, Any], match: str) -> None:
    resp = httpx.post(tiny_server.url + "/v1/chat/completions", json={"messages": MESSAGES, **body}, timeout=60)
    assert resp.status_code == 400 and match in resp.json()["error"]["message"]


def test_tool_call_parser_option_selects_the_format() -> None:
    hermes = 'ok <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    bare = '{"name": "f", "arguments": {"x": 1}}'
    assert [c.name for c in parse_tool_calls(hermes, {"f"}, "hermes")[1]] == ["f"]
    assert parse_tool_calls(hermes, {"f"}, "json")[1] == []
    assert [c.name for c in parse_tool_calls(bare, {"f"}, "json")[1]] == ["f"]
    assert parse_tool_calls(bare, {"f"}, "hermes")[1] == []
    assert len(parse_tool_calls(bare, {"f"}, "auto")[1]) == len(parse_tool_calls(hermes, {"f"}, "auto")[1]) == 1


# --- tool_choice auto on the default model: each opened call is well formed --------------------

FORECAST = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}
FORECAST_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                                    "parameters": FORECAST}}]


def _asked(city: str) -> dict[str, Any]:
    return {"role": "user", "content": f"What is the weather in {city}?"}


def _called(city: str) -> dict[str, Any]:
    arguments = json.dumps({"city": city, "unit": "celsius"})
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]}


# two solved turns: the default model then opens a <tool_call> block for the third city
TWO_SHOT = [_asked("Berlin"), _called("Berlin"), _asked("Rome"), _called("Rome"), _asked("Paris")]


@pytest.fixture(scope="module")
def outlines_default_server(default_model_dir: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """The default model on the outlines backend (no triggers: `auto` only parses)."""
    log = tmp_path_factory.mktemp("server") / "default-outlines.log"
    server = start_server(None, log, "--max-total-tokens", "8192", "--grammar-backend", "outlines")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cfg_default_client(default_server: ServerHandle) -> openai.OpenAI:
    """The default server: xgrammar, the structural tag's path under `auto`."""
    return openai.OpenAI(base_url=default_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _reply(client: openai.OpenAI, max_tokens: int | None, stream: bool) -> tuple[str, list[tuple[str, str]], str]:
    """(content, [(name, arguments)], finish_reason) of a greedy `auto` reply to TWO_SHOT."""
    model = client.models.list().data[0].id
    kwargs: dict[str, Any] = {"model": model, "messages": TWO_SHOT, "tools": FORECAST_TOOLS, "tool_choice": "auto",
                              "temperature": 0, "max_tokens": max_tokens}
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return choice.message.content or "", calls, str(choice.finish_reason)
    content, names, arguments, finish = "", {}, {}, ""
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                names[delta.index] = names.get(delta.index, "") + (delta.function.name or "")
                arguments[delta.index] = arguments.get(delta.index, "") + (delta.function.arguments or "")
            finish = choice.finish_reason or finish
    return content, [(names[i], arguments[i]) for i in sorted(names)], finish


@pytest.mark.parametrize("stream", [False, True])
def test_auto_keeps_every_opened_call_well_formed(cfg_default_client: openai.OpenAI, stream: bool) -> None:
    """Whatever the budget, a <tool_call> the model opened is a complete, valid call: never left as
    broken text in the content (the budget closes the call, or ends the text before it opens)."""
    content, calls, finish = _reply(cfg_default_client, None, stream)
    assert finish == "tool_calls" and [name for name, _ in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0][1]), FORECAST)
    for max_tokens in (12, 24, 34, 36, 40):
        content, calls, finish = _reply(cfg_default_client, max_tokens, stream)
        assert "<tool_call>" not in content, (max_tokens, content)
        for name, arguments in calls:
            assert name == "get_weather"
            jsonschema.validate(json.loads(arguments), FORECAST)
        assert finish == ("tool_calls" if calls else "length"), (max_tokens, content, finish)


def test_outlines_auto_only_parses(outlines_default_server: ServerHandle) -> None:
    """The outlines backend has no triggers: under a tight budget the same reply is cut inside the
    call and stays content (README: tool_choice auto is parse-only there)."""
    client = openai.OpenAI(base_url=outlines_default_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    content, calls, finish = _reply(client, 20, False)
    assert calls == [] and content.startswith("<tool_call>{") and finish == "length"


def test_language_auto_tool_choice_is_well_formed(default_server: ServerHandle) -> None:
    """`gen(tools=..., tool_choice="auto")` over RuntimeEndpoint sends the structural tag to a
    context-free backend: the call is a valid ToolCall, or (budget too small) text without one."""
    import radixlm as rl

    def get_weather(city: str, unit: Literal["celsius", "fahrenheit"]) -> str:
        """Current weather in a city."""
        return f"12 degrees {unit} in {city}"

    def solved(city: str) -> str:
        call = json.dumps({"name": "get_weather", "arguments": {"city": city, "unit": "celsius"}})
        return f"<tool_call>{call}</tool_call>"

    @rl.function
    def ask(s: Any, budget: int) -> None:
        s += rl.system(rl.tools_prompt([get_weather]))
        for city in ("Berlin", "Rome"):
            s += rl.user(f"What is the weather in {city}?")
            s += rl.assistant(solved(city))
        s += rl.user("What is the weather in Paris?")
        s += rl.assistant(rl.gen("call", tools=[get_weather], tool_choice="auto", max_tokens=budget,
                                 temperature=0))

    endpoint = rl.RuntimeEndpoint(default_server.url)
    call = ask.run(budget=64, backend=endpoint)["call"]
    assert isinstance(call, rl.ToolCall) and call.name == "get_weather"
    jsonschema.validate(call.arguments, FORECAST)
    for max_tokens in (12, 24, 34):
        reply = ask.run(budget=max_tokens, backend=endpoint)["call"]
        assert isinstance(reply, rl.ToolCall) or "<tool_call>" not in reply, (max_tokens, reply)


@pytest.mark.parametrize("tool_choice", [None, "none", "auto"])
def test_an_empty_tools_list_is_no_tools(tiny_server: ServerHandle, tool_choice: str | None) -> None:
    """OpenAI reads `tools: []` as no tools; only a choice that needs a tool is refused."""
    body: dict[str, Any] = {"messages": MESSAGES, "tools": [], "max_tokens": 4, "temperature": 0}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    resp = httpx.post(tiny_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"].get("tool_calls") is None


@pytest.mark.parametrize(("tool_choice", "match"), [
    ("required", "tool_choice 'required' needs a non-empty tools list"),
    ({"type": "function", "function": {"name": "add"}}, "tool_choice names function 'add', which is not among"),
])
def test_an_empty_tools_list_refuses_a_forced_call(tiny_server: ServerHandle, tool_choice: Any, match: str) -> None:
    resp = httpx.post(tiny_server.url + "/v1/chat/completions",
                      json={"messages": MESSAGES, "tools": [], "tool_choice": tool_choice}, timeout=60)
    assert resp.status_code == 400 and match in resp.json()["error"]["message"]
