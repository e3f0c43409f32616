"""The intersection of two JSON schemas written as one schema (`merge`), where it can be: what
`schema_rewrite` uses to fold `allOf` branches, inlined references and conditional branches into
their parent. Exact: the merged schema's instances are those valid for both; MergeConflict where
two keywords cannot be combined (two different `pattern`s, a `$ref`, an object closed by
`additionalProperties` that the other would open, ...)."""

from __future__ import annotations

import json
import re
from typing import Any

Schema = dict[str, Any]


class MergeConflict(Exception):
    """Two schemas whose intersection `merge` cannot write as one."""


_MIN_KEYS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_MAX_KEYS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")


def merge(a: Schema, b: Schema) -> Schema:
    """One schema whose instances are those valid for both; MergeConflict where this cannot say it
    as one (e.g. two different `pattern`s, or either has a `$ref`)."""
    if "$ref" in a or "$ref" in b:
        raise MergeConflict
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
        elif out[key] == value:
            continue
        elif key == "properties":
            props = dict(out[key])
            for name, sub in value.items():
                props[name] = _merge_sub(props[name], sub) if name in props else sub
            out[key] = props
        elif key == "required":
            out[key] = list(dict.fromkeys([*out[key], *value]))
        elif key == "type":
            both = _type_set(out[key]) & _type_set(value)
            if not both:
                raise MergeConflict
            out[key] = sorted(both)[0] if len(both) == 1 else sorted(both)
        elif key in _MIN_KEYS:
            out[key] = max(out[key], value)
        elif key in _MAX_KEYS:
            out[key] = min(out[key], value)
        elif key == "enum":
            out[key] = [v for v in out[key] if v in value]
        elif key in ("additionalProperties", "items") and isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = _merge_sub(out[key], value)
        elif key in ("additionalProperties", "items") and (value is False or out[key] is False):
            out[key] = False
        elif key in ("additionalProperties", "items") and value is True:
            continue
        elif key in ("title", "description", "default", "examples", "markdownDescription"):
            continue
        elif key == "allOf":
            out[key] = [*out[key], *value]
        elif key == "pattern" and (both := _patterns_and(out[key], value)) is not None:
            out[key] = both
        else:
            raise MergeConflict
    if "additionalProperties" in b and b["additionalProperties"] is not True and "properties" in a:
        _check_closed(a, b)
    if "additionalProperties" in a and a["additionalProperties"] is not True and "properties" in b:
        _check_closed(b, a)
    return out


def _check_closed(opened: Schema, closing: Schema) -> None:
    """`closing`'s additionalProperties applies to `opened`'s properties that it does not list:
    merged naively they would escape it."""
    declared = set(closing.get("properties") or {})
    opened_names = {n for n, sub in (opened.get("properties") or {}).items() if sub is not False}  # false: absent
    if opened_names - declared or closing.get("patternProperties"):
        raise MergeConflict


def _merge_sub(a: object, b: object) -> object:
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        return False
    if not isinstance(a, dict) or not isinstance(b, dict):
        raise MergeConflict
    for listed, other in ((a, b), (b, a)):  # e.g. one task name of 260 (Azure Pipelines)
        values = listed_values(listed)
        kept = _values_valid(values, other) if values is not None else None
        if kept is not None:
            return {"enum": kept} if kept else False
    return merge(a, b)


def _values_valid(values: list[object], schema: dict[str, Any]) -> list[object] | None:
    """The `values` valid for `schema` when it is a list of values or a `pattern` (annotations
    aside), else None. A pattern is tried with Python's `re` in ASCII mode, where its classes are
    at most ECMA-262's; a string with a line terminator is left out (`.` differs): stricter."""
    other = listed_values(schema)
    if other is not None:
        keys = {json.dumps(v, sort_keys=True) for v in other}
        return [v for v in values if json.dumps(v, sort_keys=True) in keys]
    pattern = schema.get("pattern")
    if set(schema) - set(_ANNOTATIONS) != {"pattern"} or not isinstance(pattern, str):
        return None
    try:
        compiled = re.compile(pattern, re.ASCII)
    except re.error:
        return None
    return [v for v in values if not isinstance(v, str)
            or not any(c in v for c in "\n\r\u2028\u2029") and compiled.search(v) is not None]


_ANNOTATIONS = ("title", "description", "default", "examples", "deprecated")


def listed_values(schema: object) -> list[object] | None:
    """The values `schema` admits when it is only a list of them (`const`, `enum`, or an `anyOf`
    of such, annotations aside), else None."""
    if not isinstance(schema, dict):
        return None
    keys = set(schema) - set(_ANNOTATIONS)
    if keys == {"anyOf"} and isinstance(schema["anyOf"], list):
        found: list[object] = []
        for branch in schema["anyOf"]:
            values = listed_values(branch)
            if values is None:
                return None
            found.extend(values)
        return found
    if keys == {"const"}:
        return [schema["const"]]
    if keys == {"enum"} and isinstance(schema["enum"], list):
        return list(schema["enum"])
    return None


def _type_set(value: object) -> set[str]:
    kinds = set(value) if isinstance(value, list) else {value}
    if "number" in kinds:
        kinds.add("integer")
    return {k for k in kinds if isinstance(k, str)}


def _patterns_and(a: object, b: object) -> str | None:
    """One pattern for strings matching both, when one of them only bans characters
    (`^[^..]*$`, as `schema_not` writes them) and the other can be narrowed to avoid them."""
    from radixlm.runtime.constrained.schema_regex_chars import avoided_chars, pattern_avoiding

    if not isinstance(a, str) or not isinstance(b, str):
        return None
    for ban, other in ((a, b), (b, a)):
        chars = avoided_chars(ban)
        if chars is not None:
            return pattern_avoiding(other, chars)
    return None


def both(a: Schema, b: object) -> Schema:
    """`a` and `b` as one schema: merged, or `b` added to `a`'s allOf where they conflict."""
    if b is True or not isinstance(b, dict) or not b:
        return dict(a)
    try:
        return merge(a, b)
    except MergeConflict:
        return {**a, "allOf": [*a.get("allOf", []), b]}
