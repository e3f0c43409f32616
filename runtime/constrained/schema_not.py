"""`not` in the forms real schemas write it, as keywords every engine enforces (`without_not`).

No engine enforces `not`. These forms have an exact or stricter positive form; any other `not`
stays, and `schema_rewrite` then leaves out the `anyOf` / `oneOf` branch it sits in, or the
request is refused naming it.

- `not: {"required": [a, ...], ...}` (SchemaStore: "`func` and `step` not both", "no `when`
  with `unless`"): an instance the inner schema rejects for lacking `a` passes, so an object
  that does not hold `a` (`properties: {a: false}`) is valid: exact for one name, stricter for
  several (the conjunction "not all of them" becomes "not the first"). A name the parent
  requires is not chosen (that would leave no valid value). Non-objects always satisfy the inner
  `required`, so they fail `not`: the parent becomes `type: object` (exact).
- `not: {"anyOf": [S1, S2, ...]}` is `not S1` and `not S2` ...: each as above, when each can be.
- `not: {"enum" | "const": ...}` beside a parent `enum` / `const`: the listed values removed (exact).
- `not: {"type": T}`: the parent's types without T (exact, when the rest can be written as `type`).
- `not: {"pattern": P}` (SchemaStore: no `..`, no leading or trailing space, not `^\\w+://`): a
  string with none of the characters of a set every match of P must hold (`required_chars`:
  `[ ~^:?*]` -> those; `\\.\\.` -> `.`; `^\\w+://` -> `:`), as `pattern: ^[^S]*$`: exact where P
  is one character class, else stricter. Non-strings always fail `not` (P does not apply to
  them, so the inner schema holds): the parent becomes `type: string` (exact). Also under
  `not: {"anyOf": [...]}` (each branch's set joined). Not beside another `pattern`.
"""

from __future__ import annotations

from typing import Any

from radixlm.runtime.constrained.schema_disjoint import ALL_TYPES, types_of, value_keys, values_of
from radixlm.runtime.constrained.schema_notes import note
from radixlm.runtime.constrained.schema_regex_chars import negated_class, pattern_avoiding, required_chars

Schema = dict[str, Any]
_TYPE_ORDER = ("null", "boolean", "string", "object", "array", "number", "integer")


def without_not(node: Schema) -> Schema:
    """`node` with its `not` rewritten as positive keywords when it has one of the forms above;
    else `node` unchanged."""
    inner = node.get("not")
    if not isinstance(inner, dict):
        return node
    rest = {k: v for k, v in node.items() if k != "not"}
    out = _negated(rest, inner)
    return node if out is None else out


def _negated(node: Schema, inner: Schema) -> Schema | None:
    """`node` and not `inner` as one schema, or None when this module has no form for it."""
    inner = {k: v for k, v in inner.items() if k not in ("title", "description", "$comment", "markdownDescription")}
    if isinstance(inner.get("allOf"), list) and len(inner) == 1:  # not (A and B) holds where not A does
        note("not")
        return next((out for b in inner["allOf"] if isinstance(b, dict) and (out := _negated(node, b)) is not None),
                    None)
    if isinstance(inner.get("anyOf"), list) and len(inner) == 1:
        patterns = [_pattern_of(b) for b in inner["anyOf"]]
        if all(p is not None for p in patterns):
            return _avoiding(node, patterns)
        out: Schema | None = node
        for branch in inner["anyOf"]:
            out = _negated(out, branch) if out is not None and isinstance(branch, dict) else None
        return out
    if isinstance(inner.get("required"), list) and inner["required"]:
        return _without_property(node, inner["required"])
    if set(inner) <= {"enum", "const", "type"} and ("enum" in inner or "const" in inner):
        listed, banned = values_of(node), values_of(inner)
        if listed is None or banned is None:
            return None
        rest = [v for v in listed if value_keys([v]).isdisjoint(value_keys(banned))]
        if not rest:
            return None
        out = {k: v for k, v in node.items() if k != "const"}
        out["enum"] = rest
        return out
    if set(inner) == {"type"}:
        return _without_types(node, types_of(inner))
    if _pattern_of(inner) is not None:
        return _avoiding(node, [_pattern_of(inner)])
    return None


def _without_property(node: Schema, names: list[object]) -> Schema | None:
    required = node.get("required", [])
    name = next((n for n in names if isinstance(n, str) and n not in required), None)
    own = types_of(node)
    if name is None or own is not None and "object" not in own:
        return None
    if len(names) > 1:
        note("not")  # "not all of them" as "not this one"
    out = dict(node)
    out["type"] = "object"
    out["properties"] = {**(node.get("properties") or {}), name: False}
    return out


def _without_types(node: Schema, banned: set[str] | None) -> Schema | None:
    if not banned:
        return None
    own = types_of({"type": node["type"]}) if "type" in node else set(ALL_TYPES)
    if own is None:
        return None
    if "integer" in banned:
        banned = banned | {"number"}  # "a number that is not an integer" has no `type`
    names = [n for n in _TYPE_ORDER if n in own - banned]
    if "number" in names:
        names.remove("integer")
    if not names:
        return None
    return {**node, "type": names[0] if len(names) == 1 else names}


def _pattern_of(inner: object) -> str | None:
    if isinstance(inner, dict) and set(inner) - {"title", "description"} <= {"pattern", "type"}:
        pattern = inner.get("pattern")
        return pattern if isinstance(pattern, str) else None
    return None


def _avoiding(node: Schema, patterns: list[str | None]) -> Schema | None:
    """`node` as a string that matches none of `patterns` (module docstring), or None."""
    avoided: set[str] = set()
    for pattern in patterns:
        chars = required_chars(pattern) if pattern is not None else None
        if chars is None:
            return None
        avoided |= chars
    own = types_of(node)
    if own is not None and "string" not in own or "format" in node:
        return None
    note("not")  # exact only where each pattern is one character class
    if "pattern" not in node:
        return {**node, "type": "string", "pattern": f"^{negated_class(avoided)}*$"}
    narrowed = pattern_avoiding(node["pattern"], avoided) if isinstance(node["pattern"], str) else None
    return None if narrowed is None else {**node, "type": "string", "pattern": narrowed}
