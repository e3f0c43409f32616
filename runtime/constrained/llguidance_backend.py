"""Grammars run by llguidance (Lark-style context-free grammars; it also reads llama.cpp's GBNF,
JSON schemas with recursion, regex), behind the scheduler's per-request grammar interface (see
`grammar.Grammar`) and the shared compile cache (`compile_cache`).

A "compiled" llguidance grammar is its validated grammar text; each request's `LLMatcher` builds
its parser from it (~2 ms for a recursive schema with the default model's vocabulary). llguidance
never raises on a bad token: a matcher that consumes one enters an error state for good, so a
token is checked (`validate_tokens`) before it is consumed. EBNF text is read as Lark or GBNF
(llguidance tells them apart). Jump-forward drafts are llguidance's fast-forward tokens.

Lowered once (`lowered`): a spec becomes llguidance's grammar text in one place, `grammar_text`
(at the front door, or in the worker for a spec that comes without the door's); the worker checks
that text against the vocabulary and builds matchers from it as it is.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import llguidance
import llguidance.hf
import llguidance.torch
import torch

from radixlm.runtime.constrained.closing import ClosingSearch, Steering
from radixlm.runtime.constrained.compile_cache import CompileCache, unpack_bitmask
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.lowered import LoweredGrammar
from radixlm.runtime.constrained.structural_tag import lark_grammar

if TYPE_CHECKING:
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

MAX_DRAFT_TOKENS = 16


def grammar_text(kind: str, normalized: str) -> str:
    """llguidance's grammar for a normalized spec (`compile_cache.normalize`)."""
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(
            normalized, defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        )
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(normalized)
    if kind == "choices":
        return llguidance.grammar_from("choice", normalized)
    if kind == "structural_tag":
        return llguidance.grammar_from("lark", lark_grammar(normalized))
    return llguidance.grammar_from("grammar", normalized)


def lower(kind: str, normalized: str) -> LoweredGrammar:
    """The spec lowered to llguidance's grammar text (`grammar_text`), or GrammarError with
    llguidance's reason."""
    try:
        text = grammar_text(kind, normalized)
    except (ValueError, RuntimeError) as e:
        raise GrammarError(f"invalid {kind} grammar: {str(e).strip().splitlines()[0]}") from None
    return LoweredGrammar("llguidance", kind, normalized, text)


def check(lowered: LoweredGrammar, tokenizer: llguidance.LLTokenizer | None = None) -> None:
    """GrammarError with llguidance's reason if the grammar text is invalid (for `tokenizer`'s
    vocabulary, if given)."""
    error = llguidance.LLMatcher.validate_grammar(lowered.form, tokenizer)
    if error and not error.startswith("WARNING"):
        raise GrammarError(f"invalid {lowered.kind} grammar: {error.strip().splitlines()[0]}")


class LLGuidanceCompiled:
    def __init__(self, kind: str, grammar: str, tokenizer: llguidance.LLTokenizer, vocab_size: int,
                 tokenizer_len: int, jump_forward: bool, steering: Steering, compile_secs: float):
        self.kind = kind
        self.steering = steering
        self.grammar = grammar
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.tokenizer_len = tokenizer_len
        self.jump_forward = jump_forward
        self.compile_secs = compile_secs

    def new_state(self) -> LLGuidanceState:
        return LLGuidanceState(self)


class LLGuidanceState(ClosingSearch):
    """One request's llguidance matcher (used by one thread at a time); budget steering by
    `closing.ClosingSearch` over it."""

    def __init__(self, compiled: LLGuidanceCompiled):
        self.compiled = compiled
        self._matcher = llguidance.LLMatcher(compiled.tokenizer, compiled.grammar, log_level=0)
        if self._matcher.is_error():
            raise GrammarError(f"invalid {compiled.kind} grammar: {self._matcher.get_error()}")
        self._bitmask = llguidance.torch.allocate_token_bitmask(1, compiled.tokenizer.vocab_size)
        self._eos_accepted = False

    def accept_token(self, token_id: int) -> None:
        """Advances by one sampled token; ValueError (state unchanged) if the grammar forbids it."""
        if self._eos_accepted:
            raise ValueError(f"token {token_id} after the grammar accepted EOS")
        if token_id == self.compiled.tokenizer.eos_token:
            if not self._matcher.is_accepting():
                raise ValueError("EOS is not allowed before the grammar is complete")
            self._matcher.consume_token(token_id)
            self._eos_accepted = True
            self._took(token_id)
            return
        if self._matcher.validate_tokens([token_id]) != 1:
            raise ValueError(f"token {token_id} is not allowed by the grammar")
        self._matcher.consume_token(token_id)
        self._took(token_id)

    # the matcher primitives of the closing search
    def _try(self, token_id: int) -> bool:
        return self._matcher.try_consume_tokens([token_id]) == 1

    def _can_end(self) -> bool:
        return self._matcher.is_accepting()

    def fill_vocab_mask(self, mask_row: torch.Tensor) -> None:
        """Overwrites `mask_row` (bool [vocab_size]): True = allowed (EOS once the output is complete)."""
        llguidance.torch.fill_next_token_bitmask(self._matcher, self._bitmask, 0)
        unpack_bitmask(self._bitmask[0], self.compiled.vocab_size, self.compiled.tokenizer_len, mask_row)

    def fill_vocab_masks(self, mask_rows: torch.Tensor, draft: list[int], budget: int | None = None) -> bool:
        """Row j of `mask_rows` gets the mask after `draft[:j]`; the state does not change.
        The budget steers after sampling here (`budget_token`), not in the mask: returns False."""
        if mask_rows.shape[0] != len(draft) + 1:
            raise ValueError(f"{mask_rows.shape[0]} mask rows for a draft of {len(draft)} tokens")
        self.fill_vocab_mask(mask_rows[0])
        for j, token_id in enumerate(draft):
            if not self._try(token_id):
                self._undo(j)
                raise ValueError(f"draft token {token_id} is not allowed by the grammar")
            self.fill_vocab_mask(mask_rows[j + 1])
        if draft:
            self._matcher.rollback(len(draft))
        return False

    def valid_prefix_len(self, tokens: list[int]) -> int:
        """How many leading `tokens` (at most MAX_DRAFT_TOKENS, no EOS) the grammar allows in turn
        from here (a speculative draft is cut there); the state does not change."""
        if self._eos_accepted or not tokens:
            return 0
        tokens = tokens[:MAX_DRAFT_TOKENS]
        eos = self.compiled.tokenizer.eos_token
        if eos in tokens:  # a draft stops before EOS: no mask row follows the end (fill_vocab_masks)
            tokens = tokens[: tokens.index(eos)]
        return int(self._matcher.validate_tokens(tokens)) if tokens else 0

    def min_tokens(self) -> int | None:
        """The tokens of the closing plan from here (`closing`: a short completion, not always the
        shortest; 0 once terminated), or None when the search finds none."""
        if self.is_terminated():
            return 0
        plan = self.closing_ids()
        return None if plan is None else len(plan)

    def jump_forward_ids(self, last_token_id: int, max_tokens: int) -> list[int]:
        """llguidance's fast-forward tokens (forced, already tokenized as the tokenizer would),
        at most `max_tokens`; the state does not change."""
        if max_tokens <= 0 or not self.compiled.jump_forward or self._matcher.is_stopped():
            return []
        draft = list(self._matcher.compute_ff_tokens())[: min(max_tokens, MAX_DRAFT_TOKENS)]
        return draft[: self._matcher.validate_tokens(draft)] if draft else []

    def is_terminated(self) -> bool:
        """True once nothing but EOS can follow, or EOS was accepted."""
        return self._eos_accepted or self._matcher.is_stopped()

    def copy(self) -> LLGuidanceState:
        return self.compiled.new_state()


class LLGuidanceBackend(CompileCache[LLGuidanceCompiled]):
    """Validates and caches llguidance grammars; a request's matcher is built from the text."""

    backend_name = "llguidance"

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, max_cache: int = 64, num_workers: int = 2,
                 enable_jump_forward: bool = True):
        super().__init__("llguidance", max_cache, num_workers)
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.enable_jump_forward = enable_jump_forward
        self._lltokenizer = llguidance.hf.from_tokenizer(tokenizer._tok, n_vocab=vocab_size)
        from radixlm.runtime.constrained.vocabulary import get_grammar_vocabulary

        self._steering = Steering.build(get_grammar_vocabulary(tokenizer).id_to_bytes, vocab_size,
                                        tokenizer.encode_plain, tokenizer.eos_token_id)

    def _lower(self, kind: str, normalized: str) -> LoweredGrammar:
        return lower(kind, normalized)

    def _compile(self, lowered: LoweredGrammar) -> LLGuidanceCompiled:
        """The lowered grammar text, checked against the vocabulary and its parser built once."""
        start = time.perf_counter()
        check(lowered, self._lltokenizer)
        compiled = LLGuidanceCompiled(lowered.kind, lowered.form, self._lltokenizer, self.vocab_size,
                                      self.tokenizer.vocab_size, self.enable_jump_forward, self._steering, 0.0)
        compiled.new_state()  # builds the parser once: grammar errors surface here, not per request
        compiled.compile_secs = time.perf_counter() - start
        return compiled

