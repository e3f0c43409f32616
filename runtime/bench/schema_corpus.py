"""A corpus of real-world-style JSON Schemas (Draft 2020-12) for measuring grammar-engine coverage:
the share of schemas a backend compiles and whose outputs validate. Written for this project (no
schema or text copied from elsewhere); each entry carries a small `example` proving it satisfiable.

The schemas are data: `data/schema_corpus.json`, `{"dialect": ..., "schemas": [...]}` with one
`{"name", "schema", "example"}` entry per line (the dialect is added to each schema as `$schema`
when loaded). tests/runtime/test_schema_corpus.py checks every entry (a valid schema, its example
valid under a format checker that really checks the formats used, a unique snake_case name) and
the quotas below, counted by `features` here.

Quotas, each counted by `features` (a schema may count for several): at least 20 schemas with a
recursive `$ref` (`#`, `$defs`, `definitions`; at least 5 by mutual recursion), 20 with `pattern`,
20 with `format`, 20 with `anyOf`/`oneOf`, 20 with bounded arrays (`minItems`/`maxItems`) and 10
wide objects (50+ properties); the rest are plain objects (enums, consts, nested objects, numeric
bounds, nullable types, closed objects, string lengths) over varied domains.

So that a tiny model can finish under a modest token budget: recursion is always optional (the
recursive fields are never required, recursive arrays accept 0 items), `minItems` is at most 3,
the wide objects require at most 5 fields, and patterns are simple regexes (no lookaround or
backreference).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard
from urllib.parse import unquote

from radixlm.runtime.bench.data_files import load_json

Schema = dict[str, Any]
CORPUS_FILE = "schema_corpus.json"

# The formats the corpus uses, each one `jsonschema.FormatChecker()` really checks (a wrong value
# fails each: tests/runtime/test_schema_corpus.py). The test extra also installs the packages it
# needs for `date-time`, `time`, `uri` and `hostname` (rfc3339-validator, rfc3986-validator,
# fqdn), which the hard corpus uses (`hard_schema_corpus`); this corpus keeps its five.
# (`email` only checks for an "@".)
CHECKED_FORMATS = ("date", "email", "ipv4", "ipv6", "uuid")


@dataclass(frozen=True)
class CorpusSchema:
    name: str
    schema: Schema
    example: object


def corpus() -> list[CorpusSchema]:
    """Every schema of the corpus, in the file's order, loaded afresh as plain JSON (no two parts
    share an object, so callers may mutate them)."""
    data = load_json(CORPUS_FILE)
    return [CorpusSchema(entry["name"], {"$schema": data["dialect"], **entry["schema"]}, entry["example"])
            for entry in data["schemas"]]


# --- features -----------------------------------------------------------------------------------

_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas"})
_DEFINITIONS = frozenset({"$defs", "definitions"})
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_VALUES = frozenset({"items", "additionalItems", "additionalProperties", "unevaluatedItems",
                            "unevaluatedProperties", "contains", "propertyNames", "not", "if", "then",
                            "else"})


def features(schema: Schema) -> set[str]:
    """Which of ref_recursive, pattern, format, union, array_bounds, wide the schema uses."""
    found: set[str] = set()
    for sub in _subschemas(schema):
        if "pattern" in sub:
            found.add("pattern")
        if "format" in sub:
            found.add("format")
        if "anyOf" in sub or "oneOf" in sub:
            found.add("union")
        if "minItems" in sub or "maxItems" in sub:
            found.add("array_bounds")
        if isinstance(sub.get("properties"), dict) and len(sub["properties"]) >= 50:
            found.add("wide")
        ref = sub.get("$ref")
        if _is_pointer(ref) and (ref == "#" or _reaches_itself(schema, ref)):
            found.add("ref_recursive")
    return found


def _subschemas(schema: object, *, definitions: bool = True) -> Iterator[Schema]:
    """`schema` and every schema in it, by keyword (a property named `pattern` is not the keyword);
    without `definitions`, `$defs`/`definitions` bodies are skipped: only a `$ref` enters them."""
    if not isinstance(schema, dict):
        return
    yield schema
    for key, value in schema.items():
        if key in _SCHEMA_MAPS or (definitions and key in _DEFINITIONS):
            children = list(value.values())
        elif key in _SCHEMA_LISTS or (key == "items" and isinstance(value, list)):
            children = value
        elif key in _SCHEMA_VALUES:
            children = [value]
        else:
            continue
        for child in children:
            yield from _subschemas(child, definitions=definitions)


def _is_pointer(ref: object) -> TypeGuard[str]:
    """A local `$ref` by JSON pointer: `#` or `#/...` (not an anchor, not another document)."""
    return isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))


def _resolve(root: Schema, ref: str) -> object:
    """What a local `$ref` (a JSON pointer after `#`) points at; None when it points nowhere."""
    node: Any = root
    for token in ref.removeprefix("#").split("/")[1:]:
        token = unquote(token).replace("~1", "/").replace("~0", "~")
        try:
            node = node[int(token)] if isinstance(node, list) else node[token]
        except (KeyError, IndexError, ValueError, TypeError):
            return None
    return node


def _reaches_itself(root: Schema, target: str) -> bool:
    """Whether the schema at `target` leads back to `target` through local `$ref`s."""
    seen, stack = {target}, [target]
    while stack:
        for sub in _subschemas(_resolve(root, stack.pop()), definitions=False):
            ref = sub.get("$ref")
            if ref == target:
                return True
            if _is_pointer(ref) and ref not in seen:
                seen.add(ref)
                stack.append(ref)
    return False
