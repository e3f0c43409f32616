"""Grammar backends: vocabulary, regex helpers, random walks through compiled grammars, errors, cache.

The grammar-level tests run on every backend (`backend`: outlines, xgrammar, llguidance, through
the per-request interface the scheduler uses); the vocabulary, the regex helpers and the outlines
schema-to-regex translation are the outlines backend's own.

A random walk simulates sampling at temperature 1.0 without a model: from a fresh state, pick a
random allowed token from the mask (seeded; EOS with probability 1/2 when allowed, and half of
the other steps an allowed token that follows the shortest completion, so walks finish), decode
with the real tokenizer, and check the text against the grammar. The shortest completion comes
from the spec's regex (outlines' translation), whatever backend is walked. Each grammar is
compiled once per module and backend.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import outlines_core
import pytest
import torch
from grammar_backends_testing import ENDS_BEFORE_EOS, GRAMMAR_BACKENDS, Backend, grammar_backend
from radixlm_testing import accepts_text

from radixlm.runtime.bench.workloads import W4_SCHEMA
from radixlm.runtime.constrained import GrammarError, backends
from radixlm.runtime.constrained.numeric_regex import bounded_number_regex, integer_range_regex
from radixlm.runtime.constrained.regex_syntax import rewrite_regex
from radixlm.runtime.constrained.spec import normalize_spec, spec_to_regex
from radixlm.runtime.constrained.vocabulary import byte_fallback_token_bytes, get_grammar_vocabulary
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

EXTRA_IDS = 64  # model logits wider than the tokenizer, as with padded embedding tables
MAX_WALK_LEN = 200


_ADDRESS = {
    "type": "object",
    "properties": {
        "street": {"type": "string", "maxLength": 20},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        "country": {"enum": ["US", "UK", "FR"]},
    },
    "required": ["street", "zip", "country"],
}
_LEAVES = [
    {"type": "string"},
    {"type": "string", "minLength": 2, "maxLength": 6},
    {"type": "string", "pattern": r"^[A-Z]{2}-\d{3}$"},
    {"type": "string", "pattern": "^.{1,8}$"},
    {"type": "string", "format": "email"},
    {"type": "string", "format": "uuid"},
    {"type": "integer"},
    {"type": "integer", "minimum": 0, "maximum": 120},
    {"type": "integer", "exclusiveMinimum": -5, "maximum": 5},
    {"type": "number"},
    {"type": "number", "minimum": 0, "maximum": 1},
    {"type": "number", "exclusiveMinimum": -273.15},
    {"type": "boolean"},
    {"type": "null"},
    {"enum": ["red", "green", "blue"]},
    {"enum": ["a", 1, None, True, 2.5]},
    {"const": "v1"},
    {"type": ["string", "null"]},
    {"type": ["integer", "null"], "minimum": 10, "maximum": 20},
    {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "integer", "minimum": 0, "maximum": 9}]},
    {"type": "array", "items": {"type": "integer", "minimum": -3, "maximum": 3}, "maxItems": 4},
    {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 2, "maxItems": 3},
]


def _object(properties: dict, required: list[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
    }


def _fixed_schemas() -> list[dict]:
    # Free-form {"type": "object"} / {"type": "array"} are left out: ~13 s each to compile.
    big = {f"field_{k}": leaf for k, leaf in enumerate(_LEAVES[:19])} | {"address": _ADDRESS}
    return [
        W4_SCHEMA,
        _object({"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
        _object({"id": {"type": "integer", "minimum": 1}, "tags": _LEAVES[20] | {"minItems": 1}}),
        _object({"person": _object({"name": {"type": "string"}, "address": _ADDRESS})}),
        _object(
            {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}}, required=["b"]
        ),
        _object({"a": {"type": "integer"}, "b": {"type": "null"}}, required=[]),
        {
            "type": "array",
            "items": _object({"x": {"type": "number"}, "y": {"type": "number"}}),
            "maxItems": 3,
        },
        {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "type": "integer",
            "minimum": 0,
            "exclusiveMinimum": True,
            "maximum": 100,
        },
        {"type": "string", "pattern": "^[^@]+@[^@]+$"},
        {"type": "string", "format": "date"},
        _object({"dt": {"type": "string", "format": "date-time"}, "t": {"type": "string", "format": "time"}}),
        {"oneOf": [{"type": "boolean"}, {"type": "null"}]},
        {
            "type": "object",
            "properties": {"home": {"$ref": "#/$defs/addr"}, "work": {"$ref": "#/$defs/addr"}},
            "required": ["home"],
            "$defs": {
                "addr": _object(
                    {"street": {"type": "string"}, "n": {"type": "integer", "minimum": 1, "maximum": 999}}
                )
            },
        },
        _object({"version": {"const": "1.0"}, "kind": {"const": 3}}),
        {
            "type": "array",
            "prefixItems": [{"type": "integer"}, {"type": "string", "maxLength": 4}, {"type": "boolean"}],
        },
        {"type": "array", "items": _LEAVES[20], "maxItems": 3},
        _object(
            {
                "level1": _object(
                    {"level2": _object({"level3": {"type": "array", "items": {"type": "boolean"}}})}
                )
            }
        ),
        {"type": "object", "additionalProperties": {"type": "integer"}},
        _object(big, required=[name for k, name in enumerate(big) if k % 3 != 2]),
    ] + [_object({"value": leaf}) for leaf in _LEAVES]


def _generated_schema(rng: random.Random, depth: int = 0) -> dict:
    """A random object of 1-4 properties: leaves, and (shallowly) nested objects and arrays."""
    properties = {}
    for k in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.15 and depth < 2:
            properties[f"obj_{k}"] = _generated_schema(rng, depth + 1)
        elif roll < 0.25 and depth < 2:
            properties[f"list_{k}"] = {
                "type": "array",
                "items": rng.choice(_LEAVES),
                "maxItems": rng.randint(1, 3),
            }
        else:
            properties[f"p_{k}"] = rng.choice(_LEAVES)
    return _object(properties, required=[name for name in properties if rng.random() < 0.7])


def _schemas() -> list[dict]:
    """The fixed varied list plus seeded generated objects (>= 50 in all)."""
    rng = random.Random(5)
    return _fixed_schemas() + [_generated_schema(rng) for _ in range(12)]


SCHEMAS = _schemas()
REGEXES = {
    "int": r"-?(0|[1-9][0-9]*)",
    "float": r"-?(0|[1-9][0-9]*)\.[0-9]+([eE][+-]?[0-9]+)?",
    "iso_date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "email": r"[a-z0-9._%+-]{1,20}@[a-z0-9-]{1,12}(\.[a-z0-9-]{1,8}){0,2}\.[a-z]{2,6}",
    "unicode": r"(café|naïve|日本語|[äöüß]{1,4}) ?✓?",
}
CHOICES = ["yes", "no", "maybe so", "a.b*c (d)", "naïve"]


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Tokenizer:
    return Tokenizer(default_model_dir)


@pytest.fixture(scope="module", params=GRAMMAR_BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def backend(backend_name: str, tokenizer: Tokenizer) -> Iterator[Backend]:
    with grammar_backend(backend_name, tokenizer, tokenizer.vocab_size + EXTRA_IDS, max_cache=256) as backend:
        yield backend


@pytest.fixture(scope="module")
def schema_futures(backend: Backend) -> list[Future[Any]]:
    """Every schema submitted at once, so compiles overlap with the walks of earlier ones."""
    return [backend.get("json_schema", schema) for schema in SCHEMAS]


class ShortestCompletion:
    """Shortest completions of a regex, over the byte DFA outlines-core builds for one-byte tokens.

    Walks use it to bias toward finishing: half the non-EOS steps take an allowed token that is a
    prefix of the shortest completion of the text so far. Like the backend, it compiles the regex
    followed by a NUL end marker (token 256), so accepting states keep all their transitions.

    A walk is tracked as a set of DFA states. The regex is outlines' translation of the spec; a
    context-free backend may allow text outside its language (an escape, a format written
    differently). Such text is a gap: tracking goes on from every state reachable from where the
    language was left, and the text after the gap narrows the set down again (a JSON key does).
    """

    _BYTE_VOCABULARY = outlines_core.Vocabulary(
        1000, {bytes([b]): [b] for b in range(1, 256)} | {b"\x00": [256]}
    )

    def __init__(self, regex: str):
        self.regex = regex
        self.index = outlines_core.Index(f"(?:{regex})\\x00", self._BYTE_VOCABULARY)
        self.initial = frozenset([self.index.get_initial_state()])
        transitions = self.index.get_transitions()
        self.transitions = {s: {t: n for t, n in ts.items() if t < 256} for s, ts in transitions.items()}
        finals = self.index.get_final_states()
        predecessors: dict[int, list[int]] = {}
        for state, byte_to_next in self.transitions.items():
            for next_state in byte_to_next.values():
                predecessors.setdefault(next_state, []).append(state)
        self.distance = {s: 0 for s, ts in transitions.items() if ts.get(256) in finals}
        frontier = list(self.distance)
        while frontier:  # breadth-first, backwards from the complete states
            state = frontier.pop(0)
            for previous in predecessors.get(state, []):
                if previous not in self.distance:
                    self.distance[previous] = self.distance[state] + 1
                    frontier.append(previous)

    def advance(self, states: frozenset[int], data: bytes) -> frozenset[int]:
        for byte in data:
            after = frozenset(n for s in states if self.distance.get(n := self.transitions[s].get(byte, -1)) is not None)
            if not after:  # a gap: the rest of `data` is in it
                return self._reachable(states)
            states = after
        return states

    def _reachable(self, states: frozenset[int]) -> frozenset[int]:
        seen, frontier = set(states), list(states)
        while frontier:
            for n in self.transitions[frontier.pop()].values():
                if n in self.distance and n not in seen:
                    seen.add(n)
                    frontier.append(n)
        return frozenset(seen)

    def shortest(self, states: frozenset[int]) -> bytes:
        """The shortest completion from the nearest-to-complete of `states`."""
        out = bytearray()
        state = min(states, key=self.distance.__getitem__)
        while self.distance[state]:
            byte, state = min(
                (
                    (b, n)
                    for b, n in self.transitions[state].items()
                    if self.distance.get(n) == self.distance[state] - 1
                )
            )
            out.append(byte)
        return bytes(out)


def random_walk(
    compiled: Any,
    rng: random.Random,
    completion: ShortestCompletion,
    eos: int,
    id_to_bytes: dict[int, bytes],
    bytes_to_ids: dict[bytes, list[int]],
) -> list[int]:
    """Token ids of one completed walk (EOS excluded) through any backend's grammar, by its
    generic per-request interface; restarts walks that hit MAX_WALK_LEN."""
    mask = torch.zeros(compiled.vocab_size, dtype=torch.bool)
    for _ in range(10):
        grammar, ids, states = compiled.new_state(), [], completion.initial
        while not grammar.is_terminated() and len(ids) < MAX_WALK_LEN:
            grammar.fill_vocab_mask(mask)
            allowed = np.flatnonzero(mask.numpy())
            assert allowed.size > 0, "a live grammar state allows no token"
            rest = completion.shortest(states)
            closing = [i for k in range(len(rest)) for i in bytes_to_ids.get(rest[: k + 1], []) if mask[i]]
            if not closing and hasattr(grammar, "closing_ids"):  # a CFG backend's layout: its own plan
                closing = (grammar.closing_ids() or [])[:1]
            if mask[eos] and rng.random() < 0.5:
                token_id = eos
            elif closing and rng.random() < 0.5:
                token_id = rng.choice(closing)
            else:
                token_id = int(allowed[rng.randrange(allowed.size)])
            grammar.accept_token(token_id)
            if token_id != eos:
                assert token_id in id_to_bytes, f"the mask allows the special token {token_id}"
                ids.append(token_id)
                states = completion.advance(states, id_to_bytes[token_id])
        if grammar.is_terminated():
            return ids
    raise AssertionError(f"no walk finished within {MAX_WALK_LEN} tokens for {completion.regex[:80]!r}")


@functools.cache
def _bytes_to_ids(tokenizer: Tokenizer) -> dict[bytes, list[int]]:
    bytes_to_ids: dict[bytes, list[int]] = {}
    for token_id, token_bytes in get_grammar_vocabulary(tokenizer).id_to_bytes.items():
        bytes_to_ids.setdefault(token_bytes, []).append(token_id)
    return bytes_to_ids


def walk_texts(compiled: Any, kind: str, spec: object, tokenizer: Tokenizer, seed: int, n: int) -> list[str]:
    """Texts of `n` seeded random walks through `compiled` (the grammar of (kind, spec) on any
    backend), each decoded by the real tokenizer (checked byte-exact)."""
    rng = random.Random(seed)
    id_to_bytes = dict(get_grammar_vocabulary(tokenizer).id_to_bytes)
    completion = ShortestCompletion(spec_to_regex(kind, normalize_spec(kind, spec)))
    texts = []
    for _ in range(n):
        ids = random_walk(compiled, rng, completion, tokenizer.eos_token_id, id_to_bytes, _bytes_to_ids(tokenizer))
        text = tokenizer.decode(ids)
        assert text == b"".join(id_to_bytes[i] for i in ids).decode("utf-8")
        texts.append(text)
    return texts


def assert_only_eos_follows(grammar: Any, backend_name: str, eos: int) -> None:
    """The text so far is complete and cannot go on: the mask allows EOS alone; the grammar is
    terminated once EOS is accepted (before, where the backend says so: ENDS_BEFORE_EOS)."""
    mask = torch.zeros(grammar.compiled.vocab_size, dtype=torch.bool)
    grammar.fill_vocab_mask(mask)
    assert mask.nonzero().flatten().tolist() == [eos]
    assert grammar.is_terminated() == (backend_name in ENDS_BEFORE_EOS)
    grammar.accept_token(eos)
    assert grammar.is_terminated()
    with pytest.raises(ValueError):
        grammar.accept_token(eos)


# ---------------------------------------------------------------- vocabulary


def test_vocabulary_maps_ids_to_decoded_strings(tokenizer: Tokenizer) -> None:
    vocab = get_grammar_vocabulary(tokenizer)
    assert vocab is get_grammar_vocabulary(tokenizer)  # built once per tokenizer
    assert vocab.vocabulary.get_eos_token_id() == tokenizer.eos_token_id
    assert not set(vocab.id_to_bytes) & set(tokenizer.all_special_ids)
    ascii_ids = [i for i, b in vocab.id_to_bytes.items() if b.isascii()]
    assert len(ascii_ids) > 30_000
    for token_id in ascii_ids:
        assert tokenizer.decode([token_id]) == vocab.id_to_bytes[token_id].decode(), token_id
    assert vocab.id_to_bytes[tokenizer.encode(" the")[0]] == b" the"


def test_partial_utf8_tokens_are_raw_bytes(tokenizer: Tokenizer, backend_name: str, backend: Backend) -> None:
    id_to_bytes = get_grammar_vocabulary(tokenizer).id_to_bytes
    text = '"héllo 🙂 日本語 ✓"'
    ids = tokenizer.encode(text)
    assert b"".join(id_to_bytes[i] for i in ids) == text.encode()
    partial = [i for i in ids if not _is_utf8(id_to_bytes[i])]
    assert partial, "expected the emoji to split into partial UTF-8 tokens"
    grammar = backend.get("regex", r'"[^"]*"').result().new_state()
    for token_id in ids:
        grammar.accept_token(token_id)
    assert_only_eos_follows(grammar, backend_name, tokenizer.eos_token_id)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_byte_fallback_tokens() -> None:
    assert byte_fallback_token_bytes("\u2581the") == b" the"
    assert byte_fallback_token_bytes("<0xE2>") == b"\xe2"
    assert byte_fallback_token_bytes("<0x0A>") == b"\n"


# ---------------------------------------------------------------- regex helpers


def test_integer_range_regex_is_exact() -> None:
    rng = random.Random(0)
    for _ in range(60):
        low = rng.choice([None, rng.randint(-300, 300)])
        high = rng.choice([None, rng.randint(-300, 300)])
        regex = integer_range_regex(low, high)
        for value in range(-400, 400):
            expected = (low is None or value >= low) and (high is None or value <= high)
            assert (regex is not None and re.fullmatch(regex, str(value)) is not None) == expected
        assert regex is None or not any(re.fullmatch(regex, bad) for bad in ("-0", "01", "+1", ""))


def test_bounded_number_regex_is_sound() -> None:
    rng = random.Random(1)
    literals = [
        f"{sign}{i}{frac}" for sign in ("", "-") for i in range(0, 30) for frac in ("", ".5", ".05", ".0")
    ]
    for _ in range(200):
        low, high = (
            rng.choice([None, rng.uniform(-20, 20), rng.randint(-20, 20)]),
            rng.choice([None, 1, 2.5, 17]),
        )
        is_low_open, is_high_open = rng.random() < 0.4, rng.random() < 0.4
        regex = bounded_number_regex(low, high, exclusive_min=is_low_open, exclusive_max=is_high_open)
        for literal in literals:
            if regex is not None and re.fullmatch(regex, literal):
                value = float(literal)
                assert low is None or (value > low if is_low_open else value >= low)
                assert high is None or (value < high if is_high_open else value <= high)
    assert re.fullmatch(bounded_number_regex(0, 1, exclusive_min=True, exclusive_max=True) or "", "0.25")


def test_rewrite_regex() -> None:
    assert rewrite_regex(r"\d{4}-[\d.]", in_json_string=False) == r"[0-9]{4}-[0-9.]"
    assert rewrite_regex(r"[^\d]\\d", in_json_string=False) == r"[^\d]\\d"
    json_safe = rewrite_regex(r".+@[^@]+\s\S", in_json_string=True)
    for bad in ('a"@b x', "a@b\n x", "a\\@b x"):
        assert not re.fullmatch(json_safe, bad)
    assert re.fullmatch(json_safe, "a@b x")


def test_time_format_fraction_is_a_literal_dot() -> None:
    """outlines-core's `time` regex let a backslash and any character stand for the dot (found by
    the engine test running every schema at temperature 1.0: `"07:39:34\\*7"`, invalid JSON)."""
    regex = spec_to_regex("json_schema", normalize_spec("json_schema", {"type": "string", "format": "time"}))
    assert re.fullmatch(regex, '"07:39:34.25Z"') and re.fullmatch(regex, '"23:59:00"')
    assert not re.fullmatch(regex, '"07:39:34\\*7"')


def test_email_format_is_json_safe() -> None:
    """outlines-core's `email` regex admitted a quoted local part and address literals with raw
    quotes, backslashes and control characters (found by the engine test running every schema at
    temperature 1.0): `{"value":""a"@b.co"}` matched. Only the dot-atom form is kept."""
    schema = {"type": "object", "properties": {"value": {"type": "string", "format": "email"}}, "required": ["value"]}
    regex = spec_to_regex("json_schema", normalize_spec("json_schema", schema))
    for good in ('{"value":"a.b+c@mail.example.org"}', '{"value":"x@y.co"}'):
        assert re.fullmatch(regex, good) and json.loads(good)
    for bad in ('{"value":""a"@b.co"}', '{"value":"a@[1.2.3.4]"}', '{"value":"a@[1.2.3.a:\x01"]"}', '{"value":"a@b"}'):
        assert not re.fullmatch(regex, bad), bad


# ---------------------------------------------------------------- random walks


def test_at_least_fifty_varied_schemas() -> None:
    assert len(SCHEMAS) >= 50
    text = json.dumps(SCHEMAS)
    for keyword in (
        "minimum",
        "maxItems",
        "minItems",
        "enum",
        "pattern",
        "maxLength",
        "boolean",
        "null",
        "$ref",
    ):
        assert keyword in text, keyword


@pytest.mark.parametrize("schema_index", range(len(SCHEMAS)))
def test_json_schema_walks_validate(schema_index: int, backend_name: str, schema_futures: list[Future[Any]],
                                    tokenizer: Tokenizer) -> None:
    schema = SCHEMAS[schema_index]
    compiled = schema_futures[schema_index].result(timeout=120)
    for text in walk_texts(compiled, "json_schema", schema, tokenizer, seed=schema_index, n=3):
        jsonschema.validate(json.loads(text), schema)


def test_format_dates_use_ascii_digits(backend: Backend, tokenizer: Tokenizer) -> None:
    schema = {"type": "string", "format": "date"}
    compiled = backend.get("json_schema", schema).result()
    for text in walk_texts(compiled, "json_schema", schema, tokenizer, seed=7, n=5):
        assert re.fullmatch(r'"[0-9]{4}-[0-9]{2}-[0-9]{2}"', text), text


@pytest.mark.parametrize("name", sorted(REGEXES))
def test_regex_walks_fullmatch(name: str, backend: Backend, tokenizer: Tokenizer) -> None:
    compiled = backend.get("regex", REGEXES[name]).result()
    for text in walk_texts(compiled, "regex", REGEXES[name], tokenizer, seed=len(name), n=8):
        assert re.fullmatch(REGEXES[name], text), text


def test_choice_walks_pick_a_choice(backend: Backend, tokenizer: Tokenizer) -> None:
    compiled = backend.get("choices", CHOICES).result()
    texts = walk_texts(compiled, "choices", CHOICES, tokenizer, seed=3, n=20)
    assert set(texts) <= set(CHOICES) and len(set(texts)) >= 3


# ---------------------------------------------------------------- grammar state and mask


def test_mask_eos_and_termination(backend_name: str, backend: Backend, tokenizer: Tokenizer) -> None:
    compiled = backend.get("regex", "[0-9]{1,2}").result()
    grammar, eos = compiled.new_state(), tokenizer.eos_token_id
    mask = torch.ones(compiled.vocab_size, dtype=torch.bool)
    grammar.fill_vocab_mask(mask)
    assert not mask[eos] and not mask[tokenizer.vocab_size :].any() and mask.sum() == 10
    with pytest.raises(ValueError):
        grammar.accept_token(eos)
    with pytest.raises(ValueError):
        grammar.accept_token(tokenizer.encode("a")[0])
    grammar.accept_token(tokenizer.encode("1")[0])
    grammar.fill_vocab_mask(mask)
    assert mask[eos] and mask.sum() == 11 and not grammar.is_terminated()
    grammar.accept_token(tokenizer.encode("2")[0])
    assert_only_eos_follows(grammar, backend_name, eos)
    fresh = grammar.copy()
    assert not fresh.is_terminated() and fresh.compiled is compiled


def test_accepting_states_keep_extensions(backend: Backend, tokenizer: Tokenizer) -> None:
    """outlines-core alone drops "." after "1" here (its DFA flags matches one byte late)."""
    grammar = backend.get("regex", r"[0-9]+(\.[0-9]+)?").result().new_state()
    grammar.accept_token(tokenizer.encode("1")[0])
    mask = torch.zeros(grammar.compiled.vocab_size, dtype=torch.bool)
    grammar.fill_vocab_mask(mask)
    assert mask[tokenizer.eos_token_id] and mask[tokenizer.encode(".")[0]]
    partial = backend.get("regex", "[a-zé]+").result().new_state()
    partial.accept_token(tokenizer.encode("a")[0])
    partial.fill_vocab_mask(mask)
    e_acute_first_byte = next(
        i for i, b in get_grammar_vocabulary(tokenizer).id_to_bytes.items() if b == b"\xc3"
    )
    assert mask[e_acute_first_byte]
    choices = backend.get("choices", ["no", "no."]).result()
    assert set(walk_texts(choices, "choices", ["no", "no."], tokenizer, seed=1, n=12)) == {"no", "no."}


def test_mask_excludes_ids_beyond_tokenizer(backend_name: str, backend: Backend, tokenizer: Tokenizer) -> None:
    grammar = backend.get("regex", '"[^"]*"').result().new_state()
    grammar.accept_token(tokenizer.encode('"')[0])
    rows = torch.zeros(3, tokenizer.vocab_size + EXTRA_IDS, dtype=torch.bool)
    grammar.fill_vocab_mask(rows[1])
    assert rows[1].sum() > 40_000 and not rows[1, tokenizer.vocab_size :].any()
    assert not rows[0].any() and not rows[2].any()
    assert not rows[1, sorted(tokenizer.all_special_ids)].any()


# ---------------------------------------------------------------- errors and the backend

CFG_BACKENDS = [name for name in GRAMMAR_BACKENDS if name != "outlines"]


def _everywhere(message: str) -> dict[str, str]:
    return dict.fromkeys(GRAMMAR_BACKENDS, message)


def _on_cfg(message: str) -> dict[str, str]:
    return dict.fromkeys(CFG_BACKENDS, message)


# (kind, spec, the reason in each refusing backend's GrammarError, and for the backends that serve
# the spec (those missing from the refusals) an output it forbids and one it allows)
BAD_SPECS: list[tuple[str, object, dict[str, str], tuple[str, str] | None]] = [
    ("regex", "(", {"outlines": "unterminated subpattern", "xgrammar": "parenthesis is not closed",
                    "llguidance": 'invalid regex "("'}, None),
    ("regex", 5, {"outlines": "must be a string"} | _on_cfg("must be a non-empty string"), None),
    ("json_schema", "{not json", _everywhere("not valid JSON"), None),
    ("json_schema", "[1, 2]", _everywhere("must be a JSON object"), None),
    ("json_schema", {"type": "string", "format": "ipv4"}, {"outlines": "ipv4"}, ('"abc"', '"1.2.3.4"')),
    ("json_schema", {"not": {"type": "string"}}, {"outlines": "unsupported JSON schema",
                                                   "xgrammar": "unsupported JSON schema keyword 'not'",
                                                   "llguidance": 'Unimplemented keys: ["not"]'}, None),
    ("json_schema", {"type": "integer", "multipleOf": 3}, {"outlines": "multipleOf"}, ("4", "9")),
    ("json_schema", {"type": "object", "properties": {}, "required": ["x"]}, {"outlines": "'x'", "xgrammar": "'x'"},
     ("{}", '{"x": 1}')),
    ("json_schema", {"type": "integer", "minimum": 5, "maximum": 3}, {
        "outlines": "admit no value", "xgrammar": "minimum greater than maximum",
        "llguidance": "minimum (5) is greater than maximum (3)"}, None),
    ("json_schema", {"type": "string", "pattern": "[a-"}, {
        "outlines": "pattern at #", "xgrammar": "Unclosed '['", "llguidance": "regex parse error"}, None),
    ("choices", [], _everywhere("non-empty"), None),
]
@pytest.mark.parametrize("row", range(len(BAD_SPECS)), ids=[f"{kind}-{json.dumps(spec)}" for kind, spec, *_ in BAD_SPECS])
def test_bad_specs_raise_at_validation(row: int, backend_name: str, backend: Backend, tokenizer: Tokenizer) -> None:
    """A spec a backend cannot serve is refused with its reason by its lowering (`backends.lower_on`,
    quick, no compile) and by the compile; one it serves, it honours. (The door, `validate`, gives
    a JSON schema one engine refuses to another: tests/runtime/test_schema_engines.py.)"""
    kind, spec, refusals, outputs = BAD_SPECS[row]
    message = refusals.get(backend_name)
    if message is not None:
        with pytest.raises(GrammarError, match=re.escape(message)):
            backends.lower_on(backend_name, kind, spec)
        with pytest.raises(GrammarError, match=re.escape(message)):
            backend.get(kind, spec).result(timeout=30)
        return
    assert outputs is not None
    backends.lower_on(backend_name, kind, spec)
    compiled = backend.get(kind, spec).result(timeout=30)
    forbidden, allowed = outputs
    assert (accepts_text(compiled, tokenizer, forbidden), accepts_text(compiled, tokenizer, allowed)) == (False, True)


def test_unknown_kinds_are_refused(backend_name: str, backend: Backend) -> None:
    with pytest.raises(GrammarError, match=f"the {backend_name} grammar backend cannot serve grammar grammars"):
        backends.validate(backend_name, "grammar", "x")
    with pytest.raises(GrammarError, match="unknown grammar kind 'grammar'"):
        backend.get("grammar", "x").result(timeout=30)


LOOKBEHIND_REFUSALS = {"outlines": "unsupported regex syntax", "xgrammar": "Lookbehind is not supported",
                       "llguidance": "invalid regex"}


def test_unsupported_regex_is_refused(backend_name: str, backend: Backend) -> None:
    """outlines' quick check takes Python's regex syntax, so lookbehind fails at compile only; the
    context-free backends refuse it at the door already."""
    if backend_name == "outlines":
        backends.validate(backend_name, "regex", "(?<=a)b")
    else:
        with pytest.raises(GrammarError, match=LOOKBEHIND_REFUSALS[backend_name]):
            backends.validate(backend_name, "regex", "(?<=a)b")
    with pytest.raises(GrammarError, match=LOOKBEHIND_REFUSALS[backend_name]):
        backend.get("regex", "(?<=a)b").result(timeout=30)


@pytest.mark.parametrize("name", GRAMMAR_BACKENDS)
def test_backend_compiles_in_background_and_caches(name: str, tokenizer: Tokenizer) -> None:
    with grammar_backend(name, tokenizer, tokenizer.vocab_size, max_cache=2) as backend:
        schema = W4_SCHEMA
        future = backend.get("json_schema", schema)  # a future at once; compiled in a worker
        assert future.result(timeout=60).compile_secs > 0
        again = backend.get("json_schema", json.dumps(schema))  # same spec, as a JSON string
        assert again is future and again.done()
        backend.get("regex", "a").result(timeout=60)
        backend.get("regex", "b").result(timeout=60)  # evicts the schema (LRU of 2)
        assert backend.get("json_schema", schema) is not future


def test_outlines_serves_recursive_refs_to_a_bounded_depth() -> None:
    """The documented bound (README, `grammar_backend`): with the outlines backend a `$ref` to an
    ancestor is unrolled so that the root's descendants may nest 3 levels; the context-free
    backends (xgrammar, llguidance) serve any depth."""
    from radixlm.runtime.constrained.json_schema import schema_to_regex

    tree = {"type": "object", "required": ["name", "children"],
            "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}}

    def nested(depth: int) -> str:
        node: dict = {"name": "a", "children": []}
        for _ in range(depth):
            node = {"name": "a", "children": [node]}
        return json.dumps(node, separators=(",", ":"))

    regex = schema_to_regex(tree)
    assert all(re.fullmatch(regex, nested(depth)) for depth in range(4))
    assert not re.fullmatch(regex, nested(4))
