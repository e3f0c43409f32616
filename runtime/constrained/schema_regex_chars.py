"""Character-level facts about regexes, for the rewrites of `not: {pattern}`, `format: regex`
and patterns that only ban characters (`schema_not`, `schema_merge`, `schema_rewrite`).

- `required_chars(P)`: a set of characters every string P matches holds one of (`\\.\\.` -> `.`,
  `^\\w+://` -> `:`); strings without any of them never match P.
- `pattern_avoiding(P, S)`: P narrowed to strings without a character of S, when P is anchored
  and a sequence of literals and classes, each maybe repeated (`^[A-Za-z][A-Za-z0-9_]*$`).
- `avoided_chars(P)`: the characters P bans when it is `^[^...]*$`.
- `negated_class(S)` / `class_text(S)`: classes written the same in ECMA-262, Python and Rust
  regex syntax (printable ASCII where a negated class would hold a non-ASCII character).

Patterns are read with Python's regex parser (`re._parser`); the constructs used here mean the
same in ECMA-262 (`\\d` and `\\w` are taken as ASCII, `\\s` as ECMA-262's whitespace, `.` as
anything but a line terminator); anything else gives None, and the caller keeps the keyword.
"""

from __future__ import annotations

import re
from typing import Any


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
