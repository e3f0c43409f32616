"""The reasoning gate: a request's grammar applies after its reasoning ends. TokenSequenceMatcher
(the scheduler's watch for the end-of-reasoning token ids) against its definition (the first
position where the ids so far end with the target), and the gate in the in-process Engine with the
outlines grammar backend (the server tests use xgrammar: tests/server/test_reasoning_http.py), on the
scripted tiny model, also through the language's Engine backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from radixlm_testing import FALLBACK_DIGIT, REASONING_SCRIPT, assert_engine_clean

import radixlm as rl
from radixlm.runtime.scheduler.token_matcher import TokenSequenceMatcher


@given(st.lists(st.integers(0, 2), min_size=1, max_size=5), st.lists(st.integers(0, 2), max_size=40))
def test_finds_the_first_occurrence_once(target: list[int], ids: list[int]) -> None:
    matcher = TokenSequenceMatcher(target)
    first = next((i for i in range(len(ids)) if ids[: i + 1][-len(target):] == target), None)
    for i, token in enumerate(ids):
        assert matcher.advance(token) == (i == first), (i, first)
        assert matcher.is_found == (first is not None and i >= first)


def test_overlapping_starts_and_an_empty_target() -> None:
    matcher = TokenSequenceMatcher([7, 7, 9])  # `</`, `think`, `>` are three ids in SmolLM2's vocabulary
    assert [matcher.advance(t) for t in (7, 7, 7, 9, 7, 7, 9)] == [False, False, False, True, False, False, False]
    with pytest.raises(ValueError, match="empty"):
        TokenSequenceMatcher([])


@pytest.fixture(scope="module")
def engine(scripted_model_dir: Path) -> Iterator[Any]:
    from radixlm.runtime.engine import Engine

    with Engine(str(scripted_model_dir), max_total_tokens=1024, grammar_backend="outlines",
                reasoning_parser="deepseek-r1") as engine:
        yield engine


def test_the_grammar_waits_for_the_end_of_the_reasoning(engine: Any) -> None:
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is two plus two?"}])
    params = {"max_new_tokens": 32, "regex": "[0-9]+"}
    gated = engine.generate(prompt, params, require_reasoning=True)
    assert gated["text"] == "".join(REASONING_SCRIPT[:2]) + FALLBACK_DIGIT
    assert gated["meta_info"]["finish_reason"]["type"] == "stop"
    assert engine.generate(prompt, params)["text"] == FALLBACK_DIGIT  # a grammar from the first token
    free = engine.generate(prompt, {"max_new_tokens": 32}, require_reasoning=True)["text"]
    assert free == "".join(REASONING_SCRIPT)  # no grammar: require_reasoning changes nothing
    assert_engine_clean(engine)


def test_language_on_the_engine_backend(engine: Any) -> None:
    @rl.function
    def solve(s: Any) -> None:
        s += rl.user("What is two plus two?")
        s += rl.assistant(rl.separate_reasoning(rl.gen("n", max_tokens=32, regex="[0-9]+", n=2), model_type="deepseek-r1"))

    state = solve.run(backend=engine)
    assert state["n_reasoning_content"] == [REASONING_SCRIPT[0]] * 2 and state["n"] == [FALLBACK_DIGIT] * 2


def test_an_unknown_reasoning_parser_is_refused_at_startup() -> None:
    import argparse

    from radixlm.runtime.config.server_args import ServerArgs, add_cli_args

    with pytest.raises(ValueError, match="reasoning_parser must be one of deepseek-r1, kimi, qwen3, qwen3-thinking, got 'r1'"):
        ServerArgs(reasoning_parser="r1")
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    assert parser.parse_args(["--reasoning-parser", "qwen3"]).reasoning_parser == "qwen3"
    with pytest.raises(SystemExit):
        parser.parse_args(["--reasoning-parser", "r1"])  # argparse names the choices
