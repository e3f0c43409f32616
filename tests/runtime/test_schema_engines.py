"""JSON schemas at the front door (`backends.validate`): the rewrite (`schema_rewrite`) and the
per-schema engine choice (`engine_choice`). No engine is handed a schema it would let an output
violate: for every keyword probe the chosen engine's grammar rejects the probe's invalid instance;
every schema of both corpora compiles (>= 90%) or is refused naming a keyword; the hard corpus's
examples satisfy their schemas under `jsonschema` with a format checker."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import FormatChecker
from jsonschema.validators import validator_for

from radixlm.runtime.bench import hard_schema_corpus, schema_corpus, schema_keywords
from radixlm.runtime.constrained.backends import validate
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.schema_rewrite import rewrite_schema
from radixlm.runtime.constrained.unique_items import keeps_unique

HARD = hard_schema_corpus.corpus()


def _errors(schema: dict[str, Any], instance: object) -> list[str]:
    validator = validator_for(schema)
    validator.check_schema(schema)
    return [e.message for e in validator(schema, format_checker=FormatChecker()).iter_errors(instance)]


def test_hard_corpus_is_the_builders_output_and_its_examples_validate() -> None:
    assert [(e.name, e.schema, e.example) for e in HARD] == [(e.name, e.schema, e.example)
                                                              for e in hard_schema_corpus.build()]
    assert len(HARD) >= 150 and len({e.name for e in HARD}) == len(HARD)
    assert len({json.dumps(e.schema, sort_keys=True) for e in HARD}) == len(HARD)
    for entry in HARD:
        assert not _errors(entry.schema, entry.example), entry.name


def test_format_checker_checks_the_formats_outputs_use() -> None:
    # with rfc3339-validator, rfc3986-validator and fqdn (the test extra), these are asserted
    for fmt, wrong in (("date-time", "yesterday"), ("uri", "not a uri"), ("hostname", "bad host!"),
                       ("date", "2024-13-45"), ("ipv4", "256.1.1.1")):
        assert _errors({"type": "string", "format": fmt}, wrong), fmt


@pytest.mark.parametrize("preferred", schema_keywords.ENGINES)
def test_the_chosen_engine_never_accepts_what_the_schema_rejects(preferred: str) -> None:
    acceptors = schema_keywords.Acceptors()
    served = 0
    for name, (schema, good, bad) in schema_keywords.PROBES.items():
        assert not _errors(schema, good) and _errors(schema, bad), name  # the probe itself is right
        try:
            lowered = validate(preferred, "json_schema", schema)
        except GrammarError as e:
            assert "does not enforce" in str(e) or "refuses it" in str(e), (name, str(e))
            continue
        served += 1
        assert not acceptors.accepts_lowered(lowered, json.dumps(bad)), (preferred, name, lowered.backend)
    assert served >= len(schema_keywords.PROBES) - 3


def test_rewrites_are_exact_or_stricter() -> None:
    cases = [  # (schema, instances): each instance valid for the rewrite is valid for the schema
        ({"properties": {"k": {"enum": ["a", "b"]}, "v": {}}, "if": {"properties": {"k": {"const": "a"}}},
          "then": {"properties": {"v": {"type": "integer"}}}, "else": {"properties": {"v": {"type": "string"}}}},
         [{"k": "a", "v": 1}, {"k": "a", "v": "s"}, {"k": "b", "v": "s"}, {"k": "b", "v": 1}, {"v": 1}]),
        ({"type": "array", "uniqueItems": True}, [[], [1], [1, 1], [1, 2], [1, 1.0], [{"a": 1, "b": 2}, {"b": 2, "a": 1}]]),
        ({"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}},
         [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}]),
        ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, [[], [5], [1, 5], [5, 1]]),
        ({"propertyNames": {"enum": ["a", "b"]}, "additionalProperties": {"type": "integer"}},
         [{}, {"a": 1}, {"c": 1}, {"a": "x"}]),
        ({"allOf": [{"$ref": "#/$defs/x"}, {"required": ["m"]}], "$defs": {"x": {"properties": {"m": {"type": "integer"}},
                                                                               "additionalProperties": False}}},
         [{"m": 1}, {"m": "s"}, {}, {"n": 1}]),
        # oneOf overlapping only by type (Kubernetes' Quantity): the shared types dropped
        ({"oneOf": [{"type": ["string", "null"]}, {"type": ["number", "null"]}]}, ["1Gi", 2, 2.5, None, True]),
        ({"oneOf": [{"type": "integer", "minimum": 5}, {"type": "number", "maximum": 1}]}, [7, 0, 0.5, 3, 3.5, "x"]),
        ({"oneOf": [{"type": "string", "maxLength": 2}, {"type": ["string", "boolean"], "minLength": 4}]},
         ["ab", "abcd", True, "abc"]),
        # closed objects that differ by optional properties: each requires one of its own
        ({"oneOf": [{"type": "object", "properties": {"email": {}, "if": {}}, "additionalProperties": False},
                    {"type": "object", "properties": {"slack": {}, "if": {}}, "additionalProperties": False}]},
         [{}, {"if": 1}, {"email": 1}, {"slack": 1, "if": 2}, {"email": 1, "slack": 1}]),
        # oneOf of references (their targets inlined so that their types show), unknown keywords dropped
        ({"oneOf": [{"$ref": "#/definitions/a"}, {"$ref": "#/definitions/b"}], "x-note": {"type": "integer"},
          "definitions": {"a": {"type": "string"}, "b": {"type": "object", "self": {"format": "jsonschema"}}}},
         ["s", {}, 1, None]),
    ]
    for schema, instances in cases:
        rewritten = rewrite_schema(schema)
        for instance in instances:  # uniqueItems: dropped by the rewrite, kept at sampling time
            if not _errors(rewritten, instance) and keeps_unique(json.dumps(schema), json.dumps(instance)):
                assert not _errors(schema, instance), (schema, rewritten, instance)


def test_overlapping_types_and_annotations_are_served() -> None:
    quantity = {"oneOf": [{"type": ["string", "null"]}, {"type": ["number", "null"]}]}
    assert rewrite_schema(quantity) == {"anyOf": [{"type": "string"}, {"type": "number"}]}
    # a fraction-only remainder has no `type`: the oneOf stays (and is refused, naming it)
    assert "oneOf" in rewrite_schema({"oneOf": [{"type": "integer"}, {"type": "number"}]})
    event = {"self": {"vendor": "com.example", "format": "jsonschema"}, "type": "object",
             "properties": {"url": {"type": ["string", "null"], "format": "uri", "maxLength": 4096}}}
    assert "self" not in rewrite_schema(event)
    for schema in (quantity, event):
        validate("xgrammar", "json_schema", schema)  # served (GrammarError otherwise)
    arrays = {"oneOf": [{"type": "array", "minItems": 1, "items": {"type": "string"}},
                        {"type": "array", "minItems": 1, "items": {"type": "integer"}}]}
    assert "anyOf" in rewrite_schema(arrays) and "oneOf" not in rewrite_schema(arrays)
    assert "oneOf" in rewrite_schema({"oneOf": [{**b, "minItems": 0} for b in arrays["oneOf"]]})  # [] matches both
    notify = {"type": "array", "items": {"oneOf": [
        {"type": "string", "enum": ["github_check"]},
        {"type": "object", "properties": {"email": {"type": "string"}, "if": {"type": "string"}},
         "additionalProperties": False},
        {"type": "object", "properties": {"slack": {"type": "string"}, "if": {"type": "string"}},
         "additionalProperties": False}]}}
    branches = rewrite_schema(notify)["items"]["anyOf"]
    assert [b.get("required") for b in branches] == [None, ["email"], ["slack"]]
    validate("xgrammar", "json_schema", notify)
    pointed = {"components": {"a": {"type": "integer"}}, "$ref": "#/components/a"}
    assert rewrite_schema(pointed)["type"] == "integer"


def test_both_corpora_compile_at_the_door() -> None:
    totals = schema_keywords.corpus_totals(with_big=False)
    assert totals["compiled_share"] >= 0.9, totals
    assert all("does not enforce" in reason for reason in totals["refused"].values()), totals["refused"]
    assert set(totals["served"]) <= {"xgrammar", "llguidance", "outlines"} and len(totals["served"]) >= 2


def test_a_megabyte_schema_compiles_and_oversize_is_refused() -> None:
    big = hard_schema_corpus.big_schema(160)
    assert len(json.dumps(big.schema)) > 1_000_000
    assert not _errors(big.schema, big.example)
    assert validate("xgrammar", "json_schema", big.schema).backend in ("xgrammar", "llguidance")
    with pytest.raises(GrammarError, match="too long"):
        validate("xgrammar", "json_schema", {"description": "x" * (5 * 1024 * 1024)})


def test_refusal_names_the_keyword() -> None:
    with pytest.raises(GrammarError, match="'not'"):
        validate("xgrammar", "json_schema", {"type": "integer", "not": {"const": 3}})
    with pytest.raises(GrammarError, match="additionalProperties"):
        validate("xgrammar", "json_schema", {"properties": {}, "required": ["a"], "additionalProperties": False})


def test_the_old_corpus_still_loads() -> None:
    assert len(schema_corpus.corpus()) >= 150


def test_a_discriminator_the_parent_lists_fully_keeps_the_absent_case_exact() -> None:
    # every listed value passes `if`, and `if` does not require k: an absent k passes too (then)
    schema = {"type": "object", "properties": {"k": {"enum": ["a"]}, "v": {}},
              "if": {"properties": {"k": {"const": "a"}}}, "then": {"required": ["v"]}, "else": {"required": ["w"]}}
    rewritten = rewrite_schema(schema)
    for instance in ({}, {"k": "a"}, {"v": 1}, {"w": 1}, {"k": "a", "v": 1}):
        if not _errors(rewritten, instance):
            assert not _errors(schema, instance), (rewritten, instance)
