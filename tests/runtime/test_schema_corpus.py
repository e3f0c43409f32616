"""The grammar-coverage schema corpus (radixlm.runtime.bench.schema_corpus): valid Draft 2020-12
schemas, each satisfied by its example under a format checker that really checks the formats used;
the feature quotas hold, as counted by `features`, which is itself checked on small schemas."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import pytest
from jsonschema import Draft202012Validator, FormatChecker

from radixlm.runtime.bench.schema_corpus import CHECKED_FORMATS, CorpusSchema, corpus, features

QUOTAS = {"ref_recursive": 20, "pattern": 20, "format": 20, "union": 20, "array_bounds": 20, "wide": 10}
WRONG_VALUES = {"date": "2024-13-45", "email": "not-an-email", "ipv4": "256.1.1.1", "ipv6": "2001:db8::g",
                "uuid": "not-a-uuid"}
CORPUS = corpus()
_DEF_REF = re.compile(r'"\$ref": "#/(?:\$defs|definitions)/(\w+)"')


def _dicts(node: object) -> list[dict[str, Any]]:
    """Every JSON object inside `node` (keyword-blind: fine for the checks below)."""
    if isinstance(node, dict):
        return [node, *(d for value in node.values() for d in _dicts(value))]
    if isinstance(node, list):
        return [d for value in node for d in _dicts(value)]
    return []


def _mutually_recursive(schema: dict[str, Any]) -> bool:
    """Two different definitions that reach each other through `$ref`s."""
    edges = {name: set(_DEF_REF.findall(json.dumps(body)))
             for key in ("$defs", "definitions") for name, body in schema.get(key, {}).items()}

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        stack = [start]
        while stack:
            for nxt in edges.get(stack.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    return any(a != b and a in reach(b) for a in edges for b in reach(a))


@pytest.mark.parametrize("entry", CORPUS, ids=[entry.name for entry in CORPUS])
def test_schema_is_valid_and_example_satisfies_it(entry: CorpusSchema) -> None:
    Draft202012Validator.check_schema(entry.schema)
    errors = [e.message for e in Draft202012Validator(entry.schema, format_checker=FormatChecker())
              .iter_errors(entry.example)]
    assert not errors, errors


def test_size_names_and_determinism() -> None:
    names = [entry.name for entry in CORPUS]
    assert len(names) >= 150 and len(set(names)) == len(names)
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", name) for name in names)
    assert corpus() == CORPUS


def test_quotas() -> None:
    counts = Counter(feature for entry in CORPUS for feature in features(entry.schema))
    recursive = [entry.schema for entry in CORPUS if "ref_recursive" in features(entry.schema)]
    mix = {"$ref #": sum('"$ref": "#"' in json.dumps(s) for s in recursive),
           "$defs": sum("$defs" in s for s in recursive),
           "definitions": sum("definitions" in s for s in recursive),
           "mutual": sum(map(_mutually_recursive, recursive))}
    message = f"features {dict(counts)}, recursion {mix}"
    assert all(counts[feature] >= quota for feature, quota in QUOTAS.items()), message
    assert min(mix.values()) >= 1 and mix["mutual"] >= 5, message


def test_small_enough_for_a_tiny_model() -> None:
    for entry in CORPUS:
        nodes = _dicts(entry.schema)
        assert all(node.get("minItems", 0) <= 3 for node in nodes), entry.name
        wide = [node for node in nodes if len(node.get("properties", ())) >= 50]
        assert all(len(node.get("required", ())) <= 5 for node in wide), entry.name
        for pattern in (node["pattern"] for node in nodes if isinstance(node.get("pattern"), str)):
            re.compile(pattern)
            assert "(?" not in pattern and not re.search(r"\\[1-9]", pattern), (entry.name, pattern)


def test_formats_used_are_the_checked_ones() -> None:
    used = {node["format"] for entry in CORPUS for node in _dicts(entry.schema)
            if isinstance(node.get("format"), str)}
    assert used == set(CHECKED_FORMATS)


@pytest.mark.parametrize("name", CHECKED_FORMATS)
def test_checked_format_rejects_a_wrong_value(name: str) -> None:
    validator = Draft202012Validator({"type": "string", "format": name}, format_checker=FormatChecker())
    assert not validator.is_valid(WRONG_VALUES[name])


def test_features_on_small_schemas() -> None:
    position = {"type": "array", "items": {"type": "number"}, "minItems": 2}
    plain_ref = {"$defs": {"position": position,
                           "line": {"type": "array", "items": {"$ref": "#/$defs/position"}}},
                 "properties": {"a": {"$ref": "#/$defs/position"}, "b": {"$ref": "#/$defs/line"}}}
    assert features(plain_ref) == {"array_bounds"}
    linked = {"properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}}
    assert features(linked) == {"ref_recursive", "union"}
    mutual = {"$ref": "#/definitions/a", "definitions": {
        "a": {"properties": {"b": {"$ref": "#/definitions/b"}}},
        "b": {"type": "array", "items": {"$ref": "#/definitions/a"}}}}
    assert features(mutual) == {"ref_recursive"}
    trie = {"$defs": {"n": {"additionalProperties": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}
    assert features(trie) == {"ref_recursive"}
    keywords_as_names = {"properties": {"pattern": {"type": "string"}, "format": {"type": "string"},
                                        "anyOf": {"type": "string"}, "minItems": {"type": "integer"}}}
    assert features(keywords_as_names) == set()
    date = {"properties": {"d": {"type": "string", "format": "date", "pattern": "^2"}}}
    assert features(date) == {"format", "pattern"}
    assert features({"properties": {f"p{i}": {"type": "integer"} for i in range(50)}}) == {"wide"}
    assert features({"properties": {f"p{i}": {"type": "integer"} for i in range(49)}}) == set()
