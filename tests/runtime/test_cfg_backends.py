"""The context-free grammar backends, xgrammar and llguidance (runtime/constrained/), on the
default model's tokenizer, driven token by token as the scheduler drives a grammar: a recursive JSON
schema and an EBNF grammar accept exactly their languages (masks, accept, EOS at completion),
jump-forward drafts are allowed and leave the state unchanged, masks along a draft equal stepping,
a refused token leaves the state as it was, and bad grammars fail their future with a GrammarError.
(End to end through the server: tests/server/test_grammar_backends.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.llguidance_backend import LLGuidanceBackend
from radixlm.runtime.constrained.xgrammar_backend import XGrammarBackend
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

Backend = XGrammarBackend | LLGuidanceBackend

TREE = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["name", "children"],
}


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def backend(tiny_model_dir: Path, request: pytest.FixtureRequest) -> Backend:
    tokenizer = Tokenizer(tiny_model_dir)
    # logits wider than the tokenizer, as models pad their vocabulary
    cls = XGrammarBackend if request.param == "xgrammar" else LLGuidanceBackend
    return cls(tokenizer, tokenizer.vocab_size + 64)


def _mask(state: object, vocab_size: int) -> torch.Tensor:
    row = torch.zeros(vocab_size, dtype=torch.bool)
    state.fill_vocab_mask(row)  # type: ignore[attr-defined]
    return row


def _plain(backend: Backend, text: str) -> list[int]:
    """Token ids of `text` without the special tokens the tokenizer may add."""
    special = set(backend.tokenizer._tok.all_special_ids)
    return [i for i in backend.tokenizer.encode(text) if i not in special]


def _feed(backend: Backend, state: object, text: str) -> None:
    """Each token of `text` is allowed by the mask before it and accepted."""
    for token in _plain(backend, text):
        assert _mask(state, backend.vocab_size)[token], (text, token)
        state.accept_token(token)  # type: ignore[attr-defined]


def test_a_recursive_schema_accepts_a_tree_and_ends_with_eos(backend: Backend) -> None:
    text = json.dumps({"name": "root", "children": [{"name": "a", "children": [{"name": "b", "children": []}]}]})
    jsonschema.validate(json.loads(text), TREE)
    state = backend.get("json_schema", TREE).result(timeout=60).new_state()
    eos = backend.tokenizer._tok.eos_token_id
    assert not _mask(state, backend.vocab_size)[eos]  # nothing written yet: EOS not allowed
    _feed(backend, state, text)
    mask = _mask(state, backend.vocab_size)
    assert mask[eos] and not mask[backend.tokenizer.vocab_size :].any()
    # the tree is closed: only EOS may follow; a backend may already say so (llguidance)
    assert mask.sum() == 1
    state.accept_token(eos)
    assert state.is_terminated()


def test_the_schema_forbids_what_it_does_not_allow(backend: Backend) -> None:
    state = backend.get("json_schema", TREE).result(timeout=60).new_state()
    _feed(backend, state, '{"name": "x"')
    closing = _plain(backend, "}")[0]
    assert not _mask(state, backend.vocab_size)[closing]  # "children" is required
    with pytest.raises(ValueError, match="not allowed"):
        state.accept_token(closing)
    _feed(backend, state, ', "children": []}')  # the state was unchanged by the refused token


def test_ebnf_grammar(backend: Backend) -> None:
    compiled = backend.get("ebnf", 'root ::= "yes" | "no" | "maybe " [0-9]+').result(timeout=60)
    eos = backend.tokenizer._tok.eos_token_id
    state = compiled.new_state()
    _feed(backend, state, "maybe")
    assert not _mask(state, backend.vocab_size)[eos]
    _feed(backend, state, " 12")
    assert _mask(state, backend.vocab_size)[eos]
    other = compiled.new_state()
    _feed(backend, other, "no")
    assert _mask(other, backend.vocab_size)[eos]
    assert not _mask(other, backend.vocab_size)[_plain(backend, "yes")[0]]


def test_jump_forward_draft_is_allowed_and_leaves_the_state(backend: Backend) -> None:
    state = backend.get("json_schema", TREE).result(timeout=60).new_state()
    before = _mask(state, backend.vocab_size)
    draft = state.jump_forward_ids(last_token_id=0, max_tokens=16)
    assert draft and backend.tokenizer.decode(draft).startswith('{"')
    assert torch.equal(_mask(state, backend.vocab_size), before)
    rows = torch.zeros(len(draft) + 1, backend.vocab_size, dtype=torch.bool)
    state.fill_vocab_masks(rows, draft)
    assert torch.equal(rows[0], before)
    stepped = state.copy()
    for j, token in enumerate(draft):
        stepped.accept_token(token)
        assert torch.equal(rows[j + 1], _mask(stepped, backend.vocab_size))
    assert torch.equal(_mask(state, backend.vocab_size), before)
    assert state.jump_forward_ids(0, 0) == []


def test_choices_and_regex(backend: Backend) -> None:
    eos = backend.tokenizer._tok.eos_token_id
    state = backend.get("choices", ["red", "green"]).result(timeout=60).new_state()
    _feed(backend, state, "green")
    assert _mask(state, backend.vocab_size)[eos]
    state = backend.get("regex", r"[0-9]{3}").result(timeout=60).new_state()
    _feed(backend, state, "42")
    assert not _mask(state, backend.vocab_size)[eos]
    _feed(backend, state, "7")
    assert _mask(state, backend.vocab_size)[eos]


def test_bad_grammars_fail_their_future(backend: Backend) -> None:
    with pytest.raises(GrammarError, match="ebnf grammar"):
        backend.get("ebnf", "root ::= (").result(timeout=60)
    with pytest.raises(GrammarError, match="unknown grammar kind 'cfg'"):
        backend.get("cfg", "x").result(timeout=60)
    with pytest.raises(GrammarError, match="json_schema is not valid JSON"):
        backend.get("json_schema", "{").result(timeout=60)
    assert backend.get("ebnf", 'root ::= "a"') is backend.get("ebnf", 'root ::= "a"')  # cached
