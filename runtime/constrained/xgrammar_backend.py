"""Grammars compiled by xgrammar (context-free: EBNF, JSON schemas with recursion, regex), behind
the same per-request interface as the outlines backend (`grammar.Grammar`): `accept_token`,
`fill_vocab_masks` along a jump-forward draft, `jump_forward_ids`, `is_terminated`, `copy`; and
the same `get(kind, spec) -> Future` compile API with a cache as `grammar.GrammarBackend`.

The vocabulary comes from our tokenizer's own Hugging Face tokenizer (no hub access); masks are
xgrammar's int32 bitmasks (bit i % 32 of word i // 32 allows token i) unpacked to our bool rows.
xgrammar compiles in milliseconds (a recursive schema ~5 ms, an EBNF ~0.2 ms with the default
model's vocabulary), in a worker thread so the scheduler never waits on one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import xgrammar as xgr

from radixlm.runtime.constrained.compile_cache import CompileCache, unpack_bitmask
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.spec import choices_regex

if TYPE_CHECKING:
    from radixlm.runtime.tokenizer import Tokenizer

MAX_DRAFT_TOKENS = 16  # the longest jump-forward draft


class XGrammarCompiled:
    """One grammar compiled for one vocabulary; `new_state()` gives a request's matcher."""

    def __init__(self, kind: str, compiled: xgr.CompiledGrammar, vocab_size: int, tokenizer_len: int,
                 encode_plain: Callable[[str], list[int]] | None, compile_secs: float):
        """`encode_plain` tokenizes jump-forward text (None: jump-forward off)."""
        self.kind = kind
        self.compiled = compiled
        self.vocab_size = vocab_size
        self.tokenizer_len = tokenizer_len
        self.encode_plain = encode_plain
        self.compile_secs = compile_secs

    def new_state(self) -> XGrammarState:
        return XGrammarState(self)


class XGrammarState:
    """One request's position in an xgrammar grammar (used by one thread at a time)."""

    def __init__(self, compiled: XGrammarCompiled):
        self.compiled = compiled
        self._matcher = xgr.GrammarMatcher(compiled.compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, compiled.vocab_size)

    def accept_token(self, token_id: int) -> None:
        """Advances by one sampled token; ValueError (state unchanged) if the grammar forbids it."""
        if self._matcher.is_terminated():
            raise ValueError(f"token {token_id} after the grammar accepted EOS")
        if not self._matcher.accept_token(token_id):
            raise ValueError(f"token {token_id} is not allowed by the grammar")

    def fill_vocab_mask(self, mask_row: torch.Tensor) -> None:
        """Overwrites `mask_row` (bool [vocab_size]): True = allowed (EOS once the output is complete)."""
        vocab_size = self.compiled.vocab_size
        self._matcher.fill_next_token_bitmask(self._bitmask)
        unpack_bitmask(self._bitmask[0], vocab_size, self.compiled.tokenizer_len, mask_row)

    def fill_vocab_masks(self, mask_rows: torch.Tensor, draft: list[int], budget: int | None = None) -> bool:
        """Row j of `mask_rows` gets the mask after `draft[:j]`; the state does not change.
        `budget` is not applied (no budget steering with this engine yet): returns False."""
        if mask_rows.shape[0] != len(draft) + 1:
            raise ValueError(f"{mask_rows.shape[0]} mask rows for a draft of {len(draft)} tokens")
        self.fill_vocab_mask(mask_rows[0])
        for j, token_id in enumerate(draft):
            if not self._matcher.accept_token(token_id):
                self._matcher.rollback(j)
                raise ValueError(f"draft token {token_id} is not allowed by the grammar")
            self.fill_vocab_mask(mask_rows[j + 1])
        if draft:
            self._matcher.rollback(len(draft))
        return False

    def min_tokens(self) -> int | None:
        """The fewest tokens that complete the grammar from here: not known with this engine (None)."""
        return None

    def jump_forward_ids(self, last_token_id: int, max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens of the text the grammar now forces, each allowed in turn (the
        text is tokenized on its own, so at most as many tokens as fit the grammar); the state
        does not change."""
        if max_tokens <= 0 or self.compiled.encode_plain is None or self._matcher.is_terminated():
            return []
        forced = self._matcher.find_jump_forward_string()
        if not forced:
            return []
        draft: list[int] = []
        for token_id in self.compiled.encode_plain(forced)[: min(max_tokens, MAX_DRAFT_TOKENS)]:
            if not self._matcher.accept_token(token_id):
                break
            draft.append(token_id)
        if draft:
            self._matcher.rollback(len(draft))
        return draft

    def is_terminated(self) -> bool:
        """True once EOS was accepted (xgrammar's stop tokens end the grammar)."""
        return self._matcher.is_terminated()

    def copy(self) -> XGrammarState:
        """A fresh state at the start of the same grammar."""
        return self.compiled.new_state()


class XGrammarBackend(CompileCache[XGrammarCompiled]):
    """Compiles grammars with xgrammar in a worker thread, cached (LRU of `max_cache` entries)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, max_cache: int = 64, num_workers: int = 2,
                 any_whitespace: bool = False, enable_jump_forward: bool = True):
        """`any_whitespace=False`: JSON output is laid out as `json.dumps` does by default
        (`", "` and `": "` between items, no other whitespace)."""
        super().__init__("xgrammar", max_cache, num_workers)
        self.enable_jump_forward = enable_jump_forward
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.any_whitespace = any_whitespace
        info = xgr.TokenizerInfo.from_huggingface(tokenizer._tok, vocab_size=vocab_size)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)

    def _compile(self, kind: str, normalized: str) -> XGrammarCompiled:
        start = time.perf_counter()
        try:
            if kind == "regex":
                compiled = self._compiler.compile_regex(normalized)
            elif kind == "json_schema":
                compiled = self._compiler.compile_json_schema(normalized, any_whitespace=self.any_whitespace)
            elif kind == "choices":
                compiled = self._compiler.compile_regex(choices_regex(json.loads(normalized)))
            else:
                compiled = self._compiler.compile_grammar(normalized)
        except (RuntimeError, ValueError) as e:
            from radixlm.runtime.constrained.backends import xgrammar_reason

            raise GrammarError(f"cannot compile the {kind} grammar with xgrammar: {xgrammar_reason(e)}") from None
        return XGrammarCompiled(kind, compiled, self.vocab_size, self.tokenizer.vocab_size,
                                self._encode_plain if self.enable_jump_forward else None, time.perf_counter() - start)

    def _encode_plain(self, text: str) -> list[int]:
        special_ids = set(self.tokenizer._tok.all_special_ids)
        return [i for i in self.tokenizer.encode(text) if i not in special_ids]
