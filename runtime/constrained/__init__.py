"""Constrained decoding: regex / JSON schema / choices grammars as token FSMs (via outlines-core).

Modules, bottom up: `errors` (GrammarError), `numeric_regex` and `regex_syntax` (regex text),
`json_schema` (schema -> regex), `spec` (request spec -> cache key -> regex, `validate`),
`vocabulary` (our tokenizer -> outlines-core Vocabulary), `grammar` (compiled grammars,
per-request state, the caching background `GrammarBackend`). Every backend's front-door check
lowers the spec once (`lowered.LoweredGrammar`, carried with the request to the compile worker).
A JSON schema is first rewritten (`schema_rewrite`) and given to the first engine that enforces
it exactly (`engine_choice`, `backends.choose_json_schema`); docs/json-schema.md.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> its module; loaded on first use, so that reading a submodule (e.g. `backends`, for the
# server's settings) does not load torch and outlines-core into every process
_LAZY = {
    "GrammarError": "errors",
    "CompiledGrammar": "grammar",
    "Grammar": "grammar",
    "GrammarBackend": "grammar",
    "GRAMMAR_KINDS": "spec",
    "GrammarKind": "spec",
    "validate": "spec",
    "GrammarVocabulary": "vocabulary",
    "get_grammar_vocabulary": "vocabulary",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = [
    "GRAMMAR_KINDS",
    "CompiledGrammar",
    "Grammar",
    "GrammarBackend",
    "GrammarError",
    "GrammarKind",
    "GrammarVocabulary",
    "get_grammar_vocabulary",
    "validate",
]
