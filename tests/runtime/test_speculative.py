"""Speculative decoding (--speculative-algorithm NGRAM): the n-gram index against a brute-force
search, drafts cut by the grammar, outputs (greedy, logprobs, seeded) identical with and without
speculation on every grammar backend with the KV pool clean afterwards (also when requests draft
from earlier requests' outputs), accepted drafts on a copying prompt of the default model, and
sampled outputs following the target distribution whatever the draft (a chi-square test)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from grammar_backends_testing import GRAMMAR_BACKENDS, backend_engine
from hypothesis import given
from hypothesis import strategies as st
from radixlm_testing import assert_engine_clean

from radixlm.runtime.config.server_args import ServerArgs
from radixlm.runtime.engine import Engine
from radixlm.runtime.scheduler.ngram_draft import NgramIndex, TokenSeq
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.speculative import Drafter

# ---------------------------------------------------------------- the n-gram index


def _brute_force(seq: list[int], min_window: int, max_window: int, max_tokens: int) -> list[int]:
    """The continuation of the earlier occurrence of seq's last min_window tokens whose context
    agrees longest (up to max_window), the latest among equals."""
    end, best, best_len = len(seq), -1, 0
    for nxt in range(min_window, end):
        length = 0
        while length < max_window and nxt - length - 1 >= 0 and seq[nxt - length - 1] == seq[end - length - 1]:
            length += 1
        if length >= min_window and length >= best_len:
            best, best_len = nxt, length
    return [] if best < 0 else seq[best : best + max_tokens]


@given(st.lists(st.integers(0, 3), min_size=1, max_size=60), st.integers(1, 3), st.integers(0, 4),
       st.lists(st.integers(1, 5), min_size=1, max_size=6))
def test_ngram_index_matches_a_brute_force_search(seq: list[int], min_window: int, extra: int,
                                                  growth: list[int]) -> None:
    """Incremental (the index catches up as the sequence grows) and equal to a full search."""
    index = NgramIndex(min_window, min_window + extra)
    output: list[int] = []
    prompt = seq[: len(seq) // 2 + 1]
    rest = seq[len(prompt) :]
    for step in [0, *growth]:
        output.extend(rest[:step])
        rest = rest[step:]
        got = index.propose(TokenSeq(prompt, output), [], 5)
        assert got == _brute_force(prompt + output, min_window, min_window + extra, 5)


def test_ngram_proposal_continues_after_a_forced_tail() -> None:
    index = NgramIndex(2, 4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    assert index.propose(TokenSeq(prompt, [9, 3]), [4], 3) == [5, 6, 7]  # ...3, 4 (forced) -> 5, 6, 7
    assert index.propose(TokenSeq(prompt, [9, 3]), [], 3) == []  # one token matched: under min_window
    with pytest.raises(ValueError, match="min_window"):
        NgramIndex(3, 2)


def test_a_copy_grows_its_draft_and_keeps_its_source() -> None:
    """Full hits double the allowance (4, 8, 15: MAX_NGRAM_ALLOWANCE) and the next draft reads on
    from the same source position; a miss halves it and a fresh lookup follows."""
    from radixlm.runtime.config.speculative_config import SpeculativeConfig
    from radixlm.runtime.scheduler.speculative import MAX_NGRAM_ALLOWANCE

    span = list(range(100, 160))  # a long span to copy, then the output copies it
    req = Req("r", [1, 2, *span, 3], _greedy(), frozenset())
    req.params = replace(req.params, max_new_tokens=None)
    drafter = Drafter(SpeculativeConfig(num_draft_tokens=4))
    req.output_ids = [100, 101, 102]
    sizes = []
    for _ in range(4):
        draft = drafter.draft(req, [], 100)
        done = len(req.output_ids)
        assert draft == span[done : done + len(draft)]
        new_ids = span[done : done + len(draft) + 1]  # the target agrees, and its next token too
        req.output_ids.extend(new_ids)
        drafter.record_verify(req, draft, new_ids)
        sizes.append(len(draft))
        assert req.ngram_copy_next == 2 + len(req.output_ids)  # the source's next position
    assert sizes == [4, 8, MAX_NGRAM_ALLOWANCE, MAX_NGRAM_ALLOWANCE]
    draft = drafter.draft(req, [], 100)
    req.output_ids.append(7)  # the target disagrees at once
    drafter.record_verify(req, draft, [7])
    assert req.ngram_allowance == MAX_NGRAM_ALLOWANCE // 2 and req.ngram_copy_next is None


def test_settings_are_sglangs_and_checked() -> None:
    args = ServerArgs(speculative_algorithm="NGRAM", speculative_num_draft_tokens=3)
    assert args.speculative is not None and args.speculative.num_draft_tokens == 3
    default = ServerArgs().speculative  # NGRAM for constrained requests only
    assert default is not None and default.algorithm == "NGRAM" and default.constrained_only
    assert args.speculative is not None and not args.speculative.constrained_only
    assert ServerArgs(speculative_algorithm="NONE").speculative is None
    with pytest.raises(ValueError, match="STANDALONE only"):
        ServerArgs(speculative_algorithm="NONE", speculative_draft_model_path="/x")
    with pytest.raises(ValueError, match="STANDALONE only"):
        ServerArgs(speculative_draft_model_path="/x")
    with pytest.raises(ValueError, match="STANDALONE needs --speculative-draft-model-path"):
        ServerArgs(speculative_algorithm="STANDALONE")
    with pytest.raises(ValueError, match="STANDALONE only"):
        ServerArgs(speculative_algorithm="NGRAM", speculative_draft_model_path="/x")
    with pytest.raises(ValueError, match="must be one of NGRAM, STANDALONE, NONE"):
        ServerArgs(speculative_algorithm="EAGLE")
    with pytest.raises(ValueError, match="min_match_window_size"):
        ServerArgs(speculative_algorithm="NGRAM", speculative_ngram_min_match_window_size=5,
                   speculative_ngram_max_match_window_size=2)


# ---------------------------------------------------------------- engine: on == off

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "tags": {"type": "array", "items": {"enum": ["red", "green"]}},
                   "score": {"type": "integer"}},
    "required": ["name", "tags", "score"],
}
REGEX = r"(ab|cd)(-(ab|cd)){2,12}"
SPEC = {"speculative_algorithm": "NGRAM", "speculative_ngram_min_match_window_size": 1}


def _cases() -> list[tuple[str, dict[str, Any]]]:
    base = {"temperature": 0.0, "max_new_tokens": 40}
    loop = "one two three one two three one two three one two"
    return [
        (loop, base),
        (loop, {**base, "max_new_tokens": 7}),  # exactly 7 tokens, drafts cut to fit
        (loop, {**base, "stop": ["three one"]}),
        ("ab-cd-ab-cd-ab", {**base, "regex": REGEX}),
        ('{"name": "red", "tags": ["red", "red"]}', {**base, "json_schema": json.dumps(SCHEMA)}),
        (loop, {**base, "frequency_penalty": 0.3, "repetition_penalty": 1.2}),
        (loop, {**base, "temperature": 1.0, "top_k": 3, "seed": 5}),  # seeded: the same draw per position
    ]


@pytest.fixture(scope="module", params=GRAMMAR_BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def engine_off(backend_name: str, tiny_engine: Engine, tiny_model_dir: Path) -> Iterator[Engine]:
    with backend_engine(backend_name, tiny_engine, tiny_model_dir, speculative_algorithm="NONE") as engine:
        yield engine


@pytest.fixture(scope="module")
def engine_spec(backend_name: str, tiny_engine: Engine, tiny_model_dir: Path) -> Iterator[Engine]:
    with backend_engine(backend_name, tiny_engine, tiny_model_dir, **SPEC) as engine:
        yield engine


def _run(engine: Engine, cases: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Two requests at a time (few rows: drafts are not cut by the step budget)."""
    outs: list[dict[str, Any]] = []
    for i in range(0, len(cases), 2):
        part = cases[i : i + 2]
        got = engine.generate([p for p, _ in part], [s for _, s in part], return_logprob=True, top_logprobs_num=2)
        assert isinstance(got, list)
        outs += got
    assert_engine_clean(engine)
    return outs


def test_outputs_equal_with_and_without_speculation(engine_spec: Engine, engine_off: Engine) -> None:
    """Greedy free text, regex, JSON schema, stop strings, max_new_tokens, penalties and seeded
    sampling: the same tokens, finish reasons and (float32) logprobs; drafts were accepted."""
    cases = _cases()
    on, off = _run(engine_spec, cases), _run(engine_off, cases)
    for i, (a, b) in enumerate(zip(on, off)):
        assert a["output_ids"] == b["output_ids"], (i, a["text"], b["text"])
        assert a["text"] == b["text"] and a["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"], i
        got, want = a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]
        np.testing.assert_allclose([v for v, _, _ in got], [v for v, _, _ in want], atol=1e-4)
        assert [[t for _, t, _ in row] for row in a["meta_info"]["output_top_logprobs"]] == \
            [[t for _, t, _ in row] for row in b["meta_info"]["output_top_logprobs"]]
        assert "spec_verify_ct" not in b["meta_info"]
    assert on[1]["meta_info"]["completion_tokens"] == 7
    metas = [o["meta_info"] for o in on]
    assert all(m["spec_verify_ct"] <= m["completion_tokens"] for m in metas)
    assert sum(m["spec_num_correct_drafts"] for m in metas) > 0, metas
    assert sum(m["completion_tokens"] for m in metas) > sum(m["spec_verify_ct"] for m in metas)


def test_by_default_only_constrained_requests_draft(tiny_model_dir: Path) -> None:
    """--speculative-algorithm unset: the regex and JSON schema requests draft from their prompts,
    the free-text ones do not (no speculative counts in their meta_info); the outputs are those
    with drafting off (NONE)."""
    cases = _cases()
    flags = {"dtype": "float32", "max_total_tokens": 4096, "random_seed": 0, "speculative_ngram_min_match_window_size": 1}
    with Engine(str(tiny_model_dir), **flags) as engine:
        assert engine.scheduler.drafter.cfg is not None and engine.scheduler.drafter.cfg.constrained_only
        on = _run(engine, cases)
    with Engine(str(tiny_model_dir), speculative_algorithm="NONE", **flags) as engine:
        off = _run(engine, cases)
    for (_, params), a, b in zip(cases, on, off):
        assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]
        constrained = "regex" in params or "json_schema" in params
        assert (a["meta_info"].get("spec_num_proposed_drafts", 0) > 0) == constrained, (params, a["meta_info"])
        assert "spec_verify_ct" not in b["meta_info"]


def test_outputs_equal_with_drafts_from_earlier_requests(engine_spec: Engine, engine_off: Engine,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The cases one at a time, twice over, so that each request can draft from the outputs of
    those before it (the shared n-gram cache): the same tokens and logprobs as without
    speculation, and the cache did propose drafts."""
    assert engine_spec.flush_cache() and engine_off.flush_cache()
    cache = engine_spec.scheduler.drafter.ngram_cache
    assert cache is not None
    num_proposals = 0
    propose = cache.propose

    def counted(*args: Any) -> list[int]:
        nonlocal num_proposals
        got = propose(*args)
        num_proposals += bool(got)
        return got

    monkeypatch.setattr(cache, "propose", counted)
    for prompt, params in _cases() * 2:
        a, b = (e.generate(prompt, params, return_logprob=True) for e in (engine_spec, engine_off))
        assert a["output_ids"] == b["output_ids"], (prompt, params, a["text"], b["text"])
        np.testing.assert_allclose([v for v, _, _ in a["meta_info"]["output_token_logprobs"]],
                                   [v for v, _, _ in b["meta_info"]["output_token_logprobs"]], atol=1e-4)
        engine_spec.scheduler.check_integrity()  # the cache's index among the rest
    assert num_proposals > 0 and len(cache) == 2 * len(_cases())
    assert_engine_clean(engine_spec)
    assert len(cache) == 0  # flushed with the prefix cache


def test_ebnf_outputs_equal(backend_name: str, engine_spec: Engine, engine_off: Engine) -> None:
    if backend_name == "outlines":
        pytest.skip("the outlines backend serves no EBNF")
    grammar = 'root ::= item (", " item)*\nitem ::= "red" | "green" | "blue"' if backend_name == "xgrammar" else \
        'start: item (", " item)*\nitem: "red" | "green" | "blue"'
    cases = [("red, green, red, green, red", {"temperature": 0.0, "max_new_tokens": 30, "ebnf": grammar})]
    on, off = _run(engine_spec, cases), _run(engine_off, cases)
    assert on[0]["output_ids"] == off[0]["output_ids"]


def test_grammar_cuts_a_draft_where_it_refuses(engine_spec: Engine) -> None:
    """A draft copied from the prompt stops at the first token the regex refuses."""
    tok = engine_spec.tokenizer
    grammar = engine_spec.grammar_backend.get("regex", "[a-z]+( [a-z]+)*").result(timeout=60).new_state()
    prompt = tok.encode_plain("alpha beta gamma 123 delta")
    output = tok.encode_plain("alpha")
    req = Req("r", prompt, _greedy(), frozenset({tok.eos_token_id or 0}))
    req.output_ids = list(output)
    for token in output:
        grammar.accept_token(token)
    req.grammar = grammar
    draft = Drafter(engine_spec.server_args.speculative).draft(req, [], 16)
    text = tok.decode(draft)
    assert text.startswith(" beta gamma") and " beta gamma 123".startswith(text) and "1" not in text
    assert grammar.valid_prefix_len(draft) == len(draft)


@pytest.mark.parametrize("backend_name", GRAMMAR_BACKENDS)
def test_a_draft_stops_before_the_stop_token(backend_name: str, tiny_model_dir: Path) -> None:
    """A proposal that ends the grammar (an earlier output's EOS, copied by the n-gram cache) is
    cut before the stop token on every engine, so the mask rows along the draft never ask a
    finished matcher for its next mask (xgrammar's check failed there and took the scheduler
    down)."""
    from radixlm.runtime.constrained import backends
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer(tiny_model_dir)
    grammars = backends.create(backend_name, tok, tok.vocab_size, num_workers=1, enable_jump_forward=True,
                               whitespace_pattern=None)
    try:
        state = grammars.get("regex", "(ab)+").result(timeout=60).new_state()
        words = tok.encode_plain("abab")
        proposal = [*words, tok.eos_token_id, *words]
        cut = state.valid_prefix_len(proposal)
        assert cut == len(words)
        rows = torch.zeros(cut + 1, tok.vocab_size, dtype=torch.bool)
        state.fill_vocab_masks(rows, proposal[:cut])
        assert rows[cut, tok.eos_token_id]  # the draft complete: EOS allowed next
    finally:
        grammars.shutdown()


def _greedy() -> Any:
    from radixlm.runtime.sampling.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_new_tokens=16)


# ---------------------------------------------------------------- sampling follows the target


class _FixedDrafter(Drafter):
    """Proposes the same tokens after every step (an adversarial draft: the verifier must keep
    the target distribution whatever it is given)."""

    def __init__(self, tokens: list[int]):
        super().__init__(None)
        self.tokens = tokens

    def draft(self, req: Req, forced: list[int], max_len: int) -> list[int]:
        req.num_forced_draft = 0
        return self.tokens[: max(0, max_len)]


def _chi2_sf(stat: float, dof: int) -> float:
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_sampled_outputs_follow_the_target_distribution(tiny_model_dir: Path) -> None:
    """Sampling (top_k 3, unseeded: rows draw from the shared generator) with a fixed draft of the likeliest tokens against no draft:
    the joint frequencies of the first three output tokens agree (chi-square homogeneity test,
    p > 1e-6), and the drafts were accepted often enough to matter."""
    params = {"temperature": 1.0, "top_k": 3, "max_new_tokens": 3}
    prompt = "one two three one two"
    with Engine(str(tiny_model_dir), max_total_tokens=2048, random_seed=1, dtype="float32", **SPEC) as engine:
        greedy = engine.generate(prompt, {"temperature": 0.0, "max_new_tokens": 3})
        sched = engine.scheduler
        counts: dict[str, Counter[tuple[int, ...]]] = {}
        for name, drafter in (("spec", _FixedDrafter(greedy["output_ids"][1:])), ("off", Drafter(None))):
            sched.drafter = drafter
            outs = []
            for _ in range(4):  # 256 samples; a fixed drafter drafts at any batch size
                got = engine.generate(prompt, {**params, "n": 64})
                assert isinstance(got, list)
                outs += got
            counts[name] = Counter(tuple(o["output_ids"]) for o in outs)
        assert_engine_clean(engine)
    cells = sorted(set(counts["spec"]) | set(counts["off"]))
    table = np.array([[counts[n][c] for c in cells] for n in ("spec", "off")], dtype=np.float64)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    assert _chi2_sf(stat, len(cells) - 1) > 1e-6, (stat, counts)
    # the first drafted token (the greedy second token) was drawn in ~14% of the samples: the
    # verifier's rows mattered (12 is 4.5 standard deviations below the ~37 expected)
    assert sum(n for ids, n in counts["spec"].items() if ids[1] == greedy["output_ids"][1]) >= 12


# ---------------------------------------------------------------- the default model


@pytest.mark.slow
def test_w4_extraction_copies_spans_in_fewer_steps(default_model_dir: Path) -> None:
    """SmolLM2 on W4 passages (JSON whose values copy the passage), greedy, one at a time, as it
    ships (its Q4_1 weights times int8 activations): the same tokens with and without NGRAM, their
    logprobs equal to the bit (a verify row is computed as a one-row decode is: no cascade over
    one request's rows), n-gram drafts accepted, fewer forwards."""
    from radixlm.runtime.bench.workloads import W4_MAX_TOKENS, W4_SCHEMA, w4_cases

    cases = w4_cases()[:3]
    params = {"temperature": 0.0, "max_new_tokens": W4_MAX_TOKENS, "json_schema": json.dumps(W4_SCHEMA)}
    results: dict[bool, tuple[list[dict[str, Any]], int]] = {}
    with Engine(None, max_total_tokens=8192, speculative_algorithm="NGRAM") as engine:
        assert engine.runner.quantized_layers and engine.runner.cpu_kernels
        sched = engine.scheduler
        for drafter in (sched.drafter, Drafter(None)):  # one model load: speculation off by its drafter
            sched.drafter, before = drafter, sched.num_forwards
            outs = [engine.generate(c["prompt"], params, return_logprob=True) for c in cases]
            assert_engine_clean(engine)
            results[drafter.cfg is not None] = outs, sched.num_forwards - before  # type: ignore[assignment]
    (on, forwards_on), (off, forwards_off) = results[True], results[False]
    assert [o["output_ids"] for o in on] == [o["output_ids"] for o in off]
    assert [o["meta_info"]["output_token_logprobs"] for o in on] == [o["meta_info"]["output_token_logprobs"] for o in off]
    assert [o["text"] for o in on] == [o["text"] for o in off]
    assert all(json.loads(o["text"]) for o in on)
    assert sum(o["meta_info"]["spec_num_correct_drafts"] for o in on) >= len(cases)  # copied from the passages
    assert forwards_on < forwards_off, (forwards_on, forwards_off)


@pytest.mark.slow
def test_w6_extraction_drafts_from_earlier_outputs(default_model_dir: Path) -> None:
    """SmolLM2 on W6 documents one after another, as it ships: the same tokens and logprobs (to
    the bit) with drafts from earlier requests' outputs, with the request's own text only, and
    without speculation; the earlier outputs save forwards."""
    from radixlm.runtime.bench.copy_extraction import MAX_TOKENS, SCHEMA, cases

    params = {"temperature": 0.0, "max_new_tokens": MAX_TOKENS, "json_schema": json.dumps(SCHEMA)}
    prompts = [c["prompt"] for c in cases()[:5]]
    results: dict[str, tuple[list[Any], int]] = {}
    with Engine(None, max_total_tokens=8192, speculative_algorithm="NGRAM") as engine:
        sched = engine.scheduler
        cfg = sched.drafter.cfg
        assert cfg is not None and cfg.ngram_capacity > 0
        for name, drafter in (("cache", sched.drafter), ("own", Drafter(replace(cfg, ngram_capacity=0))),
                              ("off", Drafter(None))):
            assert engine.flush_cache()
            sched.drafter, before = drafter, sched.num_forwards
            outs = [engine.generate(p, params, return_logprob=True) for p in prompts]
            results[name] = [(o["output_ids"], o["meta_info"]["output_token_logprobs"]) for o in outs], \
                sched.num_forwards - before
            assert_engine_clean(engine)
    assert results["cache"][0] == results["own"][0] == results["off"][0]
    assert results["cache"][1] < results["own"][1] < results["off"][1], {k: v[1] for k, v in results.items()}


def test_outputs_equal_under_retraction(tiny_model_dir: Path) -> None:
    """A pool too small for the batch: drafts are dropped, requests retracted and resumed, and
    the outputs are those without speculation; no slot leaks."""
    prompts = [f"one two three one two three {i} one two three one two" for i in range(6)]
    params = [{"temperature": 0.0, "max_new_tokens": 40}] * 6
    outs = {}
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=128, chunked_prefill_size=32, random_seed=0,
                **SPEC) as engine:
        sched = engine.scheduler
        spec = sched.drafter
        for drafter in (spec, Drafter(None)):
            sched.drafter = drafter
            engine.generate(prompts, params)  # lowers admission's new-token ratio: the next run over-admits
            assert engine.flush_cache()
            before = sched.num_retractions
            got = engine.generate(prompts, params)
            assert isinstance(got, list) and sched.num_retractions > before
            assert_engine_clean(engine)
            outs[drafter.cfg is not None] = [o["output_ids"] for o in got]
        assert spec.num_correct_drafts > 0 and outs[True] == outs[False]
