"""Grammars compiled by xgrammar (context-free: EBNF, JSON schemas with recursion, regex), behind
the same per-request interface as the outlines backend (`grammar.Grammar`): `accept_token`,
`fill_vocab_masks` along a jump-forward draft, `jump_forward_ids`, `is_terminated`, `copy`; and
the same `get(kind, spec) -> Future` compile API with a cache as `grammar.GrammarBackend`.

The vocabulary is ours (`vocabulary.get_grammar_vocabulary`: each token's exact bytes, built from
the local tokenizer, no hub): special tokens are given to xgrammar as empty strings, which it never
allows inside text (its own reading of a Hugging Face tokenizer treats SmolLM2's `<|endoftext|>`
as the 13 characters it prints). JSON schemas compile against a second copy of the vocabulary
without the tokens that hold a control character (U+0000-U+001F): xgrammar's JSON strings take
them raw, which JSON forbids, and the layout we ask for (`json.dumps`'s) needs none. Masks are
xgrammar's int32 bitmasks (bit i % 32 of word i // 32 allows token i) unpacked to our bool rows.
xgrammar compiles in milliseconds (a recursive schema ~5 ms, an EBNF ~0.2 ms with the default
model's vocabulary), in a worker thread so the scheduler never waits on one.

Lowered once (`lowered`): a spec becomes an `xgr.Grammar` in one place, `xgrammar_grammar` (at
the front door, or in the worker for a spec that comes without the door's), and travels as
xgrammar's exact serialization of it; the worker compiles that grammar (`compile_grammar`), the
same compiled grammar `compile_json_schema` / `compile_regex` / `compile_structural_tag` made of
the spec (tests/runtime/test_request_path_once.py compares them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch
import xgrammar as xgr

from radixlm.runtime.constrained.closing import ClosingSearch, Steering
from radixlm.runtime.constrained.compile_cache import DATA_KEYS, SCHEMA_MAPS, CompileCache, unpack_bitmask
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.lowered import LoweredGrammar, LoweringSettings
from radixlm.runtime.constrained.spec import choices_regex
from radixlm.runtime.constrained.structural_tag import xgrammar_format
from radixlm.runtime.constrained.xgrammar_worker import BudgetExceeded, CompileWorker, default_budget_mb

if TYPE_CHECKING:
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

MAX_DRAFT_TOKENS = 16  # the longest jump-forward draft
# A lowered form (serialized grammar) at least this long compiles in the memory-capped child
# (`xgrammar_worker`); a shorter one needs ~30 MB at most (the compile takes ~30 bytes per
# character of the form with a 49,152-token vocabulary) and compiles in a worker thread.
MIN_CHILD_FORM_CHARS = 1024 * 1024
# JSON laid out as `json.dumps` does by default (`", "` and `": "` between items, no other
# whitespace): the server's layout with xgrammar, at the door and in the worker
ANY_WHITESPACE = False


def xgrammar_grammar(kind: str, normalized: str, any_whitespace: bool = ANY_WHITESPACE) -> xgr.Grammar:
    """xgrammar's grammar of a normalized spec (`compile_cache.normalize_cfg`), a JSON schema's
    with `any_whitespace`; xgrammar's RuntimeError / ValueError (a GrammarError from
    `xgrammar_schema`) if it cannot be made."""
    if kind == "regex":
        return xgr.Grammar.from_regex(normalized)
    if kind == "json_schema":
        return xgr.Grammar.from_json_schema(xgrammar_schema(normalized), any_whitespace=any_whitespace)
    if kind == "choices":
        return xgr.Grammar.from_regex(choices_regex(json.loads(normalized)))
    if kind == "structural_tag":
        return xgr.Grammar.from_structural_tag(xgrammar_format(normalized, structure_schema))
    if kind == "ebnf":
        return xgr.Grammar.from_ebnf(normalized)
    raise GrammarError(f"unknown grammar kind {kind!r}")


def xgrammar_settings(any_whitespace: bool) -> LoweringSettings:
    """The xgrammar backend's `LoweredGrammar.settings`: its JSON layout."""
    return (("any_whitespace", any_whitespace),)


def lower(kind: str, normalized: str, any_whitespace: bool = ANY_WHITESPACE) -> LoweredGrammar:
    """The spec lowered to its xgrammar grammar (`xgrammar_grammar`, which says what it raises),
    carried as `Grammar.serialize_json()`: the worker deserializes the very grammar made here."""
    form = xgrammar_grammar(kind, normalized, any_whitespace).serialize_json()
    return LoweredGrammar("xgrammar", kind, normalized, form, xgrammar_settings(any_whitespace))


class XGrammarCompiled:
    """One grammar compiled for one vocabulary; `new_state()` gives a request's matcher."""

    def __init__(self, kind: str, compiled: xgr.CompiledGrammar, vocab_size: int, tokenizer_len: int,
                 encode_plain: Callable[[str], list[int]] | None, steering: Steering, compile_secs: float):
        """`encode_plain` tokenizes jump-forward text (None: jump-forward off)."""
        self.kind = kind
        self.steering = steering
        self.compiled = compiled
        self.vocab_size = vocab_size
        self.tokenizer_len = tokenizer_len
        self.encode_plain = encode_plain
        self.compile_secs = compile_secs

    def new_state(self) -> XGrammarState:
        return XGrammarState(self)


class XGrammarState(ClosingSearch):
    """One request's position in an xgrammar grammar (used by one thread at a time); budget
    steering by `closing.ClosingSearch` over its matcher."""

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
        self._took(token_id)

    # the matcher primitives of the closing search
    def _try(self, token_id: int) -> bool:
        return bool(self._matcher.accept_token(token_id))

    def _can_end(self) -> bool:
        return bool(self._matcher.is_completed())

    def fill_vocab_mask(self, mask_row: torch.Tensor) -> None:
        """Overwrites `mask_row` (bool [vocab_size]): True = allowed (EOS once the output is complete)."""
        vocab_size = self.compiled.vocab_size
        self._matcher.fill_next_token_bitmask(self._bitmask)
        unpack_bitmask(self._bitmask[0], vocab_size, self.compiled.tokenizer_len, mask_row)

    def fill_vocab_masks(self, mask_rows: torch.Tensor, draft: list[int], budget: int | None = None) -> bool:
        """Row j of `mask_rows` gets the mask after `draft[:j]`; the state does not change.
        The budget steers after sampling here (`budget_token`), not in the mask: returns False."""
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

    def valid_prefix_len(self, tokens: list[int]) -> int:
        """How many leading `tokens` (at most MAX_DRAFT_TOKENS, no stop token) the grammar allows in
        turn from here (a speculative draft is cut there); the state does not change."""
        num_accepted = num_valid = 0
        for token_id in tokens[:MAX_DRAFT_TOKENS]:
            if self._matcher.is_terminated() or not self._matcher.accept_token(token_id):
                break
            num_accepted += 1
            if self._matcher.is_terminated():  # a stop token: the draft stops before it (no mask row follows it)
                break
            num_valid += 1
        if num_accepted:
            self._matcher.rollback(num_accepted)
        return num_valid

    def min_tokens(self) -> int | None:
        """The tokens of the closing plan from here (`closing`: a short completion, not always the
        shortest; 0 once terminated), or None when the search finds none."""
        if self._matcher.is_terminated():
            return 0
        plan = self.closing_ids()
        return None if plan is None else len(plan)

    def jump_forward_ids(self, last_token_id: int, max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens of the text the grammar now forces, each allowed in turn (the
        text is tokenized on its own, so at most as many tokens as fit the grammar); the state
        does not change."""
        if max_tokens <= 0 or self.compiled.encode_plain is None or self._matcher.is_terminated():
            return []
        if self.closing_ids() is None:  # maybe no end from here: the forced text could be endless
            return []
        try:
            forced = self._matcher.find_jump_forward_string()
        except UnicodeDecodeError:  # the forced bytes end inside a UTF-8 character: no draft
            return []
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

    backend_name = "xgrammar"

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, max_cache: int = 64, num_workers: int = 2,
                 any_whitespace: bool = ANY_WHITESPACE, enable_jump_forward: bool = True,
                 compile_memory_mb: int | None = None):
        """`any_whitespace=False`: JSON output is laid out as `json.dumps` does by default
        (`", "` and `": "` between items, no other whitespace). `compile_memory_mb`: the memory
        budget of a large grammar's compile (`xgrammar_worker`; None: its default)."""
        super().__init__("xgrammar", max_cache, num_workers)
        self.enable_jump_forward = enable_jump_forward
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.any_whitespace = any_whitespace
        from radixlm.runtime.constrained.vocabulary import get_grammar_vocabulary

        id_to_bytes = get_grammar_vocabulary(tokenizer).id_to_bytes
        eos = [tokenizer.eos_token_id]
        self._infos = tuple(tokenizer_info(id_to_bytes, vocab_size, eos, json=is_json) for is_json in (False, True))
        self._compiler, self._json_compiler = (xgr.GrammarCompiler(info, max_threads=1) for info in self._infos)
        budget_mb = default_budget_mb() if compile_memory_mb is None else compile_memory_mb
        # the capped children of each vocabulary (each starts on its first large grammar)
        self._workers = tuple(CompileWorker(token_bytes(id_to_bytes, vocab_size, is_json), vocab_size, eos, budget_mb)
                              for is_json in (False, True))
        self._steering = Steering.build(id_to_bytes, vocab_size, tokenizer.encode_plain, tokenizer.eos_token_id)
        # JSON's vocabulary has no control-character tokens: never tried (xgrammar logs each refusal)
        self._json_steering = self._steering.without_control_bytes()

    @property
    def lowering_settings(self) -> LoweringSettings:
        return xgrammar_settings(self.any_whitespace)

    def _lower(self, kind: str, normalized: str) -> LoweredGrammar:
        try:
            return lower(kind, normalized, self.any_whitespace)
        except (RuntimeError, ValueError) as e:
            raise _compile_error(kind, e) from None

    def _compile(self, lowered: LoweredGrammar) -> XGrammarCompiled:
        """Compiles the lowered grammar as it is: JSON schemas against the vocabulary without
        control-character tokens, the rest against the whole vocabulary."""
        start = time.perf_counter()
        kind = lowered.kind
        is_json = int(kind == "json_schema")  # the index of its vocabulary's compiler, info and worker
        compiler = self._json_compiler if is_json else self._compiler
        try:
            if len(lowered.form) < MIN_CHILD_FORM_CHARS:
                compiled = compiler.compile_grammar(xgr.Grammar.deserialize_json(lowered.form))
            else:
                text = self._workers[is_json].compile(lowered.form)
                compiled = xgr.CompiledGrammar.deserialize_json(text, self._infos[is_json])
        except BudgetExceeded as e:
            raise GrammarError(str(e)) from None
        except (RuntimeError, ValueError) as e:
            raise _compile_error(kind, e) from None
        return XGrammarCompiled(kind, compiled, self.vocab_size, self.tokenizer.vocab_size,
                                self.tokenizer.encode_plain if self.enable_jump_forward else None,
                                self._json_steering if kind == "json_schema" else self._steering,
                                time.perf_counter() - start)

    def shutdown(self) -> None:
        super().shutdown()
        for worker in self._workers:
            worker.close()


def _compile_error(kind: str, error: Exception) -> GrammarError:
    from radixlm.runtime.constrained.backends import xgrammar_reason

    return GrammarError(f"cannot compile the {kind} grammar with xgrammar: {xgrammar_reason(error)}")


def tokenizer_info(id_to_bytes: Mapping[int, bytes], vocab_size: int, stop_token_ids: list[int],
                   json: bool) -> xgr.TokenizerInfo:
    """xgrammar's vocabulary of `vocab_size` ids: each token's bytes; special tokens and ids
    beyond the tokenizer as b"" (never allowed in text); with `json`, tokens holding a control
    character too."""
    return xgr.TokenizerInfo(token_bytes(id_to_bytes, vocab_size, json), xgr.VocabType.RAW, vocab_size=vocab_size,
                             stop_token_ids=stop_token_ids)


def token_bytes(id_to_bytes: Mapping[int, bytes], vocab_size: int, json: bool) -> list[bytes]:
    """Each id's bytes as `tokenizer_info` gives them to xgrammar (b"": never allowed in text)."""
    def spelled(data: bytes | None) -> bytes:
        if data is None or (json and any(b < 0x20 for b in data)):
            return b""
        return data

    return [spelled(id_to_bytes.get(i)) for i in range(vocab_size)]




def structure_schema(text: str) -> str:
    """A structural tag's schema (a tool's parameters) as xgrammar should read it: rewritten as the
    door rewrites a JSON schema (`engine_choice.rewritten`), with `uniqueItems` as at most one item
    (no sampling-time check follows a structure inside free text), and refused (GrammarError)
    where xgrammar would not enforce what is left."""
    from radixlm.runtime.constrained import engine_choice
    from radixlm.runtime.constrained.schema_rewrite import unique_items_stricter

    with unique_items_stricter():
        schema = engine_choice.for_engine("xgrammar", engine_choice.rewritten(json.loads(text)))
    why = engine_choice.unenforced("xgrammar", schema)
    if why is not None:
        raise GrammarError(f"unsupported JSON schema in a structural tag: xgrammar {why}")
    return xgrammar_schema(engine_choice.schema_text(schema))


def xgrammar_schema(normalized: str) -> str:
    """The schema as xgrammar should read it, or GrammarError where xgrammar would silently serve
    a different language: `not` (ignored by xgrammar) and `required` names that `properties`
    does not declare (xgrammar drops them) are refused; draft-04's boolean `exclusiveMinimum` /
    `exclusiveMaximum` become the numeric form of later drafts (xgrammar reads only that one)."""
    schema = json.loads(normalized)

    def visit(node: object, path: str) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                visit(item, f"{path}/{i}")
            return
        if not isinstance(node, dict):
            return
        if "not" in node:
            raise GrammarError(f"unsupported JSON schema keyword 'not' at {path}: xgrammar cannot serve it")
        declared, required = node.get("properties") or {}, node.get("required")
        missing = [name for name in required if name not in declared] if isinstance(required, list) else []
        if missing:
            raise GrammarError(f"required property {missing[0]!r} at {path} is not declared in 'properties'")
        for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if isinstance(node.get(key), bool):
                if node.pop(key) and bound in node:
                    node[key] = node.pop(bound)
        for key, value in node.items():
            if key in DATA_KEYS:
                continue
            if key in SCHEMA_MAPS and isinstance(value, dict):
                for name, sub in value.items():
                    visit(sub, f"{path}/{key}/{name}")
            else:
                visit(value, f"{path}/{key}")

    visit(schema, "#")
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
