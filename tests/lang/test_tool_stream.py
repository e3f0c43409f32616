"""ToolCallStream (radixlm.formats.tool_stream): however an output is cut into deltas, the
deltas add up to what `ToolCallReader.parse` reads from the whole text, nothing sent is taken
back, and calls are sent as they are written (name first, then argument fragments)."""

from __future__ import annotations

import json
import keyword

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.formats.json_prefix import canonical_prefix
from radixlm.formats.tool_calls import ToolCall
from radixlm.formats.tool_formats import tool_call_reader
from radixlm.formats.tool_stream import ToolCallDelta, ToolCallStream

NAMES = {"get_weather", "add"}
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
SUM = '{"name": "add", "arguments": {"a": 1, "b": 2}}'

# (parser, text): well-formed calls with content around them, and texts that are no calls
TEXTS = [
    ("hermes", f"I will check.\n<tool_call>{PARIS}</tool_call>\n<tool_call>\n{SUM}\n</tool_call>"),
    ("hermes", '  Sure: <tool_call>{"name":"add","arguments":{"a":1.50,"b":-2e3,"c":"x\\"\\u00e9\\ud83d\\ude00\\n"}}</tool_call> done. '),
    ("hermes", '<tool_call>{"arguments": {"a": 1}, "name": "add"}</tool_call>'),  # keys in another order
    ("hermes", '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3}"}'),  # serialized arguments, no closing tag
    ("hermes", 'ok <tool_call>{"name": "rm_rf", "arguments": {}}</tool_call> <tool_call>{"name": "add"}</tool_call>'),
    ("hermes", "plain text with a < sign and <tool_ca"),
    ("auto", f"  {SUM}  "),  # auto (hermes, then a bare JSON message)
    ("auto", '{"x": 1} is JSON'),
    ("qwen25", f"<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n{SUM}\n</tool_call>"),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "add", "parameters": {"a": 1, "b": 2}}'),
    ("llama3", 'Checking. <|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}'),
    ("llama3", 'The answer is {"name": "add"} maybe'),
    ("llama3", '{"name": "rm_rf", "parameters": {}}'),
    ("mistral", f"[TOOL_CALLS] [{PARIS}, {SUM}]"),
    ("mistral", f"Sure.[TOOL_CALLS] [{SUM}]"),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}'),
    ("mistral", '[TOOL_CALLS] [{"name": "rm", "arguments": {}}]'),
    ("pythonic", '[get_weather(city="Paris"), add(a=1, b=2)]'),
    ("pythonic", '<|python_start|>[add(a=[1, 2.5], b={"k": None, "t": True, "s": \'x,)\'})]<|python_end|>'),
    ("pythonic", "[add(a=x)]"),
    ("pythonic", "[rm(a=1)]"),
    ("pythonic", "plain words"),
    ("json", f"[{PARIS}, {SUM}]"),
    ("json", f" {SUM}"),
    ("json", "[]"),
    ("json", "no call here"),
    ("auto", "[1] is a note, <tool_call>"),
    ("auto", f"[ {SUM}]"),
]


def _run(parser: str, pieces: list[str]) -> tuple[list[ToolCallDelta], str | None, list[ToolCall]]:
    """Feed `pieces`; the deltas, and the content and calls they add up to."""
    stream = ToolCallStream(tool_call_reader(parser), NAMES)
    deltas = [d for piece in pieces for d in stream.feed(piece)] + stream.finish()
    content = "".join(d.content for d in deltas)
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for d in deltas:
        if d.index < 0:
            assert d.name is None and d.id is None and not d.arguments
            continue
        assert not d.content
        if d.name is not None:  # a call's first delta: id and name, no arguments yet
            assert d.index == len(names) and d.id and d.arguments == ""
            names[d.index] = d.name
        else:
            arguments[d.index] = arguments.get(d.index, "") + d.arguments
    calls = [ToolCall(names[i], arguments.get(i, "")) for i in sorted(names)]
    return deltas, content or None, calls


def _parsed(parser: str, text: str) -> tuple[str | None, list[ToolCall]]:
    content, calls = tool_call_reader(parser).parse(text, NAMES)
    return (content or None), calls


@pytest.mark.parametrize(("parser", "text"), TEXTS)
def test_every_split_in_two_and_every_char_gives_the_parse(parser: str, text: str) -> None:
    want = _parsed(parser, text)
    for cut in range(len(text) + 1):
        assert _run(parser, [text[:cut], text[cut:]])[1:] == want, (parser, cut)
    assert tuple(_run(parser, list(text))[1:]) == want


@pytest.mark.parametrize("index", [0, 1, 8, 9, 10, 13, 14, 15, 18, 22, 23])  # pythonic: a fragment per argument
def test_each_call_is_sent_in_fragments_as_it_is_written(index: int) -> None:
    """Fed a character at a time, every call of these well-formed texts (each format) comes as
    its name, then its arguments in more than one fragment."""
    parser, text = TEXTS[index]
    deltas, _, calls = _run(parser, list(text))
    assert calls
    for i in range(len(calls)):
        fragments = [d.arguments for d in deltas if d.index == i and d.name is None]
        assert len(fragments) > 1, (parser, text, i, fragments)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(TEXTS), st.lists(st.integers(0, 400), max_size=12))
def test_any_split_gives_the_parse(case: tuple[str, str], cuts: list[int]) -> None:
    parser, text = case
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    assert _run(parser, pieces)[1:] == _parsed(parser, text)


def test_arguments_stream_before_the_call_is_complete() -> None:
    """A forced call (json format) sends its name once the header is read and its arguments as
    they grow, in the canonical form the non-streamed parse gives."""
    stream = ToolCallStream(tool_call_reader("json"), NAMES)
    assert stream.feed('{"name": "get_weather", "argu') == []
    first = stream.feed('ments": {"ci')
    assert [(d.index, d.name, d.arguments) for d in first] == [(0, "get_weather", ""), (0, None, '{"ci')]
    assert [d.arguments for d in stream.feed('ty":"Par')] == ['ty": "Par']
    assert [d.arguments for d in stream.feed('is"}}')] == ['is"}']
    assert stream.finish() == []


def test_content_that_may_open_a_call_is_held() -> None:
    stream = ToolCallStream(tool_call_reader("hermes"), NAMES)
    assert [d.content for d in stream.feed("Let me see <tool_")] == ["Let me see"]
    assert stream.feed("call>") == []
    assert [(d.name, d.arguments) for d in stream.feed(SUM[:30])] == [("add", ""), (None, "{")]


def test_text_opening_with_a_bracket_streams_once_it_cannot_be_a_call_list() -> None:
    stream = ToolCallStream(tool_call_reader("auto"), NAMES)
    assert stream.feed("[") == [] and stream.feed(" ") == []
    assert [d.content for d in stream.feed("1] is a note")] == ["[ 1] is a note"]


def test_a_call_cut_off_stays_sent() -> None:
    """max_tokens inside the arguments: the stream keeps the call and the arguments it sent
    (as OpenAI does), where the non-streamed parse reads the text as content."""
    text = '<tool_call>{"name": "add", "arguments": {"a": 1, "b'
    _, content, calls = _run("hermes", [text])
    assert content is None and calls == [ToolCall("add", '{"a": 1, "b')]
    assert tool_call_reader("hermes").parse(text, NAMES) == (text, [])
    stream = ToolCallStream(tool_call_reader("hermes"), NAMES)
    stream.feed(text)
    stream.finish()
    assert stream.num_calls == 1 and not stream.is_parsed  # the server's finish_reason is then the model's


@pytest.mark.parametrize("value", [
    {"a": [1, 2.5, -0.0, 1e300, True, None], "s": "q\"\\/\b\f\n\r\t\u0001é😀", "o": {}, "l": []},
    {"nested": {"x": [{"y": "z"}]}, "n": 12345678901234567890},
])
def test_canonical_prefix_is_the_dumps_of_the_loads(value: object) -> None:
    for raw in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=2), json.dumps(value, separators=(",", ":"))):
        want = json.dumps(json.loads(raw), ensure_ascii=False)
        assert canonical_prefix(raw, 0) == (want, len(raw))
        previous = ""
        for cut in range(len(raw)):
            got, end = canonical_prefix(raw[:cut], 0)
            assert end is None and got.startswith(previous) and want.startswith(got), (raw[:cut], got)
            previous = got


# --- generated calls: any arguments, written as each format writes them, cut anywhere ----------

_KEYS = st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True).filter(lambda k: not keyword.iskeyword(k))
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8)
_CALLS = st.lists(st.tuples(st.sampled_from(sorted(NAMES)), st.dictionaries(_KEYS, _VALUES, max_size=4)),
                  min_size=1, max_size=3)


def _written(parser: str, calls: list[tuple[str, dict[str, object]]], style: dict[str, object], before: str) -> str:
    """`calls` as a model of `parser`'s family writes them (JSON in `style`), after content `before`."""
    def obj(name: str, args: dict[str, object], key: str = "arguments") -> str:
        return json.dumps({"name": name, key: args}, **style)  # type: ignore[arg-type]

    if parser in ("hermes", "qwen25"):
        gap = "\n" if parser == "qwen25" else ""
        return before + "\n".join(f"<tool_call>{gap}{obj(n, a)}{gap}</tool_call>" for n, a in calls)
    if parser == "json":
        return obj(*calls[0]) if len(calls) == 1 else "[" + ", ".join(obj(n, a) for n, a in calls) + "]"
    if parser == "llama3":
        return (f"{before}<|python_tag|>" if before.strip() else "") + "; ".join(obj(n, a, "parameters") for n, a in calls)
    if parser == "mistral":
        if style.get("indent") is None and len(before) % 2:  # the newer per-call form
            return before + "".join(f"[TOOL_CALLS]{n}[ARGS]{json.dumps(a, **style)}" for n, a in calls)  # type: ignore[arg-type]
        return before + "[TOOL_CALLS] [" + ", ".join(obj(n, a) for n, a in calls) + "]"
    return "[" + ", ".join(f"{n}(" + ", ".join(f"{k}={v!r}" for k, v in a.items()) + ")" for n, a in calls) + "]"


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["hermes", "qwen25", "json", "llama3", "mistral", "pythonic"]), _CALLS,
       st.sampled_from([{}, {"ensure_ascii": False}, {"separators": (",", ":")}, {"indent": 1}]),
       st.text(st.sampled_from("ab .!?\n"), max_size=8), st.lists(st.integers(0, 2000), max_size=10))
def test_generated_calls_stream_as_they_parse(parser: str, calls: list[tuple[str, dict[str, object]]],
                                             style: dict[str, object], before: str, cuts: list[int]) -> None:
    text = _written(parser, calls, style, before)
    want = [ToolCall(n, json.dumps(a, ensure_ascii=False)) for n, a in calls]
    assert _parsed(parser, text)[1] == want, text
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    assert _run(parser, [text[a:b] for a, b in zip(bounds, bounds[1:])])[1:] == _parsed(parser, text)
