"""A `oneOf` whose branches overlap by JSON type, made disjoint (stricter): the value types two or
more branches admit are removed from every branch.

`oneOf` asks that exactly one branch match, which no engine enforces; the rewrite already serves a
`oneOf` whose branches cannot overlap as `anyOf` (`schema_rewrite._disjoint`). Real schemas often
write `oneOf: [{"type": ["string", "null"]}, {"type": ["number", "null"]}]` (Kubernetes' Quantity):
`null` matches both branches, so it is not a valid value, and the exact language is "a string or
a number". In general a value of a type that two branches admit may still match only one of them
(their other keywords may tell it apart), so dropping those types is exact or stricter, never
looser; the branches left admit pairwise different types, so `anyOf` of them is `oneOf` of them.
"""

from __future__ import annotations

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
