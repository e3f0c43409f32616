"""A `oneOf` served as `anyOf` of branches made pairwise exclusive (`as_any_of`): exact where the
branches cannot overlap, stricter where they can.

`oneOf` asks that exactly one branch match, which no engine enforces. An `anyOf` of branches
A'_1 .. A'_n serves it without a single invalid output when each A'_i is a subset of branch A_i
that shares no instance with any *other original* branch A_j (j != i): a value in A'_i then
satisfies A_i and no other branch, i.e. exactly one. (Checking A'_i against the other A'_j alone
would not do: a value may satisfy A_j without being in its narrower A'_j.) A branch that cannot
be narrowed so is left out: stricter again, never looser. The checks read each other branch as
the schema sent (`originals`: the rewrite's stricter forms of a branch admit fewer values than
the branch does, and a value the branch admits still counts as a match).

Ways a branch A is narrowed against another branch B (each keeps A' a subset of A; the first
that makes A' and B disjoint (`schema_disjoint.disjoint`) is kept):
- types: A loses the types B admits (Kubernetes' Quantity `oneOf: [{"type": ["string", "null"]},
  {"type": ["number", "null"]}]`: null matches both, so it is no valid value at all: exact);
- values: A's `enum` loses B's listed values;
- a property B requires: A becomes an object that does not hold it (`{"required": ["gcp"]}` vs
  `{"required": ["aws"]}`: A holds no `aws`);
- a closed B (`additionalProperties: false`): A becomes an object that requires one of its own
  properties B does not allow (SchemaStore's notification lists: closed objects that differ by
  optional properties, which `{}` satisfies twice).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixlm.runtime.constrained.schema_disjoint import (
    ALL_TYPES,
    Resolve,
    disjoint,
    forbids,
    required_names,
    target,
    types_of,
    value_keys,
    values_of,
)
from radixlm.runtime.constrained.schema_notes import note

Schema = dict[str, Any]
_TYPE_ORDER = ("null", "boolean", "string", "object", "array", "number", "integer")


def as_any_of(branches: list[object], originals: list[object], resolve: Resolve | None,
              is_servable: Callable[[object], bool]) -> list[object] | None:
    """`anyOf` branches that serve `oneOf: branches` exactly or stricter (module docstring);
    None when no branch is left. `originals[i]` is branch i as sent (`branches[i]` is it
    rewritten, and with the parent's keywords); a branch that `is_servable` rejects (it still
    holds a keyword no engine enforces) is left out, but still counts as a branch others must
    not overlap."""
    assert len(originals) == len(branches)
    kept: list[object] = []
    for i, branch in enumerate(branches):
        if not isinstance(branch, dict) or not is_servable(branch):
            note("oneOf")
            continue
        narrowed: Schema | None = branch
        for j, other in enumerate(originals):
            if j == i or narrowed is None:
                continue
            if not disjoint(narrowed, other, resolve):
                narrowed = _narrowed(narrowed, target(other, resolve), resolve)
        if narrowed is not branch:
            note("oneOf")  # narrowed (perhaps only by values no valid output holds) or left out
        if narrowed is not None:
            kept.append(narrowed)
    return kept or None


def _narrowed(branch: Schema, other: object, resolve: Resolve | None) -> Schema | None:
    """A subset of `branch` disjoint from `other`, or None."""
    if not isinstance(other, dict):
        return None
    for candidate in _candidates(branch, other, resolve):
        if candidate is not None and disjoint(candidate, other, resolve):
            return candidate
    return None


def _candidates(branch: Schema, other: Schema, resolve: Resolve | None) -> list[Schema | None]:
    """Narrowings of `branch` to try against `other`, those that keep the most first."""
    out: list[Schema | None] = []
    own, theirs = types_of(branch, resolve), types_of(other, resolve)
    if (own is None or "object" in own) and (theirs is None or "object" in theirs):
        required = required_names(branch)
        for name in other.get("required", []):
            if isinstance(name, str) and name not in required:
                out.append(_object_with(branch, {"properties": {name: False}}))
                break
        props = branch.get("properties") if isinstance(branch.get("properties"), dict) else {}
        for name, sub in props.items():  # one of its own properties that the other forbids
            if sub is not False and forbids(other, name):
                out.append(_object_with(branch, {"required": [name]}))
                break
        names = _one_forbidden_each(other.get("anyOf"))  # the other an anyOf, each branch forbidding one
        if names and all(props.get(n) not in (None, False) for n in names):
            out.append(_object_with(branch, {"required": names}))
    their_values = values_of(other)
    if isinstance(branch.get("enum"), list) and their_values is not None:
        rest = [v for v in branch["enum"] if value_keys([v]).isdisjoint(value_keys(their_values))]
        if rest:
            out.append({**branch, "enum": rest})
    if theirs is not None:
        out.append(_with_types((ALL_TYPES if own is None else own) - theirs, branch))
    return out


def _one_forbidden_each(branches: object) -> list[str] | None:
    """A property name per branch that the branch forbids (GitHub actions' composite steps: "no
    `run` or no `shell`"), when each has one; an object holding them all satisfies no branch."""
    if not isinstance(branches, list) or not branches:
        return None
    names: list[str] = []
    for sub in branches:
        if not isinstance(sub, dict):
            return None
        inner = sub.get("not")
        name = inner["required"][0] if isinstance(inner, dict) and isinstance(inner.get("required"), list) and len(
            inner["required"]) == 1 else None
        if not isinstance(name, str) or not forbids(sub, name):
            return None
        names.append(name)
    return list(dict.fromkeys(names))


def _with_types(atoms: frozenset[str] | set[str], branch: Schema) -> Schema | None:
    """`branch` limited to the type atoms `atoms` (None when they cannot be written as `type`:
    none left, or numbers that are not integers)."""
    names = [n for n in _TYPE_ORDER if n in atoms]
    if "number" in names:
        if "integer" not in atoms:
            return None
        names.remove("integer")
    if not names:
        return None
    # `atoms` is within the types `branch` admits (its own `type` among them): replacing narrows
    return {**branch, "type": names[0] if len(names) == 1 else names}


def _object_with(branch: Schema, extra: Schema) -> Schema | None:
    """`branch` as an object, also valid for `extra` (properties forbidden, names required)."""
    out = dict(branch)
    kind = types_of({"type": branch["type"]}) if "type" in branch else None
    if kind is not None and "object" not in kind:
        return None
    out["type"] = "object"
    props = dict(out.get("properties") or {})
    for name, sub in extra.get("properties", {}).items():
        props[name] = sub
    if extra.get("properties"):
        out["properties"] = props
    if extra.get("required"):
        out["required"] = list(dict.fromkeys([*out.get("required", []), *extra["required"]]))
    return out
