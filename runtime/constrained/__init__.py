"""Constrained decoding: regex / JSON schema / choices grammars as token FSMs (via outlines-core).

Modules, bottom up: `errors` (GrammarError), `numeric_regex` and `regex_syntax` (regex text),
`json_schema` (schema -> regex), `spec` (request spec -> cache key -> regex, `validate`),
`vocabulary` (our tokenizer -> outlines-core Vocabulary), `grammar` (compiled grammars,
per-request state, the caching background `GrammarBackend`).
"""

from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.grammar import CompiledGrammar, Grammar, GrammarBackend
from radixlm.runtime.constrained.spec import GRAMMAR_KINDS, GrammarKind, validate
from radixlm.runtime.constrained.vocabulary import GrammarVocabulary, get_grammar_vocabulary

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
