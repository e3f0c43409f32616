"""Rewrites of object keywords no engine enforces as written (used by `schema_rewrite`; each exact
or stricter, see its docstring): `propertyNames` as (pattern) properties of a closed object,
`required` names `properties` does not list, `unevaluatedProperties` where nothing else evaluates,
and `maxProperties: 1` over listed properties as one-property objects."""

from __future__ import annotations

import re
from typing import Any

from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.schema_merge import both
from radixlm.runtime.constrained.schema_not import without_not
from radixlm.runtime.constrained.schema_notes import note

Schema = dict[str, Any]
NAME_ANNOTATIONS = ("title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment",
                    "markdownDescription")


def property_names(node: Schema) -> Schema:
    """`propertyNames` of `const` / `enum` / `pattern` alone, as (pattern) properties of a closed object."""
    names = _names_as_pattern(node.get("propertyNames"))
    if names is True or names == {}:  # every name is a string: nothing to enforce (exact)
        return {k: v for k, v in node.items() if k != "propertyNames"}
    if not isinstance(names, dict) or set(names) - {"const", "enum", "pattern", "type"}:
        return node
    extra = node.get("additionalProperties", {})
    if extra is True:
        extra = {}
    props = dict(node.get("properties") or {})
    patterns = dict(node.get("patternProperties") or {})
    if "const" in names or "enum" in names:
        allowed = [names["const"]] if "const" in names else names["enum"]
        allowed = [n for n in allowed if isinstance(n, str) and _matches(names.get("pattern"), n)]
        props = {n: s for n, s in props.items() if n in allowed}
        if extra is not False:
            for name in allowed:
                if name not in props:
                    props[name] = _pattern_schema(patterns, name, extra)
        node = {k: v for k, v in node.items() if k not in ("propertyNames", "patternProperties")}
        node["properties"], node["additionalProperties"] = props, False
        return node
    if "pattern" in names and not patterns:
        node = {k: v for k, v in node.items() if k != "propertyNames"}
        node["properties"] = {n: s for n, s in props.items() if _matches(names["pattern"], n)}
        if extra is not False:
            node["patternProperties"] = {names["pattern"]: extra}
        node["additionalProperties"] = False
    elif "pattern" in names:  # beside patternProperties: each pattern within the names', or narrowed to it
        note("propertyNames")
        narrowed = {_within_names(p, names["pattern"]): s for p, s in patterns.items()}
        node = {k: v for k, v in node.items() if k != "propertyNames"}
        node["properties"] = {n: s for n, s in props.items() if _matches(names["pattern"], n)}
        node["patternProperties"] = {p: s for p, s in narrowed.items() if p is not None}
        node["additionalProperties"] = False  # stricter: names no pattern matches are left out
    return node


def _names_as_pattern(names: object) -> object:
    """A `propertyNames` schema with its annotations and `type: string` dropped, and a length bound
    or a `not: {pattern}` (`schema_not.required_chars`) as a `pattern` (exact / stricter: `.`
    excludes line breaks), where it has no other."""
    if not isinstance(names, dict):
        return names
    names = {k: v for k, v in names.items() if k not in NAME_ANNOTATIONS}
    if names.get("type") == "string":
        del names["type"]
    if "pattern" in names or "enum" in names or "const" in names:
        return names
    low, high = names.pop("minLength", 0), names.pop("maxLength", None)
    if low or high is not None:
        note("propertyNames")  # `.` takes no line break
        names["pattern"] = f"^.{{{low},{'' if high is None else high}}}$"
    inner = names.get("not")
    if isinstance(inner, dict) and "pattern" not in names:
        narrowed = without_not({"type": "string", "not": inner})
        if "not" not in narrowed:
            del names["not"]
            names["pattern"] = narrowed["pattern"]
    return names


_LENGTH_NAMES = re.compile(r"\^\.\{(\d+),(\d*)\}\$")  # `^.{m,n}$`, as `_names_as_pattern` writes a length bound
_ONE_CLASS_RUN = re.compile(r"\^(\[(?:[^\]\\\n]|\\[^\n])+\]|\\[wd])([+*])\$")  # `^[...]+$`, `^\w*$`


def _within_names(pattern: str, names: str) -> str | None:
    """`pattern` when it is the names' pattern itself; a run of one character class
    (`^[A-Za-z0-9_-]+$`) under a length bound (`^.{2,}$`) as the bounded run
    (`^[A-Za-z0-9_-]{2,}$`: exact, the class takes no line break, which `.` does not take); else
    None (the pattern's properties are left out)."""
    if pattern == names:
        return pattern
    bound, run = _LENGTH_NAMES.fullmatch(names), _ONE_CLASS_RUN.fullmatch(pattern)
    if bound is None or run is None or any(_matches(run.group(1), c) for c in "\n\r\u2028\u2029"):
        return None
    low = max(int(bound.group(1)), 1 if run.group(2) == "+" else 0)
    return f"^{run.group(1)}{{{low},{bound.group(2)}}}$"


def _matches(pattern: object, name: str) -> bool:
    if not isinstance(pattern, str):
        return True
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


def _pattern_schema(patterns: dict[str, Any], name: str, extra: object) -> object:
    """The schema an object gives an undeclared property `name`."""
    matched = [s for p, s in patterns.items() if _matches(p, name)]
    if not matched:
        return extra if isinstance(extra, dict) else {}
    body: object = matched[0]
    for other in matched[1:]:
        body = both(body, other) if isinstance(body, dict) else body
    return body


def required_outside(node: Schema, path: str) -> Schema:
    required = node.get("required")
    if not isinstance(required, list):
        return node
    props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    missing = [n for n in required if isinstance(n, str) and n not in props]
    if not missing:
        return node
    patterns = node.get("patternProperties") if isinstance(node.get("patternProperties"), dict) else {}
    extra = node.get("additionalProperties", {})
    props = dict(props)
    for name in missing:
        if extra is False and not any(_matches(p, name) for p in patterns):
            raise GrammarError(f"required property {name!r} at {path} is not allowed by 'additionalProperties': "
                               "false (no output is valid)")
        props[name] = _pattern_schema(patterns, name, extra)
    return {**node, "properties": props}


_APPLICATORS = ("allOf", "anyOf", "oneOf", "not", "if", "$ref", "$dynamicRef", "dependentSchemas")


def unevaluated(node: Schema) -> Schema:
    """`unevaluatedProperties` / `unevaluatedItems` where no applicator is left (they were merged
    into this node or into the branch it is): `additionalProperties` / `items` (exact then, as
    every property / item another would evaluate is this node's own), or dropped beside one
    (which evaluates every property / item itself). Within a branch of a distributed anyOf this
    is stricter: properties only another matching branch declares are no longer allowed."""
    if any(k in node for k in _APPLICATORS):
        return node
    for key, plain in (("unevaluatedProperties", "additionalProperties"), ("unevaluatedItems", "items")):
        if key in node:
            node = dict(node)
            value = node.pop(key)
            node.setdefault(plain, value)
    return node


def one_property(node: Schema) -> Schema:
    """An object of listed properties with `maxProperties: 1` (`minProperties` 0 or 1, at most one
    required): an `anyOf` of one-property objects, one per listed property (and the empty object
    when allowed). Exact for a closed object; where other names are allowed (`additionalProperties`
    / `patternProperties`: CircleCI's steps, a built-in step or an orb's command), stricter: only
    the listed names. (llguidance refuses min/maxProperties over optional properties.)"""
    props = node.get("properties")
    required = node.get("required", [])
    if (node.get("maxProperties") != 1 or node.get("type") != "object" or not isinstance(props, dict) or not props
            or len(required) > 1 or node.get("minProperties", 0) not in (0, 1)
            or any(k in node for k in (*_APPLICATORS, "propertyNames"))):
        return node
    names = [n for n, sub in props.items() if sub is not False and (not required or n == required[0])]
    branches: list[object] = [{"type": "object", "properties": {n: props[n]}, "required": [n],
                               "additionalProperties": False} for n in names]
    if not required and node.get("minProperties", 0) == 0:
        branches.append({"type": "object", "properties": {}, "additionalProperties": False})
    if not branches:
        return node
    if node.get("additionalProperties", True) is not False or node.get("patternProperties"):
        note("maxProperties")  # other names were allowed
    rest = {k: v for k, v in node.items() if k in NAME_ANNOTATIONS}
    return {**rest, "anyOf": branches}
