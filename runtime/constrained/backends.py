"""The grammar backends a server can run (`--grammar-backend`), what each serves, and the front
door's check of a request's grammar against the chosen one.

- `outlines`: regex, JSON schema and choices compiled to a token DFA by outlines-core
  (`grammar.GrammarBackend`); no context-free grammars, no recursive `$ref`.
- `xgrammar` (the default): regex, JSON schema (with recursion) and choices, plus EBNF (`ebnf`, xgrammar's
  GBNF-style dialect: `root ::= ...`) and structural tags (`structural_tag`: free text with
  triggered JSON structures, e.g. tool calls), compiled by xgrammar (`xgrammar_backend`).
- `llguidance`: the same kinds; `ebnf` is read as a Lark grammar (`start: ...`) or as llama.cpp's
  GBNF (`root ::= ...`) (`llguidance_backend`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import TYPE_CHECKING

from radixlm.runtime.config.server_args import GRAMMAR_BACKENDS  # the flag's choices: `--grammar-backend`
from radixlm.runtime.constrained import engine_choice
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.json_schema import parse_schema
from radixlm.runtime.constrained.lowered import LoweredGrammar
from radixlm.runtime.constrained.spec import lower_checked, normalize_spec
from radixlm.runtime.constrained.unique_items import has_unique_items

if TYPE_CHECKING:
    from radixlm.runtime.constrained.grammar import GrammarBackend
    from radixlm.runtime.constrained.llguidance_backend import LLGuidanceBackend
    from radixlm.runtime.constrained.xgrammar_backend import XGrammarBackend
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

CFG = ("regex", "json_schema", "choices", "ebnf", "structural_tag")
KINDS = {"outlines": ("regex", "json_schema", "choices"), "xgrammar": CFG, "llguidance": CFG}


def create(name: str, tokenizer: Tokenizer, vocab_size: int, *, num_workers: int, enable_jump_forward: bool,
           whitespace_pattern: str | None,
           compile_memory_mb: int | None = None) -> GrammarBackend | XGrammarBackend | LLGuidanceBackend:
    """The compile backend `name` for this tokenizer and logits width. JSON schemas the front door
    gave another engine (`choose_json_schema`) it hands to that engine's backend, made on first use
    with the same settings (`compile_cache.Siblings`). `compile_memory_mb`: xgrammar's budget for
    one large compile (`--grammar-compile-memory-mb`; None: `xgrammar_worker.default_budget_mb`)."""
    from radixlm.runtime.constrained.compile_cache import Siblings

    def make(engine: str) -> GrammarBackend | XGrammarBackend | LLGuidanceBackend:
        return _create_one(engine, tokenizer, vocab_size, num_workers=num_workers,
                           enable_jump_forward=enable_jump_forward, whitespace_pattern=whitespace_pattern,
                           compile_memory_mb=compile_memory_mb)

    backend = make(name)
    backend.siblings = Siblings(make)
    return backend


def _create_one(name: str, tokenizer: Tokenizer, vocab_size: int, *, num_workers: int, enable_jump_forward: bool,
                whitespace_pattern: str | None,
                compile_memory_mb: int | None) -> GrammarBackend | XGrammarBackend | LLGuidanceBackend:
    if name == "llguidance":
        from radixlm.runtime.constrained.llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend(tokenizer, vocab_size, num_workers=num_workers, enable_jump_forward=enable_jump_forward)
    if name == "xgrammar":
        from radixlm.runtime.constrained.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size, num_workers=num_workers, enable_jump_forward=enable_jump_forward,
                               compile_memory_mb=compile_memory_mb)
    if name != "outlines":
        raise ValueError(f"grammar backend must be one of {', '.join(GRAMMAR_BACKENDS)}, got {name!r}")
    from radixlm.runtime.constrained.grammar import GrammarBackend

    return GrammarBackend(tokenizer, vocab_size, num_workers=num_workers, enable_jump_forward=enable_jump_forward,
                          whitespace_pattern=whitespace_pattern)


def validate(name: str, kind: str, spec: object, whitespace_pattern: str | None = None) -> LoweredGrammar:
    """GrammarError if backend `name` cannot serve this grammar (naming the backends that can
    serve its kind) or the spec is malformed; quick, without the vocabulary. The check is the
    backend's lowering (`lowered`: outlines' regex, with `whitespace_pattern`, the server's;
    xgrammar's Grammar; llguidance's grammar text), returned for the request to carry to the
    compile worker, which compiles it as it is. A JSON schema goes to the first engine of
    `engine_choice.engine_order(name)` that enforces it exactly (the returned
    `LoweredGrammar.backend` says which), else GrammarError naming the keywords."""
    if kind == "json_schema":
        return choose_json_schema(name, spec, whitespace_pattern)
    return lower_on(name, kind, spec, whitespace_pattern)


def lower_on(name: str, kind: str, spec: object, whitespace_pattern: str | None = None) -> LoweredGrammar:
    """Engine `name`'s own lowering of the spec as sent (a JSON schema without our rewrite or
    fallback: what that one engine does, for tests and the bench); GrammarError as `validate`."""
    if kind not in KINDS[name]:
        able = [b for b in GRAMMAR_BACKENDS if kind in KINDS[b]]
        raise GrammarError(f"the {name} grammar backend cannot serve {kind} grammars; "
                           f"start the server with --grammar-backend {' or '.join(able)}")
    if name == "outlines":
        return lowered_at_door(name, kind, normalize_spec(kind, spec), whitespace_pattern)
    from radixlm.runtime.constrained.compile_cache import normalize_cfg

    return lowered_at_door(name, kind, normalize_cfg(kind, spec), None)


def choose_json_schema(name: str, spec: object, whitespace_pattern: str | None = None) -> LoweredGrammar:
    """The JSON schema lowered by the first engine of `engine_order(name)` that enforces its
    rewritten form exactly (`engine_choice`); GrammarError with every engine's reason if none."""
    if isinstance(spec, bool) or spec in ("true", "false"):
        text = json.dumps(spec if isinstance(spec, bool) else spec == "true")
    else:
        text = engine_choice.schema_text(parse_schema(spec))
    engine_to_form = _rewritten(text)
    reasons: list[tuple[str, str]] = []
    for engine in engine_choice.engine_order(name):
        normalized, why, stricter = engine_to_form[engine]
        if why is not None:
            reasons.append((engine, why))
            continue
        try:
            lowered = lowered_at_door(engine, "json_schema", normalized,
                                      whitespace_pattern if engine == "outlines" else None)
        except GrammarError as e:
            reasons.append((engine, f"refuses it: {e}"))
            continue
        # uniqueItems, which the rewrite dropped, is kept at sampling time against the schema as sent
        unique = text if '"uniqueItems"' in text and _has_unique_items(text) else ""
        return dataclasses.replace(lowered, stricter=stricter, unique_items=unique) if stricter or unique else lowered
    raise engine_choice.refusal(reasons)


@functools.lru_cache(maxsize=64)
def _has_unique_items(text: str) -> bool:
    """Whether the schema's text has `uniqueItems: true` as a keyword, once per distinct text."""
    return has_unique_items(json.loads(text))


@functools.lru_cache(maxsize=64)
def _rewritten(text: str) -> dict[str, engine_choice.EngineForm]:
    """Per engine, a schema's rewritten text as that engine gets it (`engine_choice.rewritten`,
    `engine_choice.for_engine`), why it would not enforce it (None: it would) and the keywords
    served by a stricter form (`schema_notes`), once per
    distinct schema text (an extraction pipeline sends the same schema with every request; a
    megabyte schema's rewrite takes about a second). GrammarError (not cached) where the schema
    is malformed or too large."""
    from radixlm.runtime.constrained.compile_cache import check_cfg_schema
    from radixlm.runtime.constrained.schema_notes import noting

    with noting() as noted:
        schema = engine_choice.rewritten(json.loads(text))
    if isinstance(schema, dict):
        check_cfg_schema(schema)
    engine_to_form = engine_choice.per_engine(schema, tuple(noted))
    if not isinstance(schema, dict):
        engine_to_form["outlines"] = engine_to_form["outlines"]._replace(reason="serves object schemas only")
    return engine_to_form


@functools.lru_cache(maxsize=64)
def lowered_at_door(name: str, kind: str, normalized: str, whitespace_pattern: str | None) -> LoweredGrammar:
    """Backend `name`'s lowering of a normalized spec, made once per distinct spec (an extraction
    pipeline sends the same schema with every request; a wide schema's xgrammar grammar takes tens
    of milliseconds to make and serialize). GrammarError (not cached) where it cannot be lowered."""
    if name == "outlines":
        return lower_checked(kind, normalized, whitespace_pattern)
    if name == "llguidance":
        from radixlm.runtime.constrained import llguidance_backend

        lowered = llguidance_backend.lower(kind, normalized)
        llguidance_backend.check(lowered)
        return lowered
    from radixlm.runtime.constrained import xgrammar_backend

    try:
        return xgrammar_backend.lower(kind, normalized)
    except (RuntimeError, ValueError) as e:
        raise GrammarError(f"invalid {kind} grammar: {xgrammar_reason(e)}") from None


def xgrammar_reason(error: Exception) -> str:
    """xgrammar's error message without its log prefix (`[12:00:00] /path/file.cc:820: `)."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", first)
