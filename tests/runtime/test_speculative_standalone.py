"""STANDALONE speculative decoding (a draft model, `scheduler/draft_model.py`) on tiny random
models that share the default model's tokenizer: greedy outputs identical with and without it
(free text, a JSON schema, a regex, max_new_tokens), the target as its own draft accepting every
drafted token, both KV pools clean afterwards, and a draft model of another vocabulary refused
at start."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from radixlm_testing import assert_engine_clean, save_tiny_model

from radixlm.runtime.engine import Engine

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "score": {"type": "integer"}},
          "required": ["name", "score"]}
LOOP = "one two three one two three one two three one two"
CASES: list[tuple[str, dict[str, Any]]] = [
    (LOOP, {"temperature": 0.0, "max_new_tokens": 40}),
    (LOOP, {"temperature": 0.0, "max_new_tokens": 7}),  # exactly 7 tokens, drafts cut to fit
    ('{"name": "red"', {"temperature": 0.0, "max_new_tokens": 40, "json_schema": json.dumps(SCHEMA)}),
    ("ab-cd", {"temperature": 0.0, "max_new_tokens": 30, "regex": r"(ab|cd)(-(ab|cd)){2,12}"}),
]


@pytest.fixture(scope="module")
def draft_model_dir(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    """A smaller random llama (1 layer, other weights) with the target's tokenizer and vocabulary."""
    path = tmp_path_factory.mktemp("tiny-draft")
    save_tiny_model(path, "llama", vocab_size=49152, seed=1, tokenizer_dir=default_model_dir, num_hidden_layers=1)
    return path


def _engine(target: Path, draft: Path) -> Engine:
    return Engine(str(target), max_total_tokens=4096, random_seed=0, dtype="float32",
                  speculative_algorithm="STANDALONE", speculative_draft_model_path=str(draft))


@pytest.fixture(scope="module")
def self_drafted(tiny_model_dir: Path) -> Iterator[Engine]:
    engine = _engine(tiny_model_dir, tiny_model_dir)
    yield engine
    engine.shutdown()


def _run(engine: Engine) -> list[dict[str, Any]]:
    prompts = [p for p, _ in CASES]
    outs = engine.generate(prompt=prompts, sampling_params=[params for _, params in CASES])
    assert isinstance(outs, list)
    return outs


def _assert_clean(engine: Engine) -> None:
    assert_engine_clean(engine)  # the target's pools, and (check_integrity) the draft model's
    draft = engine.scheduler.drafter.draft_model
    assert draft is not None and draft.kv_pool.num_free == draft.kv_pool.max_total_num_tokens


def test_outputs_equal_with_a_smaller_draft_model(tiny_engine: Engine, tiny_model_dir: Path,
                                                  draft_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, draft_model_dir)
    try:
        got, want = _run(engine), _run(tiny_engine)
        assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
        assert len(got[1]["output_ids"]) == 7
        metas = [o["meta_info"] for o in got]
        assert sum(m.get("spec_num_proposed_drafts", 0) for m in metas) > 0  # the draft model drafted
        _assert_clean(engine)
    finally:
        engine.shutdown()


def test_the_target_as_its_own_draft_accepts_every_token(self_drafted: Engine, tiny_engine: Engine) -> None:
    got, want = _run(self_drafted), _run(tiny_engine)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    free = got[0]["meta_info"]  # free text: every draft is the model's own greedy continuation
    assert free["spec_num_proposed_drafts"] > 0
    assert free["spec_num_correct_drafts"] == free["spec_num_proposed_drafts"]
    # constrained: drafted under the grammar's mask, so they hit too (the random model may refuse
    # jump-forward's spelling of forced text, which wastes the draft that follows it)
    assert all(o["meta_info"]["spec_num_correct_drafts"] > 0 for o in got[2:])
    _assert_clean(self_drafted)


def test_a_draft_model_of_another_vocabulary_is_refused(tiny_model_dir: Path, default_model_dir: Path,
                                                        tmp_path: Path) -> None:
    save_tiny_model(tmp_path, "llama", vocab_size=256, tokenizer_dir=default_model_dir)
    with pytest.raises(ValueError, match="must share the target's tokenizer, but its vocabulary has 256 tokens"):
        _engine(tiny_model_dir, tmp_path)


def test_retraction_frees_the_draft_models_slots(tiny_engine: Engine, tiny_model_dir: Path) -> None:
    """Pools too small for the batch: requests are retracted and resumed (their draft K/V freed
    and rebuilt), outputs stay those without speculation, and neither pool leaks."""
    prompts = [f"one two three one two three {i} one two three one two" for i in range(6)]
    params = [{"temperature": 0.0, "max_new_tokens": 40}] * 6
    want = tiny_engine.generate(prompts, params)
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=128, chunked_prefill_size=32, random_seed=0,
                speculative_algorithm="STANDALONE", speculative_draft_model_path=str(tiny_model_dir)) as engine:
        engine.generate(prompts, params)  # lowers admission's new-token ratio: the next run over-admits
        assert engine.flush_cache()
        got = engine.generate(prompts, params)
        assert engine.scheduler.num_retractions > 0
        assert isinstance(got, list) and isinstance(want, list)
        assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
        _assert_clean(engine)
