"""Whether two JSON schemas can share an instance (`disjoint`): what `schema_oneof` needs to serve
a `oneOf` as `anyOf` (when no instance satisfies two branches, "exactly one" is "at least one").

`disjoint(a, b, resolve)` is sound, never complete: True only when no JSON value satisfies both;
False when it cannot tell. It reads only keywords whose meaning is the same in every draft
(`type`, `const`, `enum`, `required`, `properties`, `additionalProperties`, `patternProperties`,
`items` as a schema, `minItems` / `maxItems`, `minLength` / `maxLength`, `not` of listed values,
`anyOf` / `oneOf` (each branch) and `allOf` (any branch)); every keyword it ignores can only
shrink a schema's instances, so ignoring it keeps the answer sound. A `$ref` is read as its target alone (`resolve`): draft-07 and earlier
ignore a reference's siblings, 2019-09 and later apply them, and the target alone admits at
least as much under both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

Resolve = Callable[[str], object]  # a `$ref` -> its target schema; None where it cannot say
# the JSON types as atoms: `number` admits integers and fractions, `integer` only the first
ALL_TYPES = frozenset({"null", "boolean", "string", "object", "array", "integer", "number"})
_MAX_DEPTH = 8  # nested properties / references followed before giving up (answer: not disjoint)


def json_type(value: object) -> str:
    """The type atom of a JSON value (an integer-valued float is an `integer`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or isinstance(value, float) and value.is_integer():
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}[type(value)]


def type_atoms(kind: object) -> set[str] | None:
    names = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else None
    if names is None or not all(isinstance(n, str) and n in ALL_TYPES for n in names):
        return None
    atoms = set(names)
    if "number" in atoms:
        atoms.add("integer")
    return atoms


def target(schema: object, resolve: Resolve | None, depth: int = 0) -> object:
    """`schema`, or the schema its `$ref` points to (followed up to a few times; siblings ignored)."""
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and resolve is not None:
        if depth >= _MAX_DEPTH:
            return True
        resolved = resolve(schema["$ref"])
        schema = True if resolved is None else resolved
        depth += 1
    return schema


def types_of(schema: object, resolve: Resolve | None = None, depth: int = 0) -> set[str] | None:
    """The type atoms `schema` admits at most (None: it does not say, any type)."""
    schema = target(schema, resolve, depth)
    if schema is False:
        return set()
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None
    found: set[str] | None = None

    def narrow(atoms: set[str] | None) -> None:
        nonlocal found
        if atoms is not None:
            found = atoms if found is None else found & atoms

    if "const" in schema:
        narrow({json_type(schema["const"])})
    if isinstance(schema.get("enum"), list):
        narrow({json_type(v) for v in schema["enum"]})
    narrow(type_atoms(schema.get("type")))
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            branch_types = [types_of(b, resolve, depth + 1) for b in schema[key]]
            if all(t is not None for t in branch_types):
                narrow(set().union(*branch_types))  # type: ignore[arg-type]
    if isinstance(schema.get("allOf"), list):
        for branch in schema["allOf"]:
            narrow(types_of(branch, resolve, depth + 1))
    return found


def values_of(schema: object) -> list[object] | None:
    """The values `schema` lists (`const` / `enum`), None where it lists none."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    return schema["enum"] if isinstance(schema.get("enum"), list) else None


def value_keys(values: list[object]) -> set[str]:
    return {json.dumps(v, sort_keys=True) for v in values}


def required_names(schema: dict[str, Any]) -> set[str]:
    """Names an object valid for `schema` holds: its `required`, those of each `allOf` branch, and
    those every `anyOf` branch requires."""
    names = {n for n in schema.get("required", []) if isinstance(n, str)}
    for branch in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        if isinstance(branch, dict):
            names |= required_names(branch)
    branches = schema.get("anyOf")
    if isinstance(branches, list) and branches and all(isinstance(b, dict) for b in branches):
        names |= set.intersection(*(required_names(b) for b in branches))
    return names


def forbids(schema: dict[str, Any], name: str) -> bool:
    """An object valid for `schema` cannot hold property `name` (`properties: {name: false}`, a
    closed object without it, or `not: {"required": [name]}`)."""
    inner = schema.get("not")
    if isinstance(inner, dict) and inner.get("required") == [name] and not set(inner) - {"required", "properties",
                                                                                          "title", "description"}:
        inner_props = inner.get("properties", {})
        if isinstance(inner_props, dict) and set(inner_props) <= {name} and inner_props.get(name, True) in (True, {}):
            return True
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    if name in props:
        return props[name] is False
    if schema.get("additionalProperties") is not False:
        return False
    patterns = schema.get("patternProperties") if isinstance(schema.get("patternProperties"), dict) else {}
    return not any(_search(p, name) for p in patterns)


def _search(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return True  # a pattern Python cannot read may match: assume it does


def disjoint(a: object, b: object, resolve: Resolve | None = None, depth: int = 0) -> bool:
    """True only when no JSON value satisfies both `a` and `b` (see the module docstring)."""
    if depth > _MAX_DEPTH:
        return False
    a, b = target(a, resolve), target(b, resolve)
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    ta, tb = types_of(a, resolve), types_of(b, resolve)
    if ta is not None and tb is not None and not ta & tb:
        return True
    va, vb = values_of(a), values_of(b)
    if va is not None and vb is not None and not value_keys(va) & value_keys(vb):
        return True
    for listed, other in ((va, b), (vb, a)):  # every value one lists is one the other's `not` lists
        banned = values_of(other.get("not"))
        if listed is not None and banned is not None and value_keys(listed) <= value_keys(banned):
            return True
    for one, other in ((a, b), (b, a)):  # each branch of an anyOf / oneOf, or one of an allOf, is disjoint
        for key in ("anyOf", "oneOf"):
            if isinstance(one.get(key), list) and all(disjoint(x, other, resolve, depth + 1) for x in one[key]):
                return True
        if isinstance(one.get("allOf"), list) and any(disjoint(_typed(x, one), other, resolve, depth + 1)
                                                       for x in one["allOf"]):
            return True
    shared = ta & tb if ta is not None and tb is not None else ta if ta is not None else tb
    if shared is None:
        return False  # both admit values of every type that neither keyword below constrains
    if shared <= {"object"}:
        return _objects_disjoint(a, b, resolve, depth)
    if shared <= {"array"}:
        return _arrays_disjoint(a, b, resolve, depth)
    if shared <= {"string"}:
        return _bound(a, "maxLength") < _bound(b, "minLength", 0) or _bound(b, "maxLength") < _bound(a, "minLength", 0)
    return False


def _typed(branch: object, parent: dict[str, Any]) -> object:
    """An allOf `branch` with its parent's `type` (what a value of the parent also is)."""
    if isinstance(branch, dict) and "type" in parent and "type" not in branch and "$ref" not in branch:
        return {**branch, "type": parent["type"]}
    return branch


def _objects_disjoint(a: dict[str, Any], b: dict[str, Any], resolve: Resolve | None, depth: int) -> bool:
    """Any common instance is an object: one requires a property the other forbids, or one
    requires a property whose schema is disjoint from the other's for it (which applies
    whenever the property is there)."""
    required_a = [n for n in a.get("required", []) if isinstance(n, str)]
    required_b = [n for n in b.get("required", []) if isinstance(n, str)]
    if any(forbids(b, n) for n in required_a) or any(forbids(a, n) for n in required_b):
        return True
    props_a = a.get("properties") if isinstance(a.get("properties"), dict) else {}
    props_b = b.get("properties") if isinstance(b.get("properties"), dict) else {}
    return any(name in props_a and name in props_b and disjoint(props_a[name], props_b[name], resolve, depth + 1)
               for name in set(required_a) | set(required_b))


def _arrays_disjoint(a: dict[str, Any], b: dict[str, Any], resolve: Resolve | None, depth: int) -> bool:
    """Any common instance is an array: their lengths cannot agree, or it has an item and the
    item schemas are disjoint."""
    if _max_items(a) < _bound(b, "minItems", 0) or _max_items(b) < _bound(a, "minItems", 0):
        return True
    if max(_bound(a, "minItems", 0), _bound(b, "minItems", 0)) < 1 or "prefixItems" in a or "prefixItems" in b:
        return False
    items_a, items_b = a.get("items"), b.get("items")
    return isinstance(items_a, dict) and isinstance(items_b, dict) and disjoint(items_a, items_b, resolve, depth + 1)


def _max_items(schema: dict[str, Any]) -> float:
    if schema.get("items") is False and not schema.get("prefixItems"):
        return 0  # no item allowed
    return _bound(schema, "maxItems")


def _bound(schema: dict[str, Any], key: str, default: float = float("inf")) -> float:
    value = schema.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default
