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

import re
from typing import Any

from radixlm.runtime.constrained.schema_disjoint import ALL_TYPES, types_of, value_keys, values_of

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
    if "pattern" not in node:
        return {**node, "type": "string", "pattern": f"^{negated_class(avoided)}*$"}
    narrowed = pattern_avoiding(node["pattern"], avoided) if isinstance(node["pattern"], str) else None
    return None if narrowed is None else {**node, "type": "string", "pattern": narrowed}


def pattern_avoiding(pattern: str, avoided: set[str]) -> str | None:
    """`pattern` narrowed to strings without a character of `avoided`, when it is anchored at both
    ends and a sequence of literals and classes, each maybe repeated (`^[A-Za-z][A-Za-z0-9_]*$`):
    every character of a match is then one of its classes', and each class loses `avoided`.
    None for other patterns, or when a character `avoided` is a literal of the pattern."""
    try:
        items = list(re._parser.parse(pattern))  # type: ignore[attr-defined]
    except (re.error, RecursionError, AttributeError):
        return None
    if len(items) < 2 or items[0] != (re._constants.AT, re._constants.AT_BEGINNING) or items[-1] != (  # type: ignore[attr-defined]
            re._constants.AT, re._constants.AT_END):  # type: ignore[attr-defined]
        return None
    out = []
    for op, arg in items[1:-1]:
        if str(op) in ("MAX_REPEAT", "MIN_REPEAT") and len(arg[2]) == 1:
            low, high, sub = arg
            atom = _atom_avoiding(*list(sub)[0], avoided)
            quantifier = _quantifier(low, None if high == re._constants.MAXREPEAT else high)  # type: ignore[attr-defined]
        else:
            atom, quantifier = _atom_avoiding(op, arg, avoided), ""
        if atom is None:
            return None
        out.append(atom + quantifier)
    return "^" + "".join(out) + "$"


def avoided_chars(pattern: str) -> set[str] | None:
    """The characters `pattern` bans when it is `^[^...]*$` of listed characters and ranges (any
    string without them), else None."""
    try:
        items = list(re._parser.parse(pattern))  # type: ignore[attr-defined]
    except (re.error, RecursionError, AttributeError):
        return None
    if len(items) != 3 or [str(op) for op, _ in items] != ["AT", "MAX_REPEAT", "AT"] or str(items[0][1]) != (
            "AT_BEGINNING") or str(items[2][1]) != "AT_END":
        return None
    low, high, sub = items[1][1]
    sub = list(sub)
    if low != 0 or high != re._constants.MAXREPEAT or len(sub) != 1:  # type: ignore[attr-defined]
        return None
    if str(sub[0][0]) == "NOT_LITERAL":  # `[^c]`, as Python's parser reads it
        return {chr(sub[0][1])}
    if str(sub[0][0]) != "IN":
        return None
    members = list(sub[0][1])
    if not members or str(members[0][0]) != "NEGATE":
        return None
    return class_chars(members[1:])


def _quantifier(low: int, high: int | None) -> str:
    if high is None:
        return {0: "*", 1: "+"}.get(low, f"{{{low},}}")
    return f"{{{low}}}" if low == high else f"{{{low},{high}}}"


_PRINTABLE = frozenset(chr(c) for c in range(0x20, 0x7F))


def negated_class(excluded: set[str] | frozenset[str]) -> str:
    """A class of every character but `excluded`; where `excluded` holds a non-ASCII character,
    printable ASCII but `excluded` instead (stricter: xgrammar's budget steering finds no way out
    of a negated class of multi-byte characters)."""
    if all(ord(c) < 128 for c in excluded):
        return "[^" + "".join(class_char(c) for c in sorted(excluded)) + "]"
    return class_text(_PRINTABLE - excluded)


def class_text(chars: set[str] | frozenset[str]) -> str:
    """A class of exactly `chars` (runs of 3 or more written as ranges)."""
    codes, parts, i = sorted(ord(c) for c in chars), [], 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        if j - i >= 2 and chr(codes[i]).isalnum() and chr(codes[j]).isalnum():
            parts.append(f"{class_char(chr(codes[i]))}-{class_char(chr(codes[j]))}")
        else:
            parts.extend(class_char(chr(c)) for c in codes[i : j + 1])
        i = j + 1
    return "[" + "".join(parts) + "]"


def _atom_avoiding(op: Any, arg: Any, avoided: set[str]) -> str | None:
    """One literal or class as a class without `avoided` (None where this cannot say it)."""
    if str(op) == "LITERAL":
        return None if chr(arg) in avoided else class_char(chr(arg)).join("[]")
    if str(op) == "NOT_LITERAL":  # `[^c]`, as Python's parser reads it
        return negated_class(avoided | {chr(arg)})
    if str(op) == "ANY":  # ECMA-262's `.` (anything but a line terminator): printable ASCII, stricter
        return class_text(_PRINTABLE - avoided)
    if str(op) != "IN":
        return None
    if arg and str(arg[0][0]) == "NEGATE":  # [^...]: add `avoided` to what it excludes
        excluded = class_chars(arg[1:])
        return None if excluded is None else negated_class(excluded | avoided)
    chars = class_chars(arg)
    if chars is None or not chars - avoided:
        return None
    return class_text(chars - avoided)


_ESCAPED = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\v": "\\x0B", "\f": "\\x0C"}


def class_char(char: str) -> str:
    """`char` inside a character class, the same in ECMA-262, Python and Rust regex syntax."""
    if char in _ESCAPED:
        return _ESCAPED[char]
    if ord(char) < 32:
        return f"\\x{ord(char):02X}"
    return "\\" + char if char in "\\[]^-" else char


# ECMA-262's \s: what a `\s` in a pattern may match
_ECMA_SPACE = frozenset("\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
                        "\u200a\u2028\u2029\u202f\u205f\u3000\ufeff")
_CATEGORY_CHARS = {"CATEGORY_DIGIT": frozenset("0123456789"), "CATEGORY_SPACE": _ECMA_SPACE,
                   "CATEGORY_WORD": frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")}
_MAX_RANGE = 128  # a class range wider than this is not listed character by character


def required_chars(pattern: str) -> set[str] | None:
    """A set of characters every string that `pattern` matches (anywhere, ECMA-262) holds one of,
    or None when this cannot find one (a case-insensitive flag, `.`, a negated class, ...). Read
    with Python's regex parser: the constructs used here mean the same in both syntaxes."""
    try:
        parsed = re._parser.parse(pattern)  # type: ignore[attr-defined]
    except (re.error, RecursionError, AttributeError):
        return None
    if parsed.state.flags & re.IGNORECASE:
        return None
    return _sequence_chars(list(parsed))


def _sequence_chars(items: list[tuple[Any, Any]]) -> set[str] | None:
    """The smallest set one item of this sequence, which every match goes through, requires."""
    best: set[str] | None = None
    for op, arg in items:
        found = _item_chars(str(op), arg)
        if found is not None and (best is None or len(found) < len(best)):
            best = found
    return best


def _item_chars(op: str, arg: Any) -> set[str] | None:
    if op == "LITERAL":
        return {chr(arg)}
    if op == "IN":
        return class_chars(arg)
    if op == "SUBPATTERN":
        _group, add_flags, _del_flags, sub = arg
        return None if add_flags & re.IGNORECASE else _sequence_chars(list(sub))
    if op in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        low, _high, sub = arg
        return _sequence_chars(list(sub)) if low >= 1 else None
    if op == "BRANCH":
        union: set[str] = set()
        for alternative in arg[1]:
            found = _sequence_chars(list(alternative))
            if found is None:
                return None
            union |= found
        return union
    return None


def class_chars(items: list[tuple[Any, Any]]) -> set[str] | None:
    chars: set[str] = set()
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            chars.add(chr(arg))
        elif name == "RANGE" and arg[1] - arg[0] <= _MAX_RANGE:
            chars.update(chr(c) for c in range(arg[0], arg[1] + 1))
        elif name == "CATEGORY" and str(arg) in _CATEGORY_CHARS:
            chars |= _CATEGORY_CHARS[str(arg)]
        else:
            return None  # a negated class, a wide range, a negated category
    return chars
