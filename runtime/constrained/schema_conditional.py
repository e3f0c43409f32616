"""`if` / `then` / `else` as keywords every engine enforces (`conditional`, used by `schema_rewrite`).

No engine enforces `if`. A conditional is `(if and then) or (not-if and else)`; what we can write
is the instances of the parent where the condition holds, or fails, when the condition is a
*discriminator*: `{"properties": {k: test}, "required"?: [k], "type"?: "object"}` where `test` is

- a `const` / `enum` and the parent lists k's values (`enum` / `const`): where it holds, k's
  values that pass (exact); where it fails, k present with the other values (stricter: an
  instance without k fails a condition that requires k, and is left out);
- a discriminator itself (GitHub actions' `runs.using == "composite"`, two levels down), and k's
  schema is an object schema or an `anyOf` of them (a `oneOf` after `schema_oneof`): each branch
  restricted in turn, the branches with no instance left out. Where it fails, k is required and
  an object (stricter: k absent, or not an object, also fails a test that requires or types it).

Where it holds, the condition's other required names and its type are asked too (exact); where
it fails, the value is an object (stricter where the condition has no type). k's schema may be a
`$ref` to a list of values (read as its target). Both sides are exact or stricter, so
`anyOf: [holds and then, fails and else]` is too. When the condition is not a discriminator:
`(if and then)` alone (stricter: the condition always holds). An `allOf` of conditionals
(`apply_conditional`) is applied one after another to each case the one before made.
The parent's `$defs` / `definitions` stay at the top, outside the branches (a reference
`#/definitions/x` resolves against the document, and a copy in a branch would not be pruned).
"""

from __future__ import annotations

from typing import Any

from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.schema_disjoint import ALL_TYPES, Resolve, json_type, type_atoms, values_of
from radixlm.runtime.constrained.schema_merge import both
from radixlm.runtime.constrained.schema_notes import note

Schema = dict[str, Any]
_DEFS = ("$defs", "definitions")
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated", "$comment",
                          "markdownDescription"})
_EMPTY = False  # a restriction with no instance


def conditional(node: Schema, resolve: Resolve | None = None) -> Schema:
    """`node` with its `if` / `then` / `else` written as above (`then` / `else` without `if`
    dropped: they apply only beside one). `resolve`: a property that is a `$ref` to a list of
    values (`{"type": "string", "enum": [...]}`) is read as its target."""
    if "if" not in node:
        node.pop("then", None)
        node.pop("else", None)
        return node
    cond, then, other = node.pop("if"), node.pop("then", {}), node.pop("else", {})
    if not isinstance(cond, dict):
        return both(node, then if cond is not False else other)
    defs = {k: node.pop(k) for k in _DEFS if k in node}
    holds, fails = restricted(node, cond, True, resolve), restricted(node, cond, False, resolve)
    if holds is None or fails is None:
        note("if")
        return {**both(both(node, cond), then), **defs}  # stricter: the condition always holds
    branches = [both(part, extra) for part, extra in ((holds, then), (fails, other)) if part is not _EMPTY]
    if not branches:  # no instance of the parent either way
        raise GrammarError("json_schema has no valid value: no value of the property its 'if' tests is allowed")
    return {**branches[0], **defs} if len(branches) == 1 else {"anyOf": branches, **defs}


def restricted(parent: Schema, cond: Schema, holds: bool, resolve: Resolve | None = None) -> Schema | bool | None:
    """A schema of the instances of `parent` where `cond` holds (`holds`) or fails, exact or
    stricter (see the module docstring); False when none is left; None when `cond` is not a
    discriminator this reads (or `parent` does not list what it tests)."""
    props = cond.get("properties")
    if (set(cond) - {"properties", "required", "type"} or cond.get("type", "object") != "object"
            or not isinstance(props, dict) or len(props) != 1):
        return None
    (name, test), = props.items()
    own = (parent.get("properties") or {}).get(name)
    if not isinstance(test, dict) or not isinstance(own, dict):
        return None
    cond_requires = name in (cond.get("required") or [])
    narrowed = _narrowed(_listed_target(own, resolve), test, holds, resolve)
    if narrowed is None:
        return None
    if narrowed is _EMPTY:  # no value of k is left: only an absent k, where that decides the test
        if holds == cond_requires or name in (parent.get("required") or []):
            return _EMPTY
        out = {**parent, "properties": {**parent["properties"], name: False}}
    else:
        out = {**parent, "properties": {**parent["properties"], name: narrowed}}
        if not holds:  # k present (an absent k passes the test unless `cond` requires it: left out)
            if cond_requires or "properties" in test:
                note("if")
            out["required"] = list(dict.fromkeys([*(parent.get("required") or []), name]))
    if holds:  # and what else `cond` asks: its required names, its type
        cond_required = [n for n in cond.get("required") or [] if isinstance(n, str)]
        if cond_required:
            out["required"] = list(dict.fromkeys([*(out.get("required") or []), *cond_required]))
        return both(out, {"type": "object"}) if "type" in cond else out
    return both(out, {"type": "object"})  # (a value that is no object passes an untyped `cond`)


def _narrowed(own: Schema, test: Schema, holds: bool, resolve: Resolve | None) -> Schema | bool | None:
    """k's schema `own` restricted to the values that pass `test` (`holds`) or fail it."""
    if set(test) <= {"const", "enum", "type"} and ("const" in test or "enum" in test):
        values, listed = values_of(test), values_of(own)
        kinds = type_atoms(test["type"]) if "type" in test else ALL_TYPES
        if values is None or listed is None or kinds is None or not all(_is_scalar(v) for v in (*values, *listed)):
            return None
        tested = {(json_type(v), v) for v in values if json_type(v) in kinds}  # (true is not 1, 1.0 is 1)
        kept = [v for v in listed if ((json_type(v), v) in tested) == holds]
        if not kept:
            return _EMPTY
        return {**{k: v for k, v in own.items() if k not in ("const", "enum")}, "enum": kept}
    if "properties" not in test:
        return None
    branches = own["anyOf"] if set(own) - _ANNOTATIONS == {"anyOf"} and isinstance(own["anyOf"], list) else [own]
    parts: list[object] = []
    for branch in branches:
        if not isinstance(branch, dict):
            return None
        part = restricted(branch, test, holds, resolve)
        if part is None:
            return None
        if part is not _EMPTY:
            parts.append(part)
    if not parts:
        return _EMPTY
    return parts[0] if len(parts) == 1 else {"anyOf": parts}  # type: ignore[return-value]


def apply_conditional(node: Schema, parts: Schema, resolve: Resolve | None = None) -> Schema:
    """`node` and one more conditional (`parts`: its `if` / `then` / `else`, e.g. a branch of an
    `allOf` of conditionals, GitHub issue forms' one per item type), applied to each branch of
    `node`'s `anyOf` when that is all it holds ((A or B) and C is (A and C) or (B and C)), so that
    conditionals on one discriminator split it case by case and the cases no value reaches drop out."""
    defs = {k: node[k] for k in _DEFS if k in node}
    body = {k: v for k, v in node.items() if k not in _DEFS}
    cases = body["anyOf"] if set(body) == {"anyOf"} and isinstance(body["anyOf"], list) else [body]
    out: list[object] = []
    for case in cases:
        if not isinstance(case, dict):
            out.append(case)
            continue
        split = conditional({**case, **parts}, resolve)
        out.extend(split["anyOf"] if set(split) == {"anyOf"} else [split])
    return {**(out[0] if len(out) == 1 and isinstance(out[0], dict) else {"anyOf": out}), **defs}


def is_conditional(branch: object) -> bool:
    """Whether an `allOf` branch is an `if` with its `then` / `else` and nothing else, whose `if`
    has a discriminator's shape (one property tested; other conditionals stay in the `allOf`,
    each served as (if and then) and merged with the parent as before)."""
    if not isinstance(branch, dict) or set(branch) - {"if", "then", "else", *_ANNOTATIONS}:
        return False
    cond = branch.get("if")
    return (isinstance(cond, dict) and not set(cond) - {"properties", "required", "type"}
            and isinstance(cond.get("properties"), dict) and len(cond["properties"]) == 1)


def _listed_target(own: Schema, resolve: Resolve | None) -> Schema:
    """`own`, or its `$ref`'s target when that is only a list of values (type, enum / const)."""
    ref = own.get("$ref")
    if resolve is None or not isinstance(ref, str) or set(own) - {"$ref", *_ANNOTATIONS}:
        return own
    target = resolve(ref)
    if isinstance(target, dict) and not set(target) - {"type", "enum", "const", *_ANNOTATIONS} and values_of(target):
        return {k: v for k, v in target.items() if k not in _ANNOTATIONS}
    return own


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))
