"""Constrained decoding through the engine: the FSM mask is applied in the batched sampler, so
constrained and free requests share a batch, and every output obeys its grammar."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from radixlm_testing import assert_engine_clean

from radixlm.runtime.engine import Engine

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(tiny_engine: Engine) -> Engine:
    return tiny_engine


@pytest.fixture(autouse=True)
def clean_pool(engine: Engine) -> Any:
    yield
    assert_engine_clean(engine)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_regex_and_schema_outputs_are_valid_in_a_mixed_batch(engine: Engine, temperature: float) -> None:
    base = {"temperature": temperature, "max_new_tokens": 80}
    params = [
        {**base, "regex": r"-?[0-9]{1,6}"},
        {**base, "regex": r"(cat|dog|bird)s?"},
        {**base, "json_schema": json.dumps(SCHEMA)},
        {**base, "max_new_tokens": 10},  # free, in the same batch
        {**base, "regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"},
    ]
    outs = engine.generate(prompt=["a", "b", "c", "d", "e"], sampling_params=params)
    assert re.fullmatch(r"-?[0-9]{1,6}", outs[0]["text"])
    assert re.fullmatch(r"(cat|dog|bird)s?", outs[1]["text"])
    jsonschema.validate(json.loads(outs[2]["text"]), SCHEMA)
    assert outs[3]["meta_info"]["completion_tokens"] == 10
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", outs[4]["text"])
    for out in (outs[0], outs[1], outs[2], outs[4]):
        assert out["meta_info"]["finish_reason"]["type"] == "stop"


def test_bad_grammar_finishes_with_a_clear_error(engine: Engine) -> None:
    out = engine.generate(prompt="x", sampling_params={"regex": "(unclosed"})
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert "invalid grammar" in out["meta_info"]["finish_reason"]["message"]
    ok = engine.generate(prompt="x", sampling_params={"regex": "[ab]{3}", "temperature": 0})
    assert re.fullmatch("[ab]{3}", ok["text"])
