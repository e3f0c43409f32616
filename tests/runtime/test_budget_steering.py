"""Constrained output that always parses, on every grammar backend: when the tokens left are just
enough for the shortest way to finish, decoding is steered to finish (outlines: the mask, by exact
token distances over the token index; xgrammar and llguidance: a sampled token after which the
closing plan would not fit is replaced by the plan's first token, `closing.ClosingSearch`).
`meta_info.finish_reason` then says `closed_by_budget`; a budget below the shortest output is
refused with its minimum."""

from __future__ import annotations

import json
import random
import re
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from grammar_backends_testing import GRAMMAR_BACKENDS, backend_engine
from radixlm_testing import assert_engine_clean
from test_constrained import SCHEMAS
from test_engine_constrained import near_uniform_model_dir  # noqa: F401 (a fixture)

from radixlm.runtime.bench import workloads as wl
from radixlm.runtime.constrained import backends
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.grammar import GrammarBackend
from radixlm.runtime.constrained.vocabulary import END_MARKER_TOKEN_ID
from radixlm.runtime.engine import Engine
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

VALIDATOR = jsonschema.Draft202012Validator
FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("time")
def _is_time(instance: object) -> bool:
    """RFC 3339's time, offset optional: jsonschema's own check (without rfc3339-validator) takes
    only offset-free times, so it refuses the "20:40:54Z" the context-free engines write."""
    return not isinstance(instance, str) or bool(
        re.fullmatch(r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?",
                     instance))


def validate(schema: dict, text: str) -> None:
    VALIDATOR(schema, format_checker=FORMATS).validate(json.loads(text))


def brute_force_min_tokens(compiled: Any) -> int:
    """Breadth-first over the token index from the start, every allowed token tried: the fewest
    tokens after which the end marker is allowed into a final state."""
    index = compiled.index
    start = index.get_initial_state()
    seen, queue = {start: 0}, deque([start])
    while queue:
        state = queue.popleft()
        if compiled.is_complete(state):
            return seen[state]
        for token in index.get_allowed_tokens(state) or []:
            if token in (END_MARKER_TOKEN_ID, compiled.eos_token_id):
                continue
            successor = index.get_next_state(state, token)
            if successor not in seen:
                seen[successor] = seen[state] + 1
                queue.append(successor)
    raise AssertionError("the grammar cannot complete")


@pytest.fixture(scope="module")
def backend(default_model_dir: Path) -> Any:
    grammars = GrammarBackend(Tokenizer(str(default_model_dir)), 49152)
    yield grammars
    grammars.shutdown()


GRAMMARS = {
    "w4 schema": ("json_schema", json.dumps(wl.W4_SCHEMA)),
    "tree schema": ("json_schema", json.dumps(
        {"type": "object", "properties": {"name": {"type": "string", "minLength": 3},
                                          "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2}},
         "required": ["name", "tags"]})),
    "regex": ("regex", r"(ab|cd){3}[0-9]{2,4}-(yes|no)"),
    "choices": ("choices", ["a considerably longer choice", "short one", "middle choice"]),
}


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_min_tokens_is_the_exact_shortest_path(backend: GrammarBackend, name: str) -> None:
    compiled = backend.get(*GRAMMARS[name]).result()
    assert compiled.min_tokens() == brute_force_min_tokens(compiled) > 0


@pytest.mark.parametrize("backend_name", [b for b in GRAMMAR_BACKENDS if b != "outlines"])
@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_cfg_closing_plan_completes_the_grammar(default_model_dir: Path, backend_name: str, name: str) -> None:
    """The context-free backends' plan from the start (and from a state inside a string) is a
    complete output of the grammar, and `min_tokens` counts its tokens."""
    tokenizer = Tokenizer(str(default_model_dir))
    grammars = backends.create(backend_name, tokenizer, 49152, num_workers=1, enable_jump_forward=True,
                               whitespace_pattern=None)
    try:
        kind, spec = GRAMMARS[name]
        state = grammars.get(kind, spec).result().new_state()
        plan = state.closing_ids()
        assert plan and state.min_tokens() == len(plan)
        text = tokenizer.decode(plan)
        if kind == "json_schema":
            validate(json.loads(spec), text)
        else:
            assert re.fullmatch("|".join(map(re.escape, spec)) if kind == "choices" else spec, text), text
        if name == "tree schema":
            for token_id in tokenizer.encode('{"name": "abcd'):
                state.accept_token(token_id)
            rest = state.closing_ids()
            assert rest is not None
            validate(json.loads(spec), '{"name": "abcd' + tokenizer.decode(rest))
    finally:
        grammars.shutdown()


CRON = {"type": "object", "properties": {"cron": {"type": "string", "pattern": r"^(((\d+,)+\d+|\*) ?){5,6}$"}},
        "required": ["cron"], "additionalProperties": False}


@pytest.mark.parametrize("backend_name", [b for b in GRAMMAR_BACKENDS if b != "outlines"])
def test_cfg_closing_plan_leaves_a_two_byte_cycle(default_model_dir: Path, backend_name: str) -> None:
    """A cron field (meltano's schedules): from `0` the search's byte order takes `,` then `0`
    forever; after the unit `0,` three times it must leave by another byte (` `, the next field),
    and the plan completes the schema."""
    tokenizer = Tokenizer(str(default_model_dir))
    grammars = backends.create(backend_name, tokenizer, 49152, num_workers=1, enable_jump_forward=True,
                               whitespace_pattern=None)
    try:
        state = grammars.get("json_schema", json.dumps(CRON)).result().new_state()
        plan = state.closing_ids()
        assert plan is not None
        validate(CRON, tokenizer.decode(plan))
    finally:
        grammars.shutdown()


@pytest.fixture(scope="module", params=GRAMMAR_BACKENDS)
def engine(request: pytest.FixtureRequest, tiny_engine: Engine, tiny_model_dir: Path) -> Iterator[Engine]:
    """The tiny model's engine on each grammar backend."""
    with backend_engine(request.param, tiny_engine, tiny_model_dir) as engine:
        yield engine


def _min_tokens(engine: Engine, kind: str, spec: object) -> int:
    """The shortest output of the grammar the door serves the spec with (a JSON schema may go to
    another engine than the server's: docs/json-schema.md)."""
    lowered = backends.validate(engine.server_args.grammar_backend, kind, spec)
    shortest = engine.grammar_backend.get_lowered(lowered).result().new_state().min_tokens()
    assert isinstance(shortest, int) and shortest > 0
    return shortest


def test_budget_of_exactly_the_minimum_succeeds_and_one_less_is_refused(engine: Engine) -> None:
    schema = json.loads(GRAMMARS["tree schema"][1])
    minimum = _min_tokens(engine, *GRAMMARS["tree schema"])
    params = {"temperature": 1.0, "json_schema": json.dumps(schema), "seed": 3}
    ok = engine.generate(prompt="tree:", sampling_params={**params, "max_new_tokens": minimum})
    assert ok["meta_info"]["completion_tokens"] == minimum
    assert ok["meta_info"]["finish_reason"] == {"type": "length", "matched": minimum, "closed_by_budget": True}
    validate(schema, ok["text"])
    refused = engine.generate(prompt="tree:", sampling_params={**params, "max_new_tokens": minimum - 1})
    reason = refused["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and refused["text"] == ""
    assert reason["message"] == (f"invalid grammar: max_new_tokens={minimum - 1} cannot hold the shortest output "
                                 f"this grammar allows ({minimum} tokens)")
    assert_engine_clean(engine)


def test_regex_and_choices_close_within_their_budget(engine: Engine) -> None:
    kind, pattern = GRAMMARS["regex"]
    choices = GRAMMARS["choices"][1]
    regex_min = _min_tokens(engine, kind, pattern)
    params = [{"temperature": 1.0, "seed": seed, "max_new_tokens": regex_min + extra, "regex": pattern}
              for seed, extra in enumerate([0, 1, 2, 5, 9])]
    choice_min = _min_tokens(engine, "regex", "|".join(map(re.escape, choices)))
    params += [{"temperature": 1.0, "seed": seed, "max_new_tokens": choice_min + extra,
                "regex": "|".join(map(re.escape, choices))} for seed, extra in enumerate([0, 1, 3])]
    outs = engine.generate(prompt=["go:"] * len(params), sampling_params=params)
    for p, out in zip(params, outs):
        assert out["meta_info"]["completion_tokens"] <= p["max_new_tokens"]
        assert re.fullmatch(p["regex"], out["text"]), (p, out)
    assert_engine_clean(engine)


@pytest.mark.parametrize("backend_name", GRAMMAR_BACKENDS)
def test_every_schema_closes_within_small_budgets_at_temperature_one(near_uniform_model_dir: Path,  # noqa: F811
                                                                     backend_name: str) -> None:
    """SCHEMAS (>= 50) at temperature 1.0 on the near-uniform model (a random walk through each
    grammar: unbounded strings and arrays run long), each with a budget of its minimum plus 0-24
    tokens: every output validates (formats checked), and the ones cut by the budget say so."""
    assert len(SCHEMAS) >= 50
    engine = Engine(str(near_uniform_model_dir), max_total_tokens=len(SCHEMAS) * 256, random_seed=0,
                    grammar_backend=backend_name)
    rng = random.Random(0)
    try:
        specs = [json.dumps(schema) for schema in SCHEMAS]
        minima = [_min_tokens(engine, "json_schema", spec) for spec in specs]
        budgets = [m + rng.choice([0, 1, 3, 8, 24]) for m in minima]
        params = [{"temperature": 1.0, "seed": i, "json_schema": spec, "max_new_tokens": budget}
                  for i, (spec, budget) in enumerate(zip(specs, budgets))]
        outs = engine.generate(prompt=[f"object {i}:" for i in range(len(SCHEMAS))], sampling_params=params)
        assert_engine_clean(engine)
    finally:
        engine.shutdown()
    failures, closed = [], 0
    for i, (out, schema, budget) in enumerate(zip(outs, SCHEMAS, budgets)):
        reason = out["meta_info"]["finish_reason"]
        closed += reason.get("closed_by_budget", False)
        if reason["type"] not in ("stop", "length") or out["meta_info"]["completion_tokens"] > budget:
            failures.append(f"schema {i}: {reason} after {out['meta_info']['completion_tokens']} of {budget} tokens")
            continue
        try:
            validate(schema, out["text"])
        except (ValueError, jsonschema.ValidationError) as e:
            failures.append(f"schema {i} (budget {budget}): {out['text']!r} is not valid: {str(e).splitlines()[0]}")
    assert not failures, "\n".join(failures)
    # the context-free backends plan character by character (longer minima, so roomier budgets): ~40% here
    assert closed >= len(SCHEMAS) // 3, f"only {closed} outputs were closed by their budget"


@pytest.mark.parametrize("backend_name", GRAMMAR_BACKENDS)
def test_w4_on_the_default_model_parses_with_48_tokens(default_model_dir: Path, backend_name: str) -> None:
    """W4's 16 extractions with max_new_tokens cut to 48 (W4 itself allows 160): every output is
    complete JSON under W4's schema."""
    engine = Engine(None, max_total_tokens=8192, random_seed=0, grammar_backend=backend_name)
    try:
        cases = wl.w4_cases()
        params = {"temperature": 0.0, "max_new_tokens": 48, "json_schema": json.dumps(wl.W4_SCHEMA)}
        outs = engine.generate(prompt=[case["prompt"] for case in cases], sampling_params=params)
    finally:
        engine.shutdown()
    for out in outs:
        assert out["meta_info"]["completion_tokens"] <= 48
        validate(wl.W4_SCHEMA, out["text"])
    if backend_name == "outlines":  # llguidance's outputs all end within 48 tokens on their own here
        assert any(out["meta_info"]["finish_reason"].get("closed_by_budget") for out in outs)


RECURSIVE = {
    "tree": {"type": "object", "required": ["name", "children"],
             "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}},
    "mutual": {"$defs": {"dept": {"type": "object", "required": ["title", "staff"], "properties": {
                   "title": {"type": "string"}, "staff": {"type": "array", "items": {"$ref": "#/$defs/person"}}}},
               "person": {"type": "object", "required": ["name"], "properties": {
                   "name": {"type": "string"}, "manages": {"$ref": "#/$defs/dept"},
                   "kind": {"anyOf": [{"enum": ["staff", "lead"]}, {"$ref": "#/$defs/dept"}]}}}},
               "$ref": "#/$defs/dept"},
}


@pytest.fixture(scope="module")
def outlines_engine(tiny_model_dir: Path) -> Iterator[Engine]:
    with Engine(str(tiny_model_dir), max_total_tokens=4096, random_seed=0, grammar_backend="outlines") as engine:
        yield engine


@pytest.mark.parametrize("name", sorted(RECURSIVE))
def test_recursive_schemas_give_valid_json_at_the_outlines_depth_bound(outlines_engine: Engine, name: str) -> None:
    """The outlines backend unrolls references to a bounded depth; where it stops, what needs the
    reference is pruned (an empty array, an absent optional property, one branch fewer), so random
    walks deep into the recursion still give valid JSON."""
    schema = RECURSIVE[name]
    params = [{"temperature": 1.0, "seed": seed, "max_new_tokens": 200, "json_schema": json.dumps(schema)}
              for seed in range(12)]
    outs = outlines_engine.generate(prompt=["json:"] * len(params), sampling_params=params)
    for out in outs:
        validate(schema, out["text"])
    assert_engine_clean(outlines_engine)


def test_a_recursion_that_cannot_bottom_out_is_refused(outlines_engine: Engine) -> None:
    """outlines refuses it at the door; the next engine (llguidance) takes it, and its search for
    an end refuses it as on the context-free backends."""
    endless = {"type": "object", "required": ["next"], "properties": {"next": {"$ref": "#"}}}
    with pytest.raises(GrammarError, match="no output of this recursive schema nests at most 3 levels"):
        backends.lower_on("outlines", "json_schema", endless)
    out = outlines_engine.generate(prompt="x", sampling_params={"json_schema": json.dumps(endless), "max_new_tokens": 50})
    assert out["meta_info"]["finish_reason"]["message"] == (
        "invalid grammar: no output of this grammar ends within 2048 bytes (a recursion with no way out?)")


@pytest.mark.parametrize("backend_name", [b for b in GRAMMAR_BACKENDS if b != "outlines"])
def test_cfg_backends_serve_recursion_exactly_and_close_it_within_the_budget(tiny_model_dir: Path,
                                                                              backend_name: str) -> None:
    """xgrammar and llguidance serve the recursive schemas with no depth bound; at temperature
    1.0 with budgets from the minimum up, every output validates; an endless recursion is refused."""
    with Engine(str(tiny_model_dir), max_total_tokens=8192, random_seed=0, grammar_backend=backend_name) as engine:
        params = []
        for _name, schema in sorted(RECURSIVE.items()):
            minimum = _min_tokens(engine, "json_schema", json.dumps(schema))
            params += [{"temperature": 1.0, "seed": seed, "max_new_tokens": minimum + extra,
                        "json_schema": json.dumps(schema)} for seed, extra in enumerate([0, 2, 10, 40, 120])]
        outs = engine.generate(prompt=["json:"] * len(params), sampling_params=params)
        for p, out in zip(params, outs):
            assert out["meta_info"]["completion_tokens"] <= p["max_new_tokens"]
            validate(json.loads(p["json_schema"]), out["text"])
        endless = {"type": "object", "required": ["next"], "properties": {"next": {"$ref": "#"}}}
        out = engine.generate(prompt="x", sampling_params={"json_schema": json.dumps(endless), "max_new_tokens": 50})
        assert out["meta_info"]["finish_reason"]["message"] == (
            "invalid grammar: no output of this grammar ends within 2048 bytes (a recursion with no way out?)")
        assert_engine_clean(engine)


@pytest.mark.parametrize("backend_name", GRAMMAR_BACKENDS)
def test_output_closes_at_the_context_limit_without_max_new_tokens(tiny_model_dir: Path, backend_name: str) -> None:
    """With `max_new_tokens=None` the context length is the budget: the output still parses,
    closed in the last tokens the context holds."""
    schema = json.loads(GRAMMARS["tree schema"][1])
    with Engine(str(tiny_model_dir), max_total_tokens=4096, random_seed=0, grammar_backend=backend_name,
                context_length=64) as engine:
        outs = engine.generate(prompt=["tree:"] * 4, sampling_params=[
            {"temperature": 1.0, "seed": seed, "max_new_tokens": None, "json_schema": json.dumps(schema)}
            for seed in range(4)])
        for out in outs:
            validate(schema, out["text"])
        assert any(out["meta_info"]["finish_reason"]["type"] == "length" for out in outs)
        assert_engine_clean(engine)
