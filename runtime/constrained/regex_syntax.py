"""Regex-text helpers: syntax checks, literal escaping, and rewrites that keep JSON output valid.

outlines-core compiles regexes with Rust's `regex` crate (Unicode mode, byte-level DFA). We check
syntax with Python's `re` first (fast, precise messages) and fall back to the Rust parser for
Rust-only syntax such as `\\p{Greek}`.
"""

from __future__ import annotations

import functools
import re

import outlines_core

from radixlm.runtime.constrained.errors import GrammarError

# Characters that are special somewhere in Rust regex syntax; escaping them is valid in Python too.
_META = frozenset("\\.+*?()|[]{}^$#&-~")
# What a raw JSON string may not contain unescaped: the quote, the backslash, control characters.
_JSON_FORBIDDEN = r'"\\\x00-\x1F'

_OUTSIDE_CLASS = {"d": "[0-9]", "D": f"[^0-9{_JSON_FORBIDDEN}]", "s": "[ ]", "S": f"[^\\s{_JSON_FORBIDDEN}]",
                  "W": f"[^\\w{_JSON_FORBIDDEN}]"}  # fmt: skip
_INSIDE_CLASS = {"d": "0-9", "s": " "}


def escape_literal(text: str) -> str:
    """A regex matching exactly `text`, valid in both Rust and Python syntax."""
    return "".join("\\" + char if char in _META else char for char in text)


@functools.cache
def _byte_vocabulary() -> outlines_core.Vocabulary:
    """256 single-byte tokens (ids 1..256, EOS 0): any byte string is spellable with them."""
    return outlines_core.Vocabulary(0, {bytes([b]): [b + 1] for b in range(256)})


def rust_regex_error(pattern: str) -> str | None:
    """outlines-core's complaint about `pattern` (it builds the pattern's DFA), or None if it builds.

    Costs a DFA build over 256 byte tokens: milliseconds for ordinary patterns, exponential for
    pathological ones, so callers use it only where Python's parser already failed.
    """
    try:
        outlines_core.Index(pattern, _byte_vocabulary())
    except ValueError as e:
        return str(e).splitlines()[0]
    return None


def python_regex_error(pattern: str) -> str | None:
    """Python's `re` complaint about `pattern`, or None if it compiles."""
    try:
        re.compile(pattern)
    except re.error as e:
        return str(e)
    except (RecursionError, OverflowError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def check_regex_syntax(pattern: object, what: str = "regex") -> str:
    """Returns `pattern` if it is a syntactically valid regex string; GrammarError naming the problem.

    Valid means Python's `re` or Rust's parser accepts it. Constructs that only Python supports
    (lookaround, backreferences) pass here and fail later, at index build, with a GrammarError.
    """
    if not isinstance(pattern, str):
        raise GrammarError(f"{what} must be a string, got {type(pattern).__name__}")
    python_error = python_regex_error(pattern)
    if python_error is None or rust_regex_error(pattern) is None:
        return pattern
    raise GrammarError(f"invalid {what} {_shorten(pattern)}: {python_error}")


def _shorten(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def rewrite_regex(pattern: str, *, in_json_string: bool) -> str:
    """Rewrites `pattern` so every match is safe output; the matched language only shrinks.

    Always: `\\d` becomes ASCII `[0-9]` (Rust's `\\d` is Unicode, e.g. Arabic-Indic digits).
    With `in_json_string` (a JSON-schema `pattern`, matched against raw JSON text between the
    quotes): `.` and top-level negated classes also exclude `"`, `\\` and control characters, `\\s`
    becomes a space, and `\\D`/`\\S`/`\\W` outside classes exclude them too, so a match is a valid
    JSON string body. Escapes inside negated classes are kept (rewriting them would widen the
    class). Character classes may nest (Rust syntax); a `]` right after `[` or `[^` is a literal.
    """
    out: list[str] = []
    class_stack: list[bool] = []  # one entry per open character class: is it negated?
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            out.append(_rewrite_escape(pattern[i + 1], class_stack, in_json_string))
            i += 2
            continue
        if char == "[":
            negated = pattern.startswith("[^", i)
            out.append(
                "[^" + (_JSON_FORBIDDEN if in_json_string and not class_stack else "") if negated else "["
            )
            i += 2 if negated else 1
            if i < len(pattern) and pattern[i] == "]":  # a leading ']' is a literal
                out.append("\\]")
                i += 1
            class_stack.append(negated)
            continue
        if char == "]" and class_stack:
            class_stack.pop()
        elif char == "." and not class_stack and in_json_string:
            char = f"[^{_JSON_FORBIDDEN}]"
        out.append(char)
        i += 1
    return "".join(out)


def _rewrite_escape(char: str, class_stack: list[bool], in_json_string: bool) -> str:
    """The replacement for the escape `\\<char>` (see `rewrite_regex`); negated classes keep theirs."""
    if class_stack and class_stack[-1]:
        return "\\" + char
    table = _INSIDE_CLASS if class_stack else _OUTSIDE_CLASS
    rewritten = table.get(char) if (in_json_string or char == "d") else None
    return rewritten if rewritten is not None else "\\" + char
