"""Per JSON-schema keyword, what each grammar engine does with it, raw and behind our door.

Each probe is a small schema using one keyword, an instance it accepts and one it rejects. An
engine "compiled" a probe when it lowers it; it "violated" it when its grammar accepts the
rejected instance (the text `json.dumps` lays out); else it "refused". `engine_rows` measures the
engines as they are (xgrammar, llguidance, outlines, given the schema as written); `door_rows`
measures what the server does (`backends.validate`: our rewrite, then the first engine that
enforces the result). `python -m radixlm.runtime.bench.schema_keywords` prints the markdown
table of docs/json-schema.md and the corpus totals (`corpus_totals`).

A grammar accepts a text: xgrammar's by its matcher over bytes; llguidance's by a matcher over the
default model's tokens (the tokenizer's own split of the text); outlines' regex by Python's `re`.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from radixlm.runtime.constrained.errors import GrammarError

if TYPE_CHECKING:
    from radixlm.runtime.constrained.lowered import LoweredGrammar

Probe = tuple[dict[str, Any], object, object]
ENGINES = ("xgrammar", "llguidance", "outlines")
PROBES: dict[str, Probe] = {
    "pattern": ({"type": "string", "pattern": "^[a-z]{3}$"}, "abc", "abcd"),
    "pattern with an optional group": ({"type": "string", "pattern": "^(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
                                                      "(?:[.][0-9]+)?Z$"}, "00:04:00Z", "00:04:000Z"),
    "pattern + minLength": ({"type": "string", "pattern": "^[a-z]+$", "minLength": 3}, "abc", "ab"),
    "format date": ({"type": "string", "format": "date"}, "2024-01-02", "2024-13-45x"),
    "format date (calendar)": ({"type": "string", "format": "date"}, "2024-02-28", "2023-02-29"),
    "format date-time": ({"type": "string", "format": "date-time"}, "2024-01-02T03:04:05Z", "yesterday"),
    "format date-time (offset)": ({"type": "string", "format": "date-time"}, "2024-01-02T03:04:05Z",
                                  "2024-01-02T03:04:05"),
    "format email": ({"type": "string", "format": "email"}, "a@b.co", "nope"),
    "format uri": ({"type": "string", "format": "uri"}, "https://x.org/a", "not a uri"),
    "format hostname": ({"type": "string", "format": "hostname"}, "x.org", "bad host!"),
    "format ipv4": ({"type": "string", "format": "ipv4"}, "1.2.3.4", "256.1.1.1"),
    "format uuid": ({"type": "string", "format": "uuid"}, "123e4567-e89b-12d3-a456-426614174000", "xyz"),
    "format regex": ({"type": "string", "format": "regex"}, "a+", "("),
    "format uri-reference": ({"type": "string", "format": "uri-reference"}, "../ci/build.yml", "a b"),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1], [1, 1]),
    "const (object)": ({"const": {"a": [1, None]}}, {"a": [1, None]}, {"a": [2, None]}),
    "enum (any values)": ({"enum": [1, "x", None, {"k": True}, [1]]}, {"k": True}, {"k": False}),
    "patternProperties": ({"type": "object", "patternProperties": {"^x-": {"type": "integer"}},
                           "additionalProperties": False}, {"x-a": 1}, {"y": 1}),
    "additionalProperties (schema)": ({"type": "object", "properties": {"a": {"type": "integer"}},
                                       "additionalProperties": {"type": "string"}}, {"a": 1, "b": "s"}, {"a": 1, "b": 2}),
    "propertyNames": ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"},
                       "additionalProperties": {"type": "integer"}}, {"ab": 1}, {"A1": 1}),
    "if / then / else": ({"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "v": {"type": ["integer", "string"]}},
                          "required": ["k", "v"], "if": {"properties": {"k": {"const": "a"}}},
                          "then": {"properties": {"v": {"type": "integer"}}},
                          "else": {"properties": {"v": {"type": "string"}}}}, {"k": "a", "v": 1}, {"k": "a", "v": "s"}),
    "if (two levels down)": ({"type": "object", "required": ["r", "v"], "properties": {
        "r": {"type": "object", "properties": {"u": {"enum": ["a", "b"]}}, "required": ["u"]},
        "v": {"type": ["integer", "string"]}}, "if": {"properties": {"r": {"properties": {"u": {"const": "a"}}}}},
        "then": {"properties": {"v": {"type": "integer"}}}, "else": {"properties": {"v": {"type": "string"}}}},
        {"r": {"u": "a"}, "v": 1}, {"r": {"u": "a"}, "v": "s"}),
    "dependentRequired": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "dependentRequired": {"a": ["b"]}}, {"a": 1, "b": 2}, {"a": 1}),
    "dependencies (draft-07)": ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                                 "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                 "dependencies": {"a": ["b"]}}, {"a": 1, "b": 2}, {"a": 1}),
    "dependentSchemas": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                          "dependentSchemas": {"a": {"required": ["b"]}}}, {"a": 1, "b": 2}, {"a": 1}),
    "required outside properties": ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "z"]},
                                    {"a": 1, "z": []}, {"a": 1}),
    "$ref inside allOf": ({"$defs": {"b": {"type": "object", "properties": {"n": {"type": "string"}}, "required": ["n"]}},
                           "allOf": [{"$ref": "#/$defs/b"}, {"properties": {"m": {"type": "integer"}}, "required": ["m"]}]},
                          {"n": "x", "m": 1}, {"m": 1}),
    "$ref inside anyOf": ({"definitions": {"b": {"type": "integer"}}, "anyOf": [{"$ref": "#/definitions/b"},
                                                                                 {"type": "null"}]}, 1, "x"),
    "$ref with siblings": ({"$defs": {"s": {"type": "string"}}, "type": "object", "required": ["a"],
                            "properties": {"a": {"$ref": "#/$defs/s", "maxLength": 2}}}, {"a": "ab"}, {"a": "abc"}),
    "properties beside anyOf": ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                                 "anyOf": [{"required": ["b"], "properties": {"b": {"type": "integer"}}},
                                           {"required": ["c"], "properties": {"c": {"type": "integer"}}}]},
                                {"a": 1, "b": 2}, {"b": 1}),
    "oneOf (disjoint types)": ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, 1, [1]),
    "oneOf (overlapping)": ({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]}, -1, 1),
    "oneOf (overlapping objects)": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                     "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}, {"a": 1}, {"a": 1, "b": 2}),
    "not": ({"type": "integer", "not": {"const": 3}}, 2, 3),
    "not (required)": ({"type": "object", "properties": {"a": {"type": "integer"}}, "not": {"required": ["a"]}},
                       {}, {"a": 1}),
    "not (pattern)": ({"type": "string", "not": {"pattern": "\\.\\."}}, "a.b", "a..b"),
    "maxProperties 1 (closed)": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                  "additionalProperties": False, "maxProperties": 1}, {"b": 1}, {"a": 1, "b": 2}),
    "minProperties": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "minProperties": 1}, {"a": 1}, {}),
    "maxProperties": ({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1},
                      {"a": 1}, {"a": 1, "b": 2}),
    "contains": ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, [5], [1]),
    "multipleOf": ({"type": "integer", "multipleOf": 5}, 10, 7),
    "exclusiveMinimum (draft-04 boolean)": ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer",
                                             "minimum": 0, "exclusiveMinimum": True}, 1, 0),
    "items array (draft-07)": ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
                                "items": [{"type": "integer"}, {"type": "string"}], "additionalItems": False},
                               [1, "a"], [1, 2]),
    "prefixItems": ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
                    [1, "a"], [1, 2]),
    "draft-04 id + definitions": ({"$schema": "http://json-schema.org/draft-04/schema#", "id": "http://x.invalid/y.json",
                                   "type": "object", "properties": {"a": {"$ref": "#/definitions/a"}},
                                   "definitions": {"a": {"type": "integer"}}}, {"a": 1}, {"a": "s"}),
    "unevaluatedProperties": ({"type": "object", "properties": {"a": {"type": "integer"}},
                               "unevaluatedProperties": False}, {"a": 1}, {"a": 1, "b": 1}),
}


class Acceptors:
    """For each engine, `accepts(engine, lowered_form, text)`: whether its grammar takes `text`."""

    def __init__(self) -> None:
        import llguidance.hf
        from transformers import AutoTokenizer

        from radixlm.runtime.model.model_files import resolve_model_path

        self._hf = AutoTokenizer.from_pretrained(resolve_model_path(None))
        self._llt = llguidance.hf.from_tokenizer(self._hf)

    def accepts(self, engine: str, form: str, text: str) -> bool:
        if engine == "xgrammar":
            import xgrammar as xgr
            from xgrammar.testing import _is_grammar_accept_string

            return bool(_is_grammar_accept_string(xgr.Grammar.deserialize_json(form), text))
        if engine == "outlines":
            return re.fullmatch(form, text) is not None
        import llguidance

        matcher = llguidance.LLMatcher(self._llt, form, log_level=0)
        ids = self._hf.encode(text, add_special_tokens=False)
        if matcher.is_error() or matcher.validate_tokens(ids) != len(ids):
            return False
        for token_id in ids:
            matcher.consume_token(token_id)
        return bool(matcher.is_accepting())


    def accepts_lowered(self, lowered: LoweredGrammar, text: str) -> bool:
        """Whether the server takes `text` for a grammar the door lowered: its engine's grammar, and
        where the schema has `uniqueItems`, the sampling-time check (`unique_items`)."""
        from radixlm.runtime.constrained.unique_items import keeps_unique

        return self.accepts(lowered.backend, lowered.form, text) and (
            not lowered.unique_items or keeps_unique(lowered.unique_items, text))


def raw_lowering(engine: str, schema: dict[str, Any]) -> str:
    """The engine's own lowering of the schema as written (no rewrite, no refusal of ours)."""
    text = json.dumps(schema)
    if engine == "xgrammar":
        import xgrammar as xgr

        try:
            return str(xgr.Grammar.from_json_schema(text, any_whitespace=False).serialize_json())
        except (RuntimeError, ValueError) as e:
            raise GrammarError(str(e).strip().splitlines()[0]) from None
    if engine == "llguidance":
        from radixlm.runtime.constrained import llguidance_backend

        lowered: LoweredGrammar = llguidance_backend.lower("json_schema", text)
        llguidance_backend.check(lowered)
        return lowered.form
    from radixlm.runtime.constrained.spec import lower

    return lower("json_schema", schema).form


def outcome(accepts: Callable[[str, str, str], bool], engine: str, form: str, probe: Probe) -> str:
    """compiled / violated / rejects-valid for a lowered probe."""
    _, good, bad = probe
    if accepts(engine, form, json.dumps(bad)):
        return "violated"
    return "compiled" if accepts(engine, form, json.dumps(good)) else "compiled (stricter)"


def engine_rows(acceptors: Acceptors) -> dict[str, dict[str, str]]:
    """probe name -> engine -> what the engine alone did."""
    rows: dict[str, dict[str, str]] = {}
    for name, probe in PROBES.items():
        rows[name] = {}
        for engine in ENGINES:
            try:
                form = raw_lowering(engine, probe[0])
            except GrammarError:
                rows[name][engine] = "refused"
                continue
            rows[name][engine] = outcome(acceptors.accepts, engine, form, probe)
    return rows


def _accepts_lowered(acceptors: Acceptors, lowered: LoweredGrammar, _engine: str, _form: str, text: str) -> bool:
    """`outcome`'s acceptor for a grammar the door lowered (engine and form are the lowered one's)."""
    return acceptors.accepts_lowered(lowered, text)


def door_rows(acceptors: Acceptors, preferred: str = "xgrammar") -> dict[str, str]:
    """probe name -> what the server does with `--grammar-backend preferred`: "<engine>: compiled",
    "<engine>: violated" (never, tests/runtime/test_schema_engines.py), or "refused (400)"."""
    from radixlm.runtime.constrained.backends import validate

    rows = {}
    for name, probe in PROBES.items():
        try:
            lowered = validate(preferred, "json_schema", probe[0])
        except GrammarError:
            rows[name] = "refused (400)"
            continue
        taken = functools.partial(_accepts_lowered, acceptors, lowered)
        rows[name] = f"{lowered.backend}: {outcome(taken, lowered.backend, lowered.form, probe)}"
    return rows


def corpus_totals(preferred: str = "xgrammar", with_big: bool = True) -> dict[str, Any]:
    """Over both corpora (and the generated 1-3 MB schemas): how many each engine serves, how
    many are refused (with the reasons), and the seconds the door took."""
    from radixlm.runtime.bench import hard_schema_corpus, schema_corpus
    from radixlm.runtime.constrained.backends import validate

    entries = hard_schema_corpus.corpus() + schema_corpus.corpus()
    if with_big:
        entries += hard_schema_corpus.big_schemas()
    served: dict[str, int] = {}
    refused: dict[str, str] = {}
    start = time.perf_counter()
    for entry in entries:
        try:
            engine = validate(preferred, "json_schema", entry.schema).backend
            served[engine] = served.get(engine, 0) + 1
        except GrammarError as e:
            refused[entry.name] = str(e)
    return {"num_schemas": len(entries), "served": served, "refused": refused,
            "compiled_share": sum(served.values()) / len(entries), "secs": time.perf_counter() - start}


def markdown_table(raw: dict[str, dict[str, str]], door: dict[str, str]) -> str:
    lines = ["| keyword | xgrammar alone | llguidance alone | outlines alone | radixlm (xgrammar first) |",
             "|---|---|---|---|---|"]
    for name in PROBES:
        lines.append(f"| {name} | " + " | ".join(raw[name][e] for e in ENGINES) + f" | {door[name]} |")
    return "\n".join(lines)


def main() -> None:
    acceptors = Acceptors()
    print(markdown_table(engine_rows(acceptors), door_rows(acceptors)))
    totals = corpus_totals()
    print(json.dumps(totals, indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()
