"""`uniqueItems: true` kept at sampling time (`constrained.unique_items`): the door drops it from
the grammar and gives the request the schema as sent; the request's grammar state masks the
tokens that would repeat an item of a unique array. Items compare as JSON values; the schema is
read along the output's path through references and applicators; random walks through every
engine's grammar never repeat an item, and where the items come from a finite list (or a small
integer range, or are free strings) never reach a dead end; speculative drafts and jump-forward
text are cut before a repeat; through the Engine, unique arrays of several items come out valid
on every backend, and a schema that only allows repeats ends the request with an error that
names uniqueItems, never with a repeated item."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from grammar_backends_testing import GRAMMAR_BACKENDS
from radixlm_testing import assert_engine_clean
from test_engine_constrained import near_uniform_model_dir  # noqa: F401 (a fixture)

from radixlm.runtime.constrained import backends
from radixlm.runtime.constrained.unique_items import UniqueItemsDeadEnd, UniqueSchema, keeps_unique, wrap
from radixlm.runtime.constrained.vocabulary import get_grammar_vocabulary
from radixlm.runtime.engine import Engine
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

# schemas whose random walks must never reach a dead end: listed values, booleans, a small
# integer range, free strings, objects of them, references
NO_DEAD_END = [
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "uniqueItems": True, "minItems": 3},
    {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "minItems": 2},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3}, "uniqueItems": True, "minItems": 3},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True,
                                               "minItems": 3, "maxItems": 5}}, "required": ["tags"]},
    {"$defs": {"ids": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 4}, "uniqueItems": True}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/ids"}, "b": {"allOf": [{"$ref": "#/$defs/ids"}]}},
     "required": ["a", "b"]},
]
# schemas whose walks may reach one (a third item of at most two letters a / b; a third array of
# distinct 1s and 2s, which the one-token lookahead does not see coming): valid or ended saying so
MAY_DEAD_END = [
    {"type": "array", "items": {"type": "string", "pattern": "^[ab]{1,2}$"}, "uniqueItems": True, "minItems": 4},
    {"type": "array", "items": {"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True, "maxItems": 2},
     "uniqueItems": True, "minItems": 3, "maxItems": 3},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer(tiny_model_dir)


@pytest.fixture(scope="module", params=GRAMMAR_BACKENDS)
def backend(request: pytest.FixtureRequest, tokenizer: Tokenizer) -> Iterator[Any]:
    grammars = backends.create(request.param, tokenizer, tokenizer.vocab_size + 64, num_workers=1,
                               enable_jump_forward=True, whitespace_pattern=None)
    yield grammars
    grammars.shutdown()


def _state(grammars: Any, schema: dict[str, Any]) -> Any:
    lowered = backends.validate(grammars.backend_name, "json_schema", schema)
    assert lowered.unique_items and "uniqueItems" not in lowered.stricter
    compiled = grammars.get_lowered(lowered).result()
    return wrap(compiled.new_state(), lowered.unique_items, get_grammar_vocabulary(grammars.tokenizer).id_to_bytes,
                grammars.vocab_size)


def test_items_compare_as_json_values() -> None:
    schema = json.dumps({"type": "array", "uniqueItems": True})
    for text, unique in (("[1, 2]", True), ("[1, 1.0]", False), ("[true, 1]", True), ("[0, false]", True),
                         ('["a", "\\u0061"]', False), ('[{"a": 1, "b": [2]}, {"b": [2], "a": 1}]', False),
                         ('[{"a": 1}, {"a": 2}]', True), ("[[1, 2], [2, 1]]", True), ("[null, null]", False),
                         ('[1, [1, 1], "1"]', True)):
        assert keeps_unique(schema, text) == unique, text
    # only the arrays the schema says: the inner arrays here may repeat
    nested = json.dumps({"type": "array", "items": {"type": "array"}, "uniqueItems": True})
    assert keeps_unique(nested, "[[1, 1], [2, 2]]") and not keeps_unique(nested, "[[1, 1], [1, 1]]")


def test_the_schema_is_read_along_the_path() -> None:
    schema = UniqueSchema({
        "$defs": {"set": {"type": "array", "uniqueItems": True, "items": {"enum": ["a", "b"]}}},
        "type": "object",
        "properties": {"plain": {"type": "array"}, "ref": {"$ref": "#/$defs/set"},
                       "all": {"allOf": [{"type": "array"}, {"uniqueItems": True}]},
                       "any": {"anyOf": [{"type": "string"}, {"type": "array", "uniqueItems": True}]},
                       "tuple": {"prefixItems": [{"type": "array", "uniqueItems": True}], "items": {"type": "array"}},
                       "old": {"items": [{"type": "array"}], "additionalItems": {"uniqueItems": True}},
                       "cond": {"if": {"type": "array"}, "then": {"uniqueItems": True}},
                       "bools": {"type": "array", "uniqueItems": True, "items": {"type": "boolean"}},
                       "ints": {"type": "array", "uniqueItems": True,
                                "items": {"type": "integer", "minimum": 2, "exclusiveMaximum": 5}}},
        "patternProperties": {"^x-": {"type": "array", "uniqueItems": True}},
        "additionalProperties": {"type": "object"},
    })
    assert not schema.is_unique(()) and not schema.is_unique(("plain",))
    for path in (("ref",), ("all",), ("any",), ("tuple", 0), ("old", 1), ("cond",), ("x-y",)):
        assert schema.is_unique(path), path
    assert not schema.is_unique(("tuple", 1)) and not schema.is_unique(("old", 0)) and not schema.is_unique(("z",))
    assert {text for text, _ in schema.domain(("ref",)) or ()} == {'"a"', '"b"'}
    assert {text for text, _ in schema.domain(("bools",)) or ()} == {"true", "false"}
    assert {text for text, _ in schema.domain(("ints",)) or ()} == {"2", "3", "4"}
    assert schema.domain(("x-y",)) is None  # items of any value


def _walk(state: Any, id_to_bytes: dict[int, bytes], vocab_size: int, rng: random.Random) -> str | None:
    """A random walk through the state's masks (the shortest allowed tokens preferred, so that
    items repeat often unless masked); the text, or None at a dead end."""
    out = []
    for _ in range(400):
        row = torch.zeros(1, vocab_size, dtype=torch.bool)
        state.fill_vocab_masks(row, [])
        ids = sorted(torch.nonzero(row[0]).flatten().tolist(), key=lambda i: len(id_to_bytes.get(i, b"")))
        token = rng.choice(ids[:12])
        try:
            state.accept_token(token)
        except UniqueItemsDeadEnd:
            return None
        if token in id_to_bytes:
            out.append(id_to_bytes[token])
        if state.is_terminated():
            break
    return b"".join(out).decode()


def test_random_walks_never_repeat_an_item(backend: Any) -> None:
    id_to_bytes = get_grammar_vocabulary(backend.tokenizer).id_to_bytes
    for schema in NO_DEAD_END:
        for seed in range(2):
            text = _walk(_state(backend, schema), id_to_bytes, backend.vocab_size, random.Random(seed))
            assert text is not None, (schema, seed)
            jsonschema.validate(json.loads(text), schema)
    for schema in MAY_DEAD_END:
        num_valid = 0
        for seed in range(4):
            text = _walk(_state(backend, schema), id_to_bytes, backend.vocab_size, random.Random(seed))
            if text is not None:
                jsonschema.validate(json.loads(text), schema)
                num_valid += 1
        assert num_valid >= 1, schema


def test_drafts_and_forced_text_stop_before_a_repeat(backend: Any) -> None:
    schema = {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "uniqueItems": True, "maxItems": 3}
    id_to_bytes = get_grammar_vocabulary(backend.tokenizer).id_to_bytes
    encode = backend.tokenizer.encode_plain
    state = _state(backend, schema)
    for token in encode('["red", '):
        state.accept_token(token)
    repeat, other = encode('"red"]'), encode('"blue"]')
    assert state.inner.valid_prefix_len(repeat) == len(repeat)  # the grammar alone takes it
    cut = state.valid_prefix_len(repeat)
    assert cut < len(repeat) and state.valid_prefix_len(other) == len(other)
    # the mask rows along the draft: the row at the cut refuses the draft's token
    rows = torch.zeros(cut + 1, backend.vocab_size, dtype=torch.bool)
    state.fill_vocab_masks(rows, repeat[:cut])
    assert rows[cut].any() and not rows[cut, repeat[cut]]
    # after the opening quote no allowed token heads for "red" (its only end would repeat it)
    quote = encode('"')
    for token in quote:
        state.accept_token(token)
    row = torch.zeros(1, backend.vocab_size, dtype=torch.bool)
    state.fill_vocab_masks(row, [])
    allowed = [id_to_bytes.get(t, b"") for t in torch.nonzero(row[0]).flatten().tolist()]
    assert allowed and not any(b.startswith(b"r") for b in allowed), allowed
    # taken anyway (a token the grammar allows), the text the grammar forces next is cut before the repeat
    state.accept_token(encode("r")[0])
    forced = state.inner.jump_forward_ids(encode("r")[0], 8)
    ours = state.jump_forward_ids(encode("r")[0], 8)
    text = b"".join(id_to_bytes[t] for t in forced)
    if b'"' in text:  # outlines forces nothing here (its DFA forces only after a sampled token)
        assert len(ours) < len(forced) and b'"' not in b"".join(id_to_bytes[t] for t in ours)


@pytest.mark.parametrize("backend_name", GRAMMAR_BACKENDS)
def test_the_engine_writes_unique_arrays_of_several_items(near_uniform_model_dir: Path,  # noqa: F811
                                                          backend_name: str) -> None:
    """Through the Engine (speculative drafts on, as shipped), at temperature 1 on the
    near-uniform model: every output valid, arrays of several items (not one, as the stricter
    rewrite served them before); a schema that can only repeat ends its request saying so."""
    with Engine(str(near_uniform_model_dir), max_total_tokens=8192, random_seed=0,
                grammar_backend=backend_name) as engine:
        specs = [json.dumps(schema) for schema in NO_DEAD_END[:4]]
        params = [{"temperature": 1.0, "seed": seed, "json_schema": spec, "max_new_tokens": 160}
                  for seed in range(3) for spec in specs]
        outs = engine.generate(prompt=["items:"] * len(params), sampling_params=params)
        for p, out in zip(params, outs):
            reason = out["meta_info"]["finish_reason"]  # free strings may run to the budget, which closes them
            assert reason["type"] == "stop" or reason.get("closed_by_budget"), out["meta_info"]
            value = json.loads(out["text"])
            jsonschema.validate(value, json.loads(p["json_schema"]))
            items = value["tags"] if isinstance(value, dict) else value
            assert len(items) >= 2, out["text"]
        # "a" and "aa" are the only values: the third item can only repeat
        only_two = {"type": "array", "items": {"type": "string", "pattern": "^a{1,2}$"}, "uniqueItems": True,
                    "minItems": 3}
        out = engine.generate(prompt="items:", sampling_params={"temperature": 1.0, "seed": 0, "max_new_tokens": 64,
                                                                "json_schema": json.dumps(only_two)})
        reason = out["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "uniqueItems" in reason["message"], out
        assert_engine_clean(engine)
