"""Jump-forward decoding: drafts of the text a grammar forces, masks along a draft, and the
engine's output with jump-forward on equal to the output with it off (greedy, and seeded
sampling), with the KV pool clean afterwards, on every grammar backend; the outlines backend's
own forced texts (its byte DFA, drafts tokenized at the boundary) and whitespace pattern."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch
from grammar_backends_testing import (
    GRAMMAR_BACKENDS,
    Backend,
    backend_engine,
    grammar_backend,
)
from radixlm_testing import assert_engine_clean

from radixlm.runtime.bench.workloads import W4_MAX_TOKENS, W4_SCHEMA, w4_cases
from radixlm.runtime.constrained.jump_forward import draft_tokens
from radixlm.runtime.constrained.vocabulary import get_grammar_vocabulary
from radixlm.runtime.engine import Engine
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

# ---------------------------------------------------------------- grammar level


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Tokenizer:
    return Tokenizer(default_model_dir)


@pytest.fixture(scope="module", params=GRAMMAR_BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def backend(backend_name: str, tokenizer: Tokenizer) -> Iterator[Backend]:
    with grammar_backend(backend_name, tokenizer, tokenizer.vocab_size) as backend:
        yield backend


def _advance(grammar: Any, ids: list[int]) -> None:
    for token_id in ids:
        grammar.accept_token(token_id)


def _spelled(tokenizer: Tokenizer, ids: list[int]) -> bytes:
    id_to_bytes = get_grammar_vocabulary(tokenizer).id_to_bytes
    return b"".join(id_to_bytes[i] for i in ids)


def test_w4_key_is_forced_after_its_quote(backend_name: str, backend: Backend, tokenizer: Tokenizer) -> None:
    grammar = backend.get("json_schema", W4_SCHEMA).result(timeout=60).new_state()
    open_brace, quote = tokenizer.encode("{")[0], tokenizer.encode('"')[0]
    grammar.accept_token(open_brace)
    # outlines: `[ ]?` after `{`, a space or a quote; the context-free backends lay JSON out as
    # json.dumps does, so the first key is forced (llguidance holds back the space: it may merge)
    after_brace = _spelled(tokenizer, grammar.jump_forward_ids(open_brace, 16))
    assert b'"name": "'.startswith(after_brace) and bool(after_brace) == (backend_name != "outlines")
    grammar.accept_token(quote)
    draft = grammar.jump_forward_ids(quote, 16)
    assert _spelled(tokenizer, draft).startswith(b'name"') and b'name": "'.startswith(_spelled(tokenizer, draft))
    assert grammar.jump_forward_ids(quote, 1) == draft[:1]
    assert grammar.jump_forward_ids(quote, 0) == []


def test_draft_tokenizes_the_boundary_with_the_last_token(tokenizer: Tokenizer) -> None:
    id_to_bytes = get_grammar_vocabulary(tokenizer).id_to_bytes

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text)

    # `{"` + `name"` splits as `{"`, `name`, `"`: the last token stays, the rest is the draft
    assert tokenizer.encode('{"name"')[0] == tokenizer.encode('{"')[0]
    draft = draft_tokens(b'{"', b'name"', encode, id_to_bytes)
    assert draft == tokenizer.encode('{"name"')[1:]
    # `c` + `ats` is one token `cats`: the model already chose `c`, so `ats` is tokenized alone
    assert len(tokenizer.encode("cats")) == 1
    assert draft_tokens(b"c", b"ats", encode, id_to_bytes) == tokenizer.encode("ats")
    # a forced text that ends inside a character is cut before it; one that is only part of a
    # character gives no draft
    e_acute = "é".encode()
    assert b"".join(id_to_bytes[i] for i in draft_tokens(b"", b"caf" + e_acute[:1], encode, id_to_bytes)) == b"caf"
    assert draft_tokens(b"", e_acute[:1], encode, id_to_bytes) == []
    assert draft_tokens(b"", e_acute[1:], encode, id_to_bytes) == []  # starts mid-character


def test_multibyte_forced_text(backend_name: str, backend: Backend, tokenizer: Tokenizer) -> None:
    compiled = backend.get("choices", ["naïve", "naïf", "naé"]).result(timeout=60)
    grammar = compiled.new_state()
    na = tokenizer.encode("na")
    _advance(grammar, na)
    assert grammar.jump_forward_ids(na[-1], 16) == []  # ï and é share only their first byte
    grammar = compiled.new_state()
    ids = tokenizer.encode("naï")
    _advance(grammar, ids)
    draft = grammar.jump_forward_ids(ids[-1], 16)
    assert draft == [] or _spelled(tokenizer, draft) in (b"v", b"f")  # v / f: not forced
    grammar = backend.get("regex", "(ab|cd)é✓x+").result(timeout=60).new_state()
    first = tokenizer.encode("a")[0]
    grammar.accept_token(first)
    spelled = _spelled(tokenizer, grammar.jump_forward_ids(first, 16))
    # llguidance holds the x back: `x+` may go on in the same token
    assert spelled.startswith("bé✓".encode()) and "bé✓x".encode().startswith(spelled)


def test_masks_along_a_draft_equal_stepping(backend: Backend, tokenizer: Tokenizer) -> None:
    compiled = backend.get("json_schema", W4_SCHEMA).result(timeout=60)
    grammar = compiled.new_state()
    prefix = tokenizer.encode('{"name": "Ann", "')
    _advance(grammar, prefix)
    draft = grammar.jump_forward_ids(prefix[-1], 16)
    assert _spelled(tokenizer, draft).startswith(b'age"')
    rows = torch.zeros(len(draft) + 1, compiled.vocab_size, dtype=torch.bool)
    grammar.fill_vocab_masks(rows, draft)
    stepped = compiled.new_state()
    _advance(stepped, prefix)
    expected = torch.zeros(compiled.vocab_size, dtype=torch.bool)
    for j in range(len(draft) + 1):
        stepped.fill_vocab_mask(expected)
        assert torch.equal(rows[j], expected), j
        if j < len(draft):
            assert rows[j, draft[j]]
            stepped.accept_token(draft[j])
    grammar.fill_vocab_mask(expected)  # the state did not move
    assert torch.equal(rows[0], expected)
    assert grammar.jump_forward_ids(prefix[-1], 16) == draft
    with pytest.raises(ValueError):
        grammar.fill_vocab_masks(rows[:1], draft)


def test_drafts_agree_with_every_allowed_token(backend: Backend, tokenizer: Tokenizer) -> None:
    """Along random walks: where a draft is offered, every allowed token is a prefix of its text
    or extends it (the text is forced); where the mask leaves a choice (EOS, or allowed tokens
    whose first bytes differ), no draft is offered."""
    id_to_bytes = get_grammar_vocabulary(tokenizer).id_to_bytes
    rng = random.Random(0)
    specs = [("json_schema", W4_SCHEMA), ("regex", r"(cat|dog)s? [0-9]{2}-[0-9]{2}"),
             ("json_schema", {"type": "array", "items": {"enum": ["alpha", "alps", True]}, "maxItems": 3})]
    eos, num_drafts = tokenizer.eos_token_id, 0
    first_bytes = np.full(tokenizer.vocab_size, -1)  # -1: special tokens
    for token_id, data in id_to_bytes.items():
        first_bytes[token_id] = data[0]
    for kind, spec in specs:
        compiled = backend.get(kind, spec).result(timeout=60)
        mask = torch.zeros(compiled.vocab_size, dtype=torch.bool)
        for _ in range(4):
            grammar, last = compiled.new_state(), -1
            for _ in range(60):  # walks stop early; random tokens rarely close a free string
                if grammar.is_terminated():
                    break
                grammar.fill_vocab_mask(mask)
                allowed = np.flatnonzero(mask.numpy()[: tokenizer.vocab_size] & (first_bytes >= 0))
                draft = grammar.jump_forward_ids(last, 16) if last >= 0 else []
                spelled = _spelled(tokenizer, draft)
                if draft:
                    num_drafts += 1
                    assert mask[draft[0]]
                    for token_id in allowed:
                        data = id_to_bytes[token_id]
                        assert data.startswith(spelled) or spelled.startswith(data), (spelled, data)
                if mask[eos] or np.unique(first_bytes[allowed]).size > 1:
                    assert draft == [], (spelled, bool(mask[eos]))
                if mask[eos] and (allowed.size == 0 or rng.random() < 0.3):
                    break
                last = draft[0] if draft and rng.random() < 0.5 else int(allowed[rng.randrange(allowed.size)])
                grammar.accept_token(last)
    assert num_drafts > 20


def test_disabled_backend_builds_no_drafts(backend_name: str, backend: Backend, tokenizer: Tokenizer) -> None:
    first = tokenizer.encode("a")[0]
    drafts = []
    with grammar_backend(backend_name, tokenizer, tokenizer.vocab_size, enable_jump_forward=False) as disabled:
        for grammars in (backend, disabled):
            grammar = grammars.get("regex", "abc[0-9]").result(timeout=60).new_state()
            grammar.accept_token(first)
            drafts.append(_spelled(tokenizer, grammar.jump_forward_ids(first, 16)))
    assert drafts == [b"bc", b""]


# ---------------------------------------------------------------- engine: on == off

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "status": {"enum": ["active", "inactive", "archived"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 2},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "status", "score", "tags", "ok"],
    "additionalProperties": False,
}
REGEX = r"(id|key)-[0-9]{3}: (alpha|beta|gamma)\.(done|ready)"


def _params() -> list[dict[str, Any]]:
    base = {"temperature": 0.0, "max_new_tokens": 80}
    return [
        {**base, "json_schema": json.dumps(SCHEMA)},
        {**base, "regex": REGEX},
        {**base, "json_schema": json.dumps(W4_SCHEMA), "max_new_tokens": 120},
        {**base, "json_schema": json.dumps(SCHEMA), "frequency_penalty": 0.5, "repetition_penalty": 1.3},
        {**base, "json_schema": json.dumps(SCHEMA), "max_new_tokens": 27},  # closed by the budget (minimum: 20 outlines, 25 CFG)
        {**base, "max_new_tokens": 12},  # free, in the same batch
        {**base, "regex": REGEX, "temperature": 1.0, "seed": 7},  # seeded: same draw per position
        {**base, "json_schema": json.dumps(SCHEMA), "temperature": 1.0, "seed": 11},
        {**base, "regex": REGEX, "stop": ["beta"]},
    ]


@pytest.fixture(scope="module")
def engine_on(backend_name: str, tiny_engine: Engine, tiny_model_dir: Path) -> Iterator[Engine]:
    # no n-gram drafts (by default constrained requests draft): the tokens kept are forced ones
    with backend_engine(backend_name, tiny_engine, tiny_model_dir, speculative_algorithm="NONE") as engine:
        assert not engine.server_args.disable_jump_forward
        yield engine


@pytest.fixture(scope="module")
def engine_off(backend_name: str, tiny_engine: Engine, tiny_model_dir: Path) -> Iterator[Engine]:
    with backend_engine(backend_name, tiny_engine, tiny_model_dir, disable_jump_forward=True,
                        speculative_algorithm="NONE") as engine:
        yield engine


def _generate(engine: Engine, prompts: list[str], params: list[dict[str, Any]], **kw: Any) -> tuple[list[dict], int]:
    """Outputs and the number of draft tokens kept (each a decode step saved)."""
    before = engine.scheduler.num_jump_forward_tokens
    outs = engine.generate(prompt=prompts, sampling_params=params, **kw)
    assert isinstance(outs, list)
    assert_engine_clean(engine)
    return outs, engine.scheduler.num_jump_forward_tokens - before


def _assert_same(on: list[dict], off: list[dict]) -> None:
    for i, (a, b) in enumerate(zip(on, off)):
        assert a["text"] == b["text"], i
        assert a["output_ids"] == b["output_ids"], i
        assert a["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"], i
        assert a["meta_info"]["completion_tokens"] == b["meta_info"]["completion_tokens"], i


def test_outputs_equal_with_jump_forward_on_and_off(backend_name: str, engine_on: Engine, engine_off: Engine) -> None:
    """On each backend: the same outputs and logprobs, and jump-forward appended forced text."""
    params = _params()
    prompts = [f"request {i}:" for i in range(len(params))]
    on, kept = _generate(engine_on, prompts, params, return_logprob=True, top_logprobs_num=2)
    off, kept_off = _generate(engine_off, prompts, params, return_logprob=True, top_logprobs_num=2)
    assert kept > 0 and kept_off == 0
    _assert_same(on, off)
    for a, b in zip(on, off):
        got, want = a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]
        assert len(got) == a["meta_info"]["completion_tokens"] == len(a["meta_info"]["output_top_logprobs"])
        assert [t for _, t, _ in got] == [t for _, t, _ in want]
        np.testing.assert_allclose([v for v, _, _ in got], [v for v, _, _ in want], atol=1e-4)
    for out in (on[0], on[3], on[4], on[7]):
        jsonschema.validate(json.loads(out["text"]), SCHEMA)
    assert on[4]["meta_info"]["finish_reason"] == {"type": "length", "matched": 27, "closed_by_budget": True}
    assert "beta" not in on[8]["text"]


def test_outputs_equal_under_retraction(backend_name: str, tiny_model_dir: Path) -> None:
    """A pool too small for the batch: drafts are dropped, requests retracted and resumed."""
    regex = r"(item [0-9]: (alpha|beta|gamma)-value; ){5}"
    params = [{"temperature": 0.0, "max_new_tokens": 80, "regex": regex}] * 6
    prompts = [f"list {i}" for i in range(6)]
    outs = {}
    for disable in (False, True):
        # 96 slots: llguidance's outputs are shorter (its masks take "item" whole, not "it", "e", "m")
        engine = Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=96, chunked_prefill_size=32, random_seed=0,
                        disable_jump_forward=disable, grammar_backend=backend_name, speculative_algorithm="NONE")
        try:
            # the first run compiles the grammar and lowers admission's new-token ratio, so the
            # second admits too many requests at once and must retract some
            first, _ = _generate(engine, prompts, params)
            assert engine.flush_cache()
            outs[disable], kept = _generate(engine, prompts, params)
            _assert_same(first, outs[disable])
            assert engine.scheduler.num_retractions > 0
            assert (kept > 0) != disable
        finally:
            engine.shutdown()
    _assert_same(outs[False], outs[True])
    assert all(re.fullmatch(regex, out["text"]) for out in outs[False])


@pytest.mark.slow
def test_w4_outputs_equal_on_the_default_model(default_model_dir: Path) -> None:
    """SmolLM2 on W4 passages, greedy: the same JSON with jump-forward on and off, fewer steps on."""
    cases = w4_cases()[:4]
    params = {"temperature": 0.0, "max_new_tokens": W4_MAX_TOKENS, "json_schema": json.dumps(W4_SCHEMA)}
    results = {}
    for disable in (False, True):
        engine = Engine(None, dtype="float32", max_total_tokens=8192, disable_jump_forward=disable)
        try:
            results[disable] = _generate(engine, [c["prompt"] for c in cases], [params] * len(cases))
        finally:
            engine.shutdown()
    (on, kept), (off, _) = results[False], results[True]
    assert kept >= len(cases)  # at least one key's worth per output
    _assert_same(on, off)
    for out in on:
        obj = json.loads(out["text"])
        jsonschema.validate(obj, W4_SCHEMA)


def test_compact_whitespace_pattern_gives_compact_json_and_forces_more(tiny_model_dir: Path) -> None:
    """`constrained_json_whitespace_pattern=""`: no whitespace between JSON tokens, so every key
    (and `{"name":"` at the very start) is forced text that jump-forward appends; with the
    default `[ ]?` the model may put a space after `{`, `,` and `:`, so less is forced."""
    schema = {"type": "object", "required": ["name", "age"], "properties": {
        "name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0, "maximum": 99}}}
    forced, texts = {}, {}
    for pattern in (None, ""):
        engine = Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=2048, random_seed=0, grammar_backend="outlines",
                        constrained_json_whitespace_pattern=pattern)
        try:
            out = engine.generate(prompt="person:", sampling_params={
                "temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(schema)})
            forced[pattern], texts[pattern] = engine.scheduler.num_jump_forward_tokens, out["text"]
            assert out["meta_info"]["finish_reason"]["type"] == "stop"
            assert_engine_clean(engine)
        finally:
            engine.shutdown()
    value = json.loads(texts[""])
    jsonschema.validate(value, schema)
    assert texts[""] == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert forced[""] > forced[None], forced


@pytest.mark.parametrize("pattern", ["x", r"\s*", "[ ]+(", "a?"])
def test_whitespace_pattern_must_match_only_json_whitespace(pattern: str) -> None:
    from radixlm.runtime.config.server_args import ServerArgs

    with pytest.raises(ValueError, match="JSON whitespace pattern"):
        ServerArgs(constrained_json_whitespace_pattern=pattern, grammar_backend="outlines")


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_whitespace_pattern_is_refused_where_it_would_not_apply(backend_name: str) -> None:
    from radixlm.runtime.config.server_args import ServerArgs

    with pytest.raises(ValueError, match="applies to the outlines grammar backend only"):
        ServerArgs(constrained_json_whitespace_pattern="", grammar_backend=backend_name)
