"""xgrammar compiles in the memory-capped child (`xgrammar_worker.CompileWorker`): the compiled
grammar it sends back deserializes against the parent's vocabulary and takes exactly what the
schema allows; a compile over the budget fails alone and the next one is served by a new child.
(Through the server: tests/server/test_schema_compile_budget.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import xgrammar as xgr

from radixlm.runtime.bench.hard_schema_corpus import big_schema
from radixlm.runtime.constrained import backends
from radixlm.runtime.constrained.vocabulary import get_grammar_vocabulary
from radixlm.runtime.constrained.xgrammar_backend import MIN_CHILD_FORM_CHARS, token_bytes, tokenizer_info
from radixlm.runtime.constrained.xgrammar_worker import BudgetExceeded, CompileWorker
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

VOCAB_SIZE = 49152


def _takes(compiled: xgr.CompiledGrammar, tokenizer: Tokenizer, text: str) -> bool:
    matcher = xgr.GrammarMatcher(compiled)
    return all(matcher.accept_token(t) for t in tokenizer.encode_plain(text)) and matcher.is_completed()


def test_child_compiles_what_the_parent_matches_and_survives_a_budget_overrun(default_model_dir: Path) -> None:
    tokenizer = Tokenizer(default_model_dir)
    id_to_bytes = get_grammar_vocabulary(tokenizer).id_to_bytes
    eos = [tokenizer.eos_token_id]
    worker = CompileWorker(token_bytes(id_to_bytes, VOCAB_SIZE, json=True), VOCAB_SIZE, eos, budget_mb=4)
    info = tokenizer_info(id_to_bytes, VOCAB_SIZE, eos, json=True)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}, "required": ["n"],
              "additionalProperties": False}
    form = backends.lower_on("xgrammar", "json_schema", schema).form
    big = backends.validate("xgrammar", "json_schema", json.dumps(big_schema(16).schema))
    assert big.backend == "xgrammar" and len(big.form) > MIN_CHILD_FORM_CHARS  # as the server would send it
    try:
        compiled = xgr.CompiledGrammar.deserialize_json(worker.compile(form), info)
        assert _takes(compiled, tokenizer, '{"n": 42}')
        assert not _takes(compiled, tokenizer, '{"n": -1}') and not _takes(compiled, tokenizer, '{"m": 1}')
        first_pid = worker.pid
        with pytest.raises(BudgetExceeded, match="exceeded the 4 MB budget"):
            worker.compile(big.form)
        assert worker.pid is None  # the child whose allocation failed is gone
        compiled = xgr.CompiledGrammar.deserialize_json(worker.compile(form), info)
        assert _takes(compiled, tokenizer, '{"n": 7}') and worker.pid not in (None, first_pid)
    finally:
        worker.close()
