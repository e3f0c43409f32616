"""Regex language containment, for a `format` beside a `pattern` (`schema_rewrite`).

`language_within(R, P)`: whether every string that R matches whole also matches the JSON Schema
pattern P (ECMA-262, which matches anywhere in the string). Both become automata
(`interegular`, which outlines uses too) and the first's language is checked to be a subset of
that of P taken whole, as `.*(?:P).*` with a leading `^` dropped instead of its `.*`, a trailing
`$` likewise. That is P's own language, except where an anchor sits in only one branch of a
top-level `|` (`^a|b$` is read as `(?:a|b)`): then it is a part of P's, so a True answer is exact
and some Trues are missed (False: the caller refuses, as before). Where either regex uses what
interegular does not read (lookarounds, back-references), the answer is False. R is ours
(`schema_rewrite.FORMAT_PATTERNS`: digits, `-`, `:`, `.`, `T`, `Z`, `+`), so where interegular's
reading of P differs from ECMA-262's (`.` and line terminators, Unicode digits) no string R
matches is concerned.
"""

from __future__ import annotations


def _whole(pattern: str) -> str:
    """A regex whose whole matches are the strings `pattern` matches anywhere (see above)."""
    prefix = suffix = ".*"
    if pattern.startswith("^"):
        pattern, prefix = pattern[1:], ""
    if pattern.endswith("$"):
        backslashes = len(pattern[:-1]) - len(pattern[:-1].rstrip("\\"))
        if backslashes % 2 == 0:
            pattern, suffix = pattern[:-1], ""
    return f"{prefix}(?:{pattern}){suffix}"


def language_within(regex: str, pattern: str) -> bool:
    """Whether every string `regex` matches whole matches `pattern` (see the module docstring)."""
    import interegular

    try:
        ours = interegular.parse_pattern(regex).to_fsm()
        theirs = interegular.parse_pattern(_whole(pattern)).to_fsm()
        return bool(ours.issubset(theirs))
    except Exception:  # interegular's parse errors and unsupported constructs have no common base
        return False
