"""A request's grammar spec (kind + spec) -> canonical text (the cache key) -> regex.

Kinds: "regex" (a regex string, Rust `regex` syntax as outlines-core compiles it), "json_schema"
(a dict or a JSON string), "choices" (a list of strings; the output is exactly one of them).

Lowered once: the front door checks a spec by lowering it (`lower`), and the `LoweredGrammar` it
gets (the outlines backend's: its form is the regex) travels with the request to the compile
worker (`GrammarBackend.get_lowered`), which builds the token index of that regex as it is.
"""

from __future__ import annotations

import json
from typing import Literal, get_args

from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.json_schema import parse_schema, schema_to_regex
from radixlm.runtime.constrained.lowered import LoweredGrammar, LoweringSettings
from radixlm.runtime.constrained.regex_syntax import check_regex_size, check_regex_syntax, escape_literal

GrammarKind = Literal["regex", "json_schema", "choices"]
GRAMMAR_KINDS: tuple[str, ...] = get_args(GrammarKind)


def normalize_spec(kind: str, spec: object) -> str:
    """The canonical text of a spec: equal specs give equal text. Cheap; GrammarError if malformed
    or over the size bounds of `limits` (regex length and positions; schema text and nesting).

    JSON schemas keep their key order, since it decides the order of properties in the output.
    """
    if kind == "regex":
        if not isinstance(spec, str):
            raise GrammarError(f"regex must be a string, got {type(spec).__name__}")
        check_regex_size(spec)
        return spec
    if kind == "json_schema":
        return json.dumps(parse_schema(spec), separators=(",", ":"), ensure_ascii=False)
    if kind == "choices":
        if not isinstance(spec, (list, tuple)) or not spec:
            raise GrammarError("choices must be a non-empty list of strings")
        if not all(isinstance(choice, str) for choice in spec):
            raise GrammarError("choices must all be strings")
        return json.dumps(list(spec), ensure_ascii=False)
    raise GrammarError(f"unknown grammar kind {kind!r}; expected one of {', '.join(GRAMMAR_KINDS)}")


def choices_regex(choices: list[str]) -> str:
    """A regex matching exactly one of `choices` (each escaped literally)."""
    return "(?:" + "|".join(escape_literal(choice) for choice in choices) + ")"


def spec_to_regex(kind: str, normalized: str, whitespace_pattern: str | None = None) -> str:
    """The regex for a normalized spec (from `normalize_spec`); GrammarError if unsupported.

    `whitespace_pattern` applies to JSON schemas only (None: outlines-core's `[ ]?`).
    """
    if kind == "regex":
        return normalized
    if kind == "json_schema":
        return schema_to_regex(json.loads(normalized), whitespace_pattern)
    if kind == "choices":
        return choices_regex(json.loads(normalized))
    raise GrammarError(f"unknown grammar kind {kind!r}; expected one of {', '.join(GRAMMAR_KINDS)}")


def outlines_settings(whitespace_pattern: str | None) -> LoweringSettings:
    """The outlines backend's `LoweredGrammar.settings`: its JSON whitespace pattern."""
    return (("whitespace_pattern", whitespace_pattern),)


def lower(kind: str, spec: object, whitespace_pattern: str | None = None) -> LoweredGrammar:
    """The spec checked (as `validate` says) and lowered to its regex; GrammarError if it cannot be."""
    return lower_checked(kind, normalize_spec(kind, spec), whitespace_pattern)


def lower_checked(kind: str, normalized: str, whitespace_pattern: str | None = None) -> LoweredGrammar:
    """`lower` of a normalized spec (`normalize_spec`)."""
    if kind == "regex":
        check_regex_syntax(normalized)
    return lower_normalized(kind, normalized, whitespace_pattern)


def lower_normalized(kind: str, normalized: str, whitespace_pattern: str | None = None) -> LoweredGrammar:
    """A normalized spec (`normalize_spec`) lowered to its regex (JSON schemas with
    `whitespace_pattern`); GrammarError if unsupported."""
    regex = spec_to_regex(kind, normalized, whitespace_pattern)
    return LoweredGrammar("outlines", kind, normalized, regex, outlines_settings(whitespace_pattern))


def validate(kind: str, spec: object) -> None:
    """Raises GrammarError for a spec that is malformed, quickly and without a token index.

    Catches: unknown kind, non-string or syntactically invalid regex, a schema that is not JSON,
    not an object, or unsupported (typically well under a millisecond for ordinary specs), bad
    choices, and specs over the size bounds (see `limits`). A spec that passes can still fail at
    compile time (e.g. lookaround in a regex, or an index that takes too long to build), with a
    GrammarError from `GrammarBackend.get`'s future.
    """
    lower(kind, spec)
