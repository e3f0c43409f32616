"""A `oneOf` whose branches overlap by JSON type, made disjoint (stricter): the value types two or
more branches admit are removed from every branch.

`oneOf` asks that exactly one branch match, which no engine enforces; the rewrite already serves a
`oneOf` whose branches cannot overlap as `anyOf` (`disjoint`). Real schemas often
write `oneOf: [{"type": ["string", "null"]}, {"type": ["number", "null"]}]` (Kubernetes' Quantity):
`null` matches both branches, so it is not a valid value, and the exact language is "a string or
a number". In general a value of a type that two branches admit may still match only one of them
(their other keywords may tell it apart), so dropping those types is exact or stricter, never
looser; the branches left admit pairwise different types, so `anyOf` of them is `oneOf` of them.

Closed objects that differ by their optional properties (`oneOf: [{"properties": {"email": ...,
"if": ...}}, {"properties": {"slack": ..., "if": ...}}]`, all `additionalProperties: false`:
SchemaStore's notification lists) overlap on the objects that use only shared properties (`{}`).
`with_required_discriminators` requires, in each such branch that requires none, its first
property that no other branch allows: stricter, and then no two branches can match one value.
"""

from __future__ import annotations

import json
from typing import Any

# a JSON number is an integer-valued one or a fraction; `integer` admits the first, `number` both
_ATOMS = {"null": ("null",), "boolean": ("boolean",), "string": ("string",), "object": ("object",),
          "array": ("array",), "integer": ("integer",), "number": ("integer", "fraction")}
# keywords that restrict a branch's values by something other than its `type`: types cannot be
# removed from such a branch by editing `type` alone
_VALUE_LISTS = ("enum", "const")


def without_shared_types(branches: list[object]) -> list[dict[str, Any]] | None:
    """The branches with the types two or more of them admit removed, as pairwise type-disjoint
    branches (those left with no type dropped); None when a branch has no explicit `type` (or
    `enum` / `const`), a type name is unknown, no type is shared, or nothing is left (then the
    caller keeps the `oneOf`, and an engine choice refuses it)."""
    atom_sets: list[set[str]] = []
    for branch in branches:
        if not isinstance(branch, dict) or any(k in branch for k in _VALUE_LISTS):
            return None
        kind = branch.get("type")
        names = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else None
        if not names or not all(isinstance(n, str) and n in _ATOMS for n in names):
            return None
        atom_sets.append({atom for n in names for atom in _ATOMS[n]})
    shared = {atom for i, atoms in enumerate(atom_sets) for other in atom_sets[i + 1:] for atom in atoms & other}
    if not shared:
        return None
    out: list[dict[str, Any]] = []
    for branch, atoms in zip(branches, atom_sets):
        assert isinstance(branch, dict)
        kept = atoms - shared
        if "fraction" in kept and "integer" not in kept:
            return None  # "a number that is not an integer" has no `type`
        names = [n for n in ("null", "boolean", "string", "object", "array") if n in kept]
        if "fraction" in kept:
            names.append("number")
        elif "integer" in kept:
            names.append("integer")
        if names:
            out.append({**branch, "type": names[0] if len(names) == 1 else names})
    return out or None


def _types(schema: object) -> set[str] | None:
    """The JSON types a schema admits, when it says (`type`, `const`, `enum`); None if any."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return {_json_type(schema["const"])}
    if isinstance(schema.get("enum"), list):
        return {_json_type(v) for v in schema["enum"]}
    kind = schema.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind} if isinstance(kind, str) else None
    if kinds and "number" in kinds:
        kinds.add("integer")
    return kinds


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or isinstance(value, float) and value.is_integer():
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}[type(value)]


def disjoint(branches: list[object]) -> bool:
    """Whether no instance can satisfy two branches: their types differ, or a property that both
    require has disjoint constants."""
    for i, a in enumerate(branches):
        for b in branches[i + 1:]:
            ta, tb = _types(a), _types(b)
            if ta is not None and tb is not None and not ta & tb:
                continue
            if not _discriminated(a, b):
                return False
    return True


def _discriminated(a: object, b: object) -> bool:
    """A property both require with disjoint constants, or one requires that the other (closed)
    does not allow."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    if _excludes(a, b) or _excludes(b, a):
        return True
    if _types(a) == {"array"} == _types(b) and not a.get("prefixItems") and not b.get("prefixItems"):
        # two arrays of at least one item whose items have disjoint types
        items_a, items_b = _types(a.get("items")), _types(b.get("items"))
        if min(a.get("minItems", 0), b.get("minItems", 0)) >= 1 and items_a and items_b and not items_a & items_b:
            return True
    for name in set(a.get("required", [])) & set(b.get("required", [])):
        va, vb = _values(a, name), _values(b, name)
        if va is not None and vb is not None and not {json.dumps(v, sort_keys=True) for v in va} & {
                json.dumps(v, sort_keys=True) for v in vb}:
            return True
    return False


def _excludes(closed: dict[str, Any], other: dict[str, Any]) -> bool:
    """`closed` allows no property `other` requires (additionalProperties false)."""
    if closed.get("additionalProperties") is not False or closed.get("patternProperties"):
        return False
    allowed = closed.get("properties") or {}
    return any(name not in allowed or allowed[name] is False for name in other.get("required", []))


def _values(schema: dict[str, Any], name: str) -> list[object] | None:
    sub = (schema.get("properties") or {}).get(name)
    if not isinstance(sub, dict):
        return None
    return [sub["const"]] if "const" in sub else sub.get("enum") if isinstance(sub.get("enum"), list) else None


def with_required_discriminators(branches: list[object]) -> list[object] | None:
    """The branches with each closed object branch requiring a property no other branch allows
    (its first such property, unless it requires one already); None when an object branch is not
    closed (`additionalProperties: false`, no `patternProperties`) or has no such property. Other
    branches are left as they are (the caller checks `disjoint` on the result)."""
    objects = [b for b in branches if isinstance(b, dict) and _types(b) == {"object"}]
    if len(objects) < 2:
        return None
    if any(b.get("additionalProperties") is not False or b.get("patternProperties") for b in objects):
        return None
    allowed = [{n for n, sub in (b.get("properties") or {}).items() if sub is not False} for b in objects]
    out: list[object] = []
    for branch in branches:
        if not any(branch is b for b in objects):
            out.append(branch)
            continue
        assert isinstance(branch, dict)
        i = next(i for i, b in enumerate(objects) if b is branch)
        others = set().union(*(a for j, a in enumerate(allowed) if j != i))
        own = [n for n in (branch.get("properties") or {}) if n in allowed[i] and n not in others]
        if not own:
            return None
        required = list(branch.get("required", []))
        if not any(n in own for n in required):
            required.append(own[0])
        out.append({**branch, "required": required})
    return out
