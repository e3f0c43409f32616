"""Regex-text helpers: syntax checks, literal escaping, and rewrites that keep JSON output valid.

outlines-core compiles regexes with Rust's `regex` crate (Unicode mode, byte-level DFA). We check
syntax with Python's `re` (fast, precise messages), with Rust-only syntax such as `\\p{Greek}`
swapped for Python syntax of the same shape; never with a DFA build, which can take exponential
time. `check_regex_size` bounds a regex's length and its positions (see `limits`).
"""

from __future__ import annotations

import re
import warnings

from radixlm.runtime.config.limits import MAX_REGEX_CHARS, MAX_REGEX_POSITIONS
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


# Rust-only syntax, rewritten into Python syntax of the same shape for the syntax check only.
_RUST_ONLY = [
    (re.compile(r"\\[pP](\{[^}]*\}|[A-Za-z])"), r"\\w"),  # Unicode classes: \p{Greek}, \pL
    (re.compile(r"\\x\{[0-9A-Fa-f]{1,8}\}"), r"\\x00"),  # \x{10FFFF}
    (re.compile(r"\(\?<(?=[A-Za-z_])"), "(?P<"),  # named groups (?<name>...)
    (re.compile(r"\\z"), r"\\Z"),
]


def python_regex_error(pattern: str) -> str | None:
    """Python's `re` complaint about `pattern`, or None if it compiles."""
    try:
        with warnings.catch_warnings():  # "possible nested set" and the like: Rust syntax, fine
            warnings.simplefilter("ignore")
            re.compile(pattern)
    except re.error as e:
        return str(e)
    except (RecursionError, OverflowError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def check_regex_syntax(pattern: object, what: str = "regex") -> str:
    """Returns `pattern` if it is a syntactically valid regex string; GrammarError naming the problem.

    Valid means Python's `re` accepts it, or accepts it once Rust-only escapes (`\\p{..}`,
    `\\x{..}`, `(?<name>`, `\\z`) are swapped for Python ones of the same shape. Costs a parse,
    never a DFA build, so it is safe on the request path. Constructs that only Python supports
    (lookaround, backreferences) pass here and fail later, at index build, with a GrammarError.
    """
    if not isinstance(pattern, str):
        raise GrammarError(f"{what} must be a string, got {type(pattern).__name__}")
    python_error = python_regex_error(pattern)
    if python_error is None:
        return pattern
    pythonized = pattern
    for rust, python in _RUST_ONLY:
        pythonized = rust.sub(python, pythonized)
    if pythonized != pattern:
        python_error = python_regex_error(pythonized)  # the complaint beyond the Rust-only syntax
        if python_error is None:
            return pattern
    raise GrammarError(f"invalid {what} {_shorten(pattern)}: {python_error}")


def check_regex_size(pattern: str, what: str = "regex", max_chars: int = MAX_REGEX_CHARS) -> None:
    """GrammarError if `pattern` is longer than `max_chars` or has more than MAX_REGEX_POSITIONS
    positions (see `regex_positions`). Linear in the pattern's length."""
    if len(pattern) > max_chars:
        raise GrammarError(f"{what} is too long: {len(pattern)} characters, the limit is {max_chars}")
    positions = regex_positions(pattern, MAX_REGEX_POSITIONS)
    if positions > MAX_REGEX_POSITIONS:
        raise GrammarError(
            f"{what} is too large: more than {MAX_REGEX_POSITIONS} positions once its counted "
            f"repetitions are multiplied out ({_shorten(pattern)}); use fewer or smaller {{m,n}} counts"
        )


def regex_positions(pattern: str, limit: int) -> int:
    """The number of atoms of `pattern` with counted repetitions multiplied out (`a{3}b` is 4,
    `(ab){2,5}` is 10, `a*` is 1); stops counting once past `limit`.

    A token index has roughly one state per position of a regex without alternation blow-up, so
    this bounds the work of a compile from below, cheaply. It is a scan of the text, tolerant of
    malformed patterns (their syntax is checked elsewhere) and of both Python and Rust syntax.
    """
    # One frame per open group: [sum of finished alternatives, current sequence, last atom].
    stack: list[list[int]] = [[0, 0, 0]]
    i, n = 0, len(pattern)
    while i < n:
        frame = stack[-1]
        char = pattern[i]
        atom = 0
        if char == "\\":
            i = _skip_escape(pattern, i)
            atom = 1
        elif char == "[":
            i = _skip_class(pattern, i)
            atom = 1
        elif char == "(":
            stack.append([0, 0, 0])
            i = _skip_group_prefix(pattern, i + 1)
            continue
        elif char == ")" and len(stack) > 1:
            done = stack.pop()
            stack[-1][2] = done[0] + done[1]
            stack[-1][1] += stack[-1][2]
            i += 1
        elif char == "|":
            frame[0] += frame[1]
            frame[1] = frame[2] = 0
            i += 1
        elif char in "*+?":
            i += 1
        elif char == "{" and (counted := _counted_repetition(pattern, i)) is not None:
            high, i = counted
            frame[1] += frame[2] * (high - 1)
            frame[2] *= high
        else:
            atom = 1
            i += 1
        if atom:
            frame[1] += atom
            frame[2] = atom
        if stack[-1][0] + stack[-1][1] > limit or stack[-1][2] > limit:
            return limit + 1
    while len(stack) > 1:  # unclosed groups: count them anyway
        done = stack.pop()
        stack[-1][1] += done[0] + done[1]
    return stack[0][0] + stack[0][1]


def _skip_escape(pattern: str, i: int) -> int:
    """Index after the escape starting at `pattern[i] == "\\"` (`\\p{..}`, `\\x{..}` included)."""
    if i + 2 < len(pattern) and pattern[i + 1] in "pPxuUN" and pattern[i + 2] == "{":
        close = pattern.find("}", i + 3)
        return len(pattern) if close < 0 else close + 1
    return i + 2


def _skip_class(pattern: str, i: int) -> int:
    """Index after the character class starting at `pattern[i] == "["` (nested classes allowed)."""
    depth, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if char == "\\":
            i = _skip_escape(pattern, i)
            continue
        if char == "[":
            depth += 1
            i += 1
            if pattern.startswith("^", i):
                i += 1
            if pattern.startswith("]", i):  # a leading ']' is a literal
                i += 1
            continue
        if char == "]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def _skip_group_prefix(pattern: str, i: int) -> int:
    """Index of a group's body, after `(`: skips `?:`, `?P<name>`, `?<name>`, `?=`, flags..."""
    if not pattern.startswith("?", i):
        return i
    for j in range(i + 1, min(len(pattern), i + 256)):
        if pattern[j] in ":>=!)":  # `(?flags)` alone is an empty group: stop at its `)`
            return j if pattern[j] == ")" else j + 1
    return i


def _counted_repetition(pattern: str, i: int) -> tuple[int, int] | None:
    """(largest count, index after) of a `{m}`, `{m,}` or `{m,n}` at `pattern[i]`, else None.
    `{m,}` counts m + 1 (the unbounded tail is one more copy)."""
    close = pattern.find("}", i + 1, i + 48)
    if close < 0:
        return None
    low, comma, high = pattern[i + 1 : close].partition(",")
    low, high = low.strip(), high.strip()
    if not low.isdigit() or not (high.isdigit() or high == ""):
        return None
    count = int(high) if high else int(low) + (1 if comma else 0)
    return max(count, 1), close + 1


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
