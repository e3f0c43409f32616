"""Tool calls in each family's format (`--tool-call-parser`, radixlm.formats.tool_formats): the
parsers and the format a chat template asks for, then, per family, a real server whose chat
template renders tools itself (tests/chat_templates: our own templates in the style of Qwen2.5,
Llama 3.1, Mistral and Llama 3.2's pythonic calls) through the official `openai` client."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import ServerHandle, start_server

from radixlm.formats.tool_calls import ToolCall, parse_tools, template_tool_calls, template_tools
from radixlm.formats.tool_formats import (
    FORMATS,
    detect_format,
    parse_tool_calls,
    resolve_parser,
    tool_call_structures,
)

TEMPLATES = Path(__file__).parent.parent / "chat_templates"
FAMILIES = sorted(p.stem for p in TEMPLATES.glob("*.jinja"))  # each named after the format it teaches
NAMES = {"get_weather", "add"}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Sum", "parameters": ADD}},
]
PARIS, SUM = ToolCall("get_weather", '{"city": "Paris"}'), ToolCall("add", '{"a": 1, "b": 2}')

# what each family's model writes for the calls [PARIS, SUM]
WRITTEN = {
    "qwen25": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "add", "parameters": {"a": 1, "b": 2}}',
    "mistral": '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
               '{"name": "add", "arguments": {"a": 1, "b": 2}}]',
    "pythonic": '[get_weather(city="Paris"), add(a=1, b=2)]',
}


# --- unit: formats and detection -----------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_each_template_is_read_in_its_own_format(family: str) -> None:
    template = (TEMPLATES / f"{family}.jinja").read_text()
    assert detect_format(template) == family == resolve_parser("auto", template)
    assert parse_tool_calls(WRITTEN[family], NAMES, "auto", template) == (None, [PARIS, SUM])
    assert parse_tool_calls(WRITTEN[family], NAMES, family) == (None, [PARIS, SUM])


def test_templates_without_tools_fall_back_to_our_prompt(default_model_dir: Path) -> None:
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

    template = Tokenizer(default_model_dir).chat_template  # SmolLM2: no tools in its template
    assert detect_format(template) is None and detect_format(None) is None
    assert resolve_parser("auto", template) == "hermes"
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        resolve_parser("gpt", template)


@pytest.mark.parametrize("family", FAMILIES)
def test_what_a_template_writes_in_the_history_parses_back(family: str, tiny_model_dir: Path) -> None:
    """The template renders an assistant turn's calls; our parser for its format reads them back."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    template = (TEMPLATES / f"{family}.jinja").read_text()
    calls = template_tool_calls([{"id": "c1", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in (PARIS, SUM)])
    asked = [{"role": "user", "content": "Weather in Paris, and 1 + 2?"}]
    before = tokenizer.apply_chat_template(asked, tools=TOOLS, chat_template=template, tokenize=False,
                                           add_generation_prompt=True)
    after = tokenizer.apply_chat_template([*asked, {"role": "assistant", "content": "", "tool_calls": calls}],
                                          tools=TOOLS, chat_template=template, tokenize=False)
    assert after.startswith(before), "the template renders the generation prompt as the assistant turn's opening"
    turn = after[len(before):]
    for end in ("<|im_end|>\n", "<|eot_id|>", "</s>"):
        turn = turn.removesuffix(end)
    assert parse_tool_calls(turn, NAMES, family) == (None, [PARIS, SUM])


def test_content_outside_the_calls_and_bad_calls() -> None:
    assert parse_tool_calls('Checking. <|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}', NAMES,
                            "llama3") == ("Checking.", [SUM])
    assert parse_tool_calls('Sure.[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}]', NAMES,
                            "mistral") == ("Sure.", [SUM])
    # Mistral's newer per-call form
    assert parse_tool_calls('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}',
                            NAMES, "mistral") == (None, [PARIS, SUM])
    # pythonic literals of every JSON kind; None / True become null / true
    _, calls = parse_tool_calls('[add(a=[1, 2.5], b={"k": None, "t": True})]', NAMES, "pythonic")
    assert [json.loads(c.arguments) for c in calls] == [{"a": [1, 2.5], "b": {"k": None, "t": True}}]
    for parser, text in [
        ("llama3", '{"name": "rm_rf", "parameters": {}}'), ("llama3", '{"name": "add", "parameters": {'),
        ("llama3", 'The answer is {"name": "add"} maybe'), ("mistral", "[TOOL_CALLS] [{]"),
        ("mistral", '[TOOL_CALLS] [{"name": "rm", "arguments": {}}]'), ("pythonic", "[add(a=x)]"),
        ("pythonic", "[add(1, 2)]"), ("pythonic", "[rm(a=1)]"), ("pythonic", "[add(a=1]"), ("pythonic", "[]"),
        ("pythonic", "plain words"), ("json", "[]"),
    ]:  # fmt: skip
        assert parse_tool_calls(text, NAMES, parser) == (text, []), (parser, text)


def test_structural_tags_per_format() -> None:
    tools = parse_tools(TOOLS)
    for name in FORMATS:
        tag = tool_call_structures(tools, name)
        if name in ("pythonic", "json"):
            assert tag is None  # parsed only
            continue
        assert tag is not None and len(tag["structures"]) == 2
        for structure in tag["structures"]:  # a call opened this way and closed parses as that call
            assert any(structure["begin"].startswith(t) for t in tag["triggers"])
            call = structure["begin"] + '{"a": 1, "b": 2}' + structure["end"]
            content, calls = parse_tool_calls(call, {"get_weather", "add"}, name)
            assert content is None and [c.arguments for c in calls] == ['{"a": 1, "b": 2}']


# --- per family, a real server whose template renders the tools --------------------------------


@pytest.fixture(scope="module", params=FAMILIES)
def family_server(request: pytest.FixtureRequest, tiny_model_dir: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerHandle]]:
    family = str(request.param)
    log = tmp_path_factory.mktemp("server") / f"tiny-{family}.log"
    server = start_server(tiny_model_dir, log, "--max-total-tokens", "4096", "--random-seed", "0",
                          "--dtype", "float32", "--chat-template", str(TEMPLATES / f"{family}.jinja"))
    yield family, server
    server.stop()


def _client(server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


ASKED = [{"role": "user", "content": "Weather in Paris, and 1 + 2?"}]


@pytest.mark.parametrize("stream", [False, True])
def test_auto_reads_the_calls_in_the_family_format(family_server: tuple[str, ServerHandle], stream: bool) -> None:
    """The tiny model is made to write the family's calls (SGLang's `regex` extension); under
    tool_choice auto the server reads them as OpenAI tool calls, streamed or not."""
    family, server = family_server
    client = _client(server)
    kwargs: dict[str, Any] = {"model": "default", "messages": ASKED, "tools": TOOLS, "tool_choice": "auto",
                              "temperature": 0, "max_tokens": 200, "extra_body": {"regex": re.escape(WRITTEN[family])}}
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        assert choice.message.content is None and choice.finish_reason == "tool_calls"
    else:
        calls, finish, num_fragments = _streamed_calls(client, kwargs)
        assert finish == "tool_calls"
        assert num_fragments > len(calls)  # the arguments come as they are written, not whole at the end
    assert calls == [(PARIS.name, PARIS.arguments), (SUM.name, SUM.arguments)]


def _streamed_calls(client: openai.OpenAI, kwargs: dict[str, Any]) -> tuple[list[tuple[str, str]], str, int]:
    """([(name, arguments)], finish_reason, the number of argument fragments) of a streamed reply
    without content; each call's name comes in its first delta, before its arguments."""
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    finish, num_fragments = "", 0
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for ch in chunk.choices:
            assert not ch.delta.content
            for delta in ch.delta.tool_calls or []:
                if delta.index not in names:
                    assert delta.function.name and delta.function.arguments == "" and delta.id
                    names[delta.index], arguments[delta.index] = delta.function.name, ""
                else:
                    assert delta.function.name is None
                    arguments[delta.index] += delta.function.arguments or ""
                    num_fragments += 1
            finish = ch.finish_reason or finish
    return [(names[i], arguments[i]) for i in sorted(names)], finish, num_fragments


def test_required_and_history_through_the_family_template(family_server: tuple[str, ServerHandle],
                                                          tiny_model_dir: Path) -> None:
    """The template itself renders the tools and a past call with its result (the prompt is
    transformers' rendering of that template, token for token), and `required` gives one call."""
    from transformers import AutoTokenizer

    family, server = family_server
    client = _client(server)
    history = [*ASKED, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"}, {"role": "user", "content": "And in Rome?"}]
    out = client.chat.completions.create(model="default", messages=history, tools=TOOLS, tool_choice="required",
                                         temperature=0, max_tokens=48)
    choice = out.choices[0]
    if choice.finish_reason == "tool_calls":  # a random model may run out of tokens inside the arguments
        (call,) = choice.message.tool_calls or []
        assert call.function.name in NAMES and isinstance(json.loads(call.function.arguments), dict)
    # streamed, the same call (greedy), its arguments in fragments as they are generated
    calls, finish, _ = _streamed_calls(client, {"model": "default", "messages": history, "tools": TOOLS,
                                                "tool_choice": "required", "temperature": 0, "max_tokens": 48})
    assert finish == choice.finish_reason
    if finish == "tool_calls":  # cut off ("length"), the stream has sent a prefix of the arguments
        assert calls == [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    native = [{**m, "tool_calls": template_tool_calls(m["tool_calls"])} if "tool_calls" in m else m for m in history]
    want = tokenizer.apply_chat_template(native, tools=template_tools(parse_tools(TOOLS)), tokenize=False,
                                         add_generation_prompt=True,
                                         chat_template=(TEMPLATES / f"{family}.jinja").read_text())
    assert out.usage is not None
    assert out.usage.prompt_tokens == len(tokenizer(want, add_special_tokens=False)["input_ids"])


def test_auto_serves_the_family_structural_tag(family_server: tuple[str, ServerHandle]) -> None:
    """Free `auto` generation under the family's structural tag (pythonic: parsed only): the
    grammar backend takes it, and whatever the model writes is content or well-formed calls."""
    _, server = family_server
    out = _client(server).chat.completions.create(model="default", messages=ASKED, tools=TOOLS, tool_choice="auto",
                                                  temperature=0, max_tokens=16)
    choice = out.choices[0]
    for call in choice.message.tool_calls or []:
        assert call.function.name in NAMES and isinstance(json.loads(call.function.arguments), dict)
    assert choice.finish_reason == ("tool_calls" if choice.message.tool_calls else "length")
