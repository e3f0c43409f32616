"""An upper bound of the size of the regex outlines-core builds for a JSON schema, before it builds it.

outlines-core's translation repeats subschemas: an array's `items` appear twice (first item, then
`,item` repeated), an object whose properties are all optional lists property i in k - i
alternatives (so k properties cost ~k**2 / 2 copies), `additionalProperties` twice, and a `$ref`
is expanded in place (up to 4 nested references). Nesting multiplies these factors, so a schema of
a few hundred bytes can ask for a regex of gigabytes (eight nested arrays: 2**8 copies of the leaf;
nested objects of optional properties grow tenfold per level); building it would exhaust memory
before any limit on its result could apply. `estimate_regex_chars` walks the schema once,
following outlines-core's dispatch order, and stops as soon as the bound passes `limit`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# outlines-core's regex for an unconstrained value (`{}`): ~14,000 characters; `{"type": "object"}`
# and `{"type": "array"}` without properties / items are about half of it.
GENERIC_VALUE_CHARS = 14_000
STRING_CHARS = 64  # a string; with a `format`, FORMAT_CHARS (email's regex is the longest)
FORMAT_CHARS = 512
NUMBER_CHARS = 64  # number, integer, boolean, null
MAX_REF_DEPTH = 4  # outlines-core stops expanding references nested deeper than this


class _TooLarge(Exception):
    pass


def estimate_regex_chars(
    schema: object, limit: int, placeholders: Mapping[str, str] | None = None
) -> int:
    """An upper bound of len(outlines_core's regex for `schema`), or `limit + 1` once it exceeds
    `limit`. `placeholders` maps string constants that are replaced by regexes afterwards (numeric
    bounds, see `json_schema`) to those regexes. Work is O(min(size of the expansion, limit)).
    """
    root = schema if isinstance(schema, dict) else {}
    visits = 0

    def size(node: object, ref_depth: int) -> int:
        # Every node visited adds at least one character to the regex, so more than `limit`
        # visits means a regex longer than `limit`: the walk stops there even when references fan out.
        nonlocal visits
        visits += 1
        if visits > limit:
            raise _TooLarge
        total = _size(node, ref_depth)
        if total > limit:
            raise _TooLarge
        return total

    def _size(node: object, ref_depth: int) -> int:
        if not isinstance(node, dict):
            return 16
        if not node:
            return GENERIC_VALUE_CHARS
        if isinstance(node.get("properties"), dict):
            return _properties_size(node, ref_depth)
        for key in ("allOf", "anyOf", "oneOf", "prefixItems"):
            if isinstance(node.get(key), list):
                return 32 + sum(16 + size(sub, ref_depth) for sub in node[key])
        for key in ("enum", "const"):
            if key in node:
                value = node[key]
                if placeholders and isinstance(value, str) and value in placeholders:
                    return 16 + len(placeholders[value])
                return 32 + 2 * len(json.dumps(value))
        if "$ref" in node:
            target = _resolve(root, node["$ref"])
            return 16 if target is None or ref_depth >= MAX_REF_DEPTH else size(target, ref_depth + 1)
        types = node.get("type")
        return 16 + sum(_type_size(node, t, ref_depth) for t in (types if isinstance(types, list) else [types]))

    def _properties_size(node: dict[str, Any], ref_depth: int) -> int:
        required = node.get("required")
        required_names = set(r for r in required if isinstance(r, str)) if isinstance(required, list) else set()
        costs = [32 + 2 * len(name) + size(sub, ref_depth) for name, sub in node["properties"].items()]
        if required_names & set(node["properties"]):
            return 32 + sum(costs)
        num = len(costs)
        return 32 + sum((num - i) * cost for i, cost in enumerate(costs))

    def _type_size(node: dict[str, Any], kind: object, ref_depth: int) -> int:
        if kind == "object":
            extra = node.get("additionalProperties")
            if extra is None or extra is True:
                return GENERIC_VALUE_CHARS
            return 64 + 2 * size(extra, ref_depth) if isinstance(extra, dict) else 32
        if kind == "array":
            items = node.get("items")
            return 64 + 2 * size(items, ref_depth) if isinstance(items, dict) else GENERIC_VALUE_CHARS
        if kind == "string":
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                return STRING_CHARS + len(pattern)
            return FORMAT_CHARS if "format" in node else STRING_CHARS
        return NUMBER_CHARS

    try:
        return size(schema, 0)
    except _TooLarge:
        return limit + 1


def _resolve(root: dict[str, Any], ref: object) -> object:
    """The local subschema `ref` ("#/a/b") points to, or None."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node: object = root
    for part in ref[1:].split("/"):
        if not part:
            continue
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
