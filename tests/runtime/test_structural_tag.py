"""Structural tags (`runtime/constrained/structural_tag.py`) on the two context-free backends, token
by token with the default model's vocabulary: free text, triggered structures in the prompt
convention's layout, raw control characters and schema bounds kept, the closing plan from inside a
structure, jump-forward over a structure's begin; malformed specs refused with a reason.
(End to end through both APIs: tests/server/test_grammar_backends.py and test_tool_calls.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from grammar_backends_testing import grammar_backend

from radixlm.formats.tool_calls import parse_tools
from radixlm.formats.tool_formats import parse_tool_calls, tool_call_structures
from radixlm.runtime.bench import schema_keywords
from radixlm.runtime.constrained import backends
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.structural_tag import _no_raw_controls, normalize_structural_tag
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
TOOLS = parse_tools([{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
                     {"type": "function", "function": {"name": "add", "parameters": ADD}}])
SPEC = json.dumps(tool_call_structures(TOOLS))
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Any) -> Tokenizer:
    return Tokenizer(default_model_dir)


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def compiled(request: pytest.FixtureRequest, tokenizer: Tokenizer) -> Iterator[Any]:
    with grammar_backend(request.param, tokenizer, 49152, num_workers=1) as backend:
        yield backend.get("structural_tag", SPEC).result(timeout=60)


def _accepts(compiled: Any, tokenizer: Tokenizer, text: str) -> bool:
    state = compiled.new_state()
    for token in tokenizer.encode_plain(text):
        try:
            state.accept_token(token)
        except ValueError:
            return False
    return True


@pytest.mark.parametrize("text", [
    "No call needed: it is sunny.",
    f"Let me look.\n{CALL}",
    f'{CALL}\n<tool_call>{{"name": "add", "arguments": {{"a": -12}}}}</tool_call> done',
    "a line\nwith < and <tool and tool_call> but no trigger",
])
def test_free_text_and_well_formed_calls_are_accepted(compiled: Any, tokenizer: Tokenizer, text: str) -> None:
    assert _accepts(compiled, tokenizer, text)
    content, calls = parse_tool_calls(text, {"get_weather", "add"})
    assert len(calls) == text.count("<tool_call>")


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',  # not a tool
    '<tool_call> {"name": "add", "arguments": {"a": 1}}</tool_call>',  # not the convention's layout
    '<tool_call>{"name": "add", "arguments": {"a":1}}</tool_call>',  # json.dumps layout only
    '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',  # additionalProperties
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa\nris"',  # raw control character
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Amsterdam"',  # maxLength 8
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome", "unit": "kelvin"',  # enum
    '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool>',  # end marker
])
def test_an_opened_call_must_be_well_formed(compiled: Any, tokenizer: Tokenizer, text: str) -> None:
    assert not _accepts(compiled, tokenizer, text)


def test_closing_plan_and_jump_forward_inside_a_call(compiled: Any, tokenizer: Tokenizer) -> None:
    state = compiled.new_state()
    assert state.closing_ids() == []  # free text may end at once
    for token in tokenizer.encode_plain("Checking. <tool_call>"):
        state.accept_token(token)
    assert tokenizer.decode(state.jump_forward_ids(0, 16)) == '{"name": "'  # two tools: the name is open
    plan = tokenizer.decode(state.closing_ids())
    assert plan.endswith("}</tool_call>")
    _, calls = parse_tool_calls("<tool_call>" + plan, {"get_weather", "add"})
    assert len(calls) == 1 and state.min_tokens() == len(state.closing_ids())


def test_one_tool_jumps_over_its_whole_begin(tokenizer: Tokenizer) -> None:
    spec = json.dumps(tool_call_structures(TOOLS[1:]))
    for name in ("xgrammar", "llguidance"):
        with grammar_backend(name, tokenizer, 49152, num_workers=1) as backend:
            state = backend.get("structural_tag", spec).result(timeout=60).new_state()
            for token in tokenizer.encode_plain("<tool_call>"):
                state.accept_token(token)
            assert tokenizer.decode(state.jump_forward_ids(0, 16)).startswith('{"name": "add", "arguments": {"a":')


@pytest.mark.parametrize(("spec", "reason"), [
    ("not json", "not valid JSON"),
    ([], "must be an object"),
    ({"structures": [], "triggers": ["<a>"]}, "structures must be a non-empty list"),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}]}, "triggers must be a non-empty list"),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": [""]}, "non-empty strings"),
    ({"structures": [{"begin": "<b>", "schema": {}, "end": "</b>"}], "triggers": ["<a>"]}, "must start with exactly one"),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": ["<a>", "<b>"]}, "opens no structure"),
    ({"structures": [{"begin": "<a>", "schema": "x", "end": "</a>"}], "triggers": ["<a>"]}, "schema must be"),
    ({"structures": [{"begin": "<a>", "end": 3}], "triggers": ["<a>"]}, "must be strings"),
    ({"structures": [{"begin": "<a>", "end": "", "x": 1}], "triggers": ["<a>"]}, "unknown field"),
    ({"structures": [], "triggers": [], "extra": 1}, "unknown field"),
    ({"type": "json_schema", "structures": [], "triggers": []}, "type must be 'structural_tag'"),
])
def test_malformed_specs_are_refused_with_the_reason(spec: object, reason: str) -> None:
    with pytest.raises(GrammarError, match=reason):
        normalize_structural_tag(spec)
    for name in ("xgrammar", "llguidance"):
        with pytest.raises(GrammarError, match=reason):
            backends.validate(name, "structural_tag", spec)


def test_outlines_refuses_structural_tags_naming_the_backends_that_serve_them() -> None:
    with pytest.raises(GrammarError, match="--grammar-backend xgrammar or llguidance"):
        backends.validate("outlines", "structural_tag", SPEC)


def _structure(schema: object) -> dict[str, Any]:
    return {"structures": [{"begin": "<a>", "schema": schema, "end": "</a>"}], "triggers": ["<a>"]}


def test_a_schema_inside_a_structure_is_rewritten_and_what_xgrammar_would_not_enforce_refused() -> None:
    """A structure's schema goes through the door's rewrite (a required name `properties` does not
    list may hold any value; `uniqueItems` as at most one item, since no sampling-time check
    follows a structure inside free text) and is refused naming what xgrammar would not enforce."""
    backends.validate("xgrammar", "structural_tag", _structure({"type": "object", "required": ["x"]}))
    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    lowered = backends.validate("xgrammar", "structural_tag", _structure(unique))
    acceptors = schema_keywords.Acceptors()
    assert acceptors.accepts("xgrammar", lowered.form, "<a>[1]</a>")
    assert not acceptors.accepts("xgrammar", lowered.form, "<a>[1, 2]</a>")  # stricter: never [1, 1]
    with pytest.raises(GrammarError, match="does not enforce 'not'"):
        backends.validate("xgrammar", "structural_tag", _structure({"type": "integer", "not": {"multipleOf": 3}}))
    with pytest.raises(GrammarError, match="does not enforce 'uniqueItems'"):  # two distinct items: not served
        backends.validate("xgrammar", "structural_tag", _structure({**unique, "minItems": 2}))


def test_control_characters_leave_negated_classes_only() -> None:
    ebnf = r'a ::= [^"\\\r\n] "[^x" [^\0-\x1f"] [a-z] [\]^]'
    assert _no_raw_controls(ebnf) == r'a ::= [^\0-\x1f"\\\r\n] "[^x" [^\0-\x1f"] [a-z] [\]^]'
