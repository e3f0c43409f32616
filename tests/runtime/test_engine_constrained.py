"""Constrained decoding through the engine, on every grammar backend: the grammar mask is applied
in the batched sampler, so constrained and free requests share a batch, and every output obeys its
grammar."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from grammar_backends_testing import GRAMMAR_BACKENDS, backend_engine
from radixlm_testing import assert_engine_clean, save_tiny_model
from test_constrained import SCHEMAS

from radixlm.runtime.api.errors import RequestError
from radixlm.runtime.engine import Engine

# bounded, so that it finishes within max_new_tokens on the backends that do not steer by the budget
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "ok": {"type": "boolean"}},
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=GRAMMAR_BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def engine(backend_name: str, tiny_engine: Engine, tiny_model_dir: Path) -> Iterator[Engine]:
    with backend_engine(backend_name, tiny_engine, tiny_model_dir) as engine:
        yield engine


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


# each backend's reason for refusing the regex "(unclosed"
UNCLOSED_REGEX_ERRORS = {
    "outlines": r"sampling_params.regex: invalid regex '\(unclosed'",
    "xgrammar": r"sampling_params.regex: invalid regex grammar: Regex parsing error at position 10: The parenthesis is not closed",
    "llguidance": r'sampling_params.regex: invalid regex grammar: .*invalid regex "\(unclosed"',
}


def test_bad_grammar_is_refused_at_the_door(backend_name: str, engine: Engine) -> None:
    """The Engine checks grammars at the door as the server does (the same error text)."""
    with pytest.raises(RequestError, match=UNCLOSED_REGEX_ERRORS[backend_name]):
        engine.generate(prompt="x", sampling_params={"regex": "(unclosed"})
    ok = engine.generate(prompt="x", sampling_params={"regex": "[ab]{3}", "temperature": 0})
    assert re.fullmatch("[ab]{3}", ok["text"])


# The all-SCHEMAS test below: its length limit, its seeds and its model (a byte-level tokenizer,
# near-uniform logits).
SCHEMAS_MAX_NEW_TOKENS = 8192
SCHEMAS_SEED_OFFSET = 0  # request i samples with seed SCHEMAS_SEED_OFFSET + i
BYTE_MERGES = [('"', ","), ('"', "}"), ('"', ":"), ("{", '"'), ("\u0120", '"'), (".", '"')]  # \u0120: a space
NEAR_UNIFORM_INIT = 0.0005  # initializer_range of the near-uniform model
MAX_ABS_LOGIT = 0.08  # what the docstring's bound assumes of that model


def _save_byte_tokenizer(path: Path) -> None:
    """A byte-level BPE tokenizer: the 256 bytes, BYTE_MERGES (tokens that cross from a string into
    the JSON around it, as real vocabularies have) and an EOS, plus the config.json holding the EOS
    id that `save_tiny_model(tokenizer_dir=...)` copies into the model's config."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    token_to_id = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for left, right in BYTE_MERGES:
        token_to_id[left + right] = len(token_to_id)
    tokenizer = Tokenizer(models.BPE(token_to_id, BYTE_MERGES))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    path.mkdir()
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "config.json").write_text(json.dumps({"eos_token_id": tokenizer.token_to_id("<|endoftext|>")}))


@pytest.fixture(scope="module")
def near_uniform_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with the byte-level tokenizer, room for a short prompt and
    SCHEMAS_MAX_NEW_TOKENS, and weights so small that every logit is within MAX_ABS_LOGIT of 0
    (checked from the weights: |logit| <= max |final norm weight| * sqrt(hidden size) * max row
    norm of lm_head, since the final RMSNorm's input has root mean square 1)."""
    root = tmp_path_factory.mktemp("near-uniform-llama")
    _save_byte_tokenizer(root / "tokenizer")
    hf = save_tiny_model(
        root / "model", "llama", vocab_size=272, tokenizer_dir=root / "tokenizer",
        max_position_embeddings=SCHEMAS_MAX_NEW_TOKENS + 64, initializer_range=NEAR_UNIFORM_INIT,
    )
    norm_weight, lm_head_weight = hf.model.norm.weight.detach(), hf.lm_head.weight.detach()
    max_abs_logit = norm_weight.abs().max() * hf.config.hidden_size**0.5 * lm_head_weight.norm(dim=1).max()
    assert max_abs_logit <= MAX_ABS_LOGIT
    return root / "model"


def test_every_schema_finishes_valid_at_temperature_one(backend_name: str, near_uniform_model_dir: Path) -> None:
    """All SCHEMAS (>= 50: nested objects, arrays, enums, bounded numbers, optional fields, string
    patterns and formats) in one batch at temperature 1.0, each request with its own seed (so the
    draws do not depend on the batch): every output finishes with EOS and validates.

    The model is chosen so that how long an output runs is a property of its grammar alone, and
    an honest limit can be computed. With real weights (conftest's tiny model) a string ends only
    when the model happens to favour a closing quote: on SmolLM's tokenizer 48,769 tokens may
    continue a string and 37 close it, and runs of 4,000+ tokens are common. Here:
    - the tokenizer is byte-level (about 150 tokens may continue a string, 3-4 of them close it);
    - every logit is within 0.08 of 0, so each allowed token has probability within a factor
      e^0.16 of 1 / (number allowed): sampling is a near-uniform random walk through the grammar,
      the walk that reaches the most unusual tokens (escapes, multi-byte characters, merges).
    Cut probability: the exact output-length distribution under uniform sampling, by dynamic
    programming over each grammar's token index, gives P(length > 8192) <= 1.3e-16 for every
    schema (the longest tail: a `pattern` string that needs one of ~150 tokens to be "@"; most are
    below 1e-70). The factor e^0.16 scales each step's chance to end a run by at least e^-0.16, so
    a tail P becomes at most about P^0.85: below 1e-13 per schema, 1e-11 for the whole batch.
    """
    assert len(SCHEMAS) >= 50
    indices = range(len(SCHEMAS))
    # admission reserves up to 4,096 future tokens per request: with this pool all start at once
    engine = Engine(str(near_uniform_model_dir), max_total_tokens=len(SCHEMAS) * 4096, random_seed=0,
                    grammar_backend=backend_name)
    try:
        base = {"temperature": 1.0, "max_new_tokens": SCHEMAS_MAX_NEW_TOKENS}
        params = [{**base, "seed": SCHEMAS_SEED_OFFSET + i, "json_schema": json.dumps(SCHEMAS[i])} for i in indices]
        outs = engine.generate(prompt=[f"object {i}:" for i in indices], sampling_params=params)
        assert_engine_clean(engine)
    finally:
        engine.shutdown()
    failures: list[str] = []
    for i, out in zip(indices, outs):
        schema = SCHEMAS[i]
        reason, text = out["meta_info"]["finish_reason"]["type"], out["text"]
        if reason != "stop":
            failures.append(f"schema {i}: finish_reason {reason!r} after "
                            f"{out['meta_info']['completion_tokens']} tokens, text ends {text[-80:]!r}")
            continue
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError) as e:
            failures.append(f"schema {i}: {text!r} is not valid: {str(e).splitlines()[0]}")
    assert not failures, "\n".join(failures)


def test_a_grammar_engine_failure_ends_its_request_only(tiny_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: the grammar engine raises while filling one request's mask (as xgrammar
    did on a finished matcher). That request ends with an error naming it; the one beside it in
    the batch finishes valid, and no KV slot leaks."""
    from radixlm.runtime.constrained.xgrammar_backend import XGrammarState

    fill = XGrammarState.fill_vocab_masks

    def failing(self: XGrammarState, rows: Any, draft: list[int], budget: int | None = None) -> bool:
        if self.compiled.kind == "regex":
            raise RuntimeError("the engine's own check failed")
        return fill(self, rows, draft, budget)

    monkeypatch.setattr(XGrammarState, "fill_vocab_masks", failing)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    broken, fine = tiny_engine.generate(prompt=["a:", "b:"], sampling_params=[
        {"regex": "[ab]+", "max_new_tokens": 8}, {"json_schema": json.dumps(schema), "max_new_tokens": 16}])
    reason = broken["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and "the engine's own check failed" in reason["message"], reason
    jsonschema.validate(json.loads(fine["text"]), schema)
    monkeypatch.undo()
    assert_engine_clean(tiny_engine)
