"""JSON read as it is generated: the decided part of a value that may be cut off anywhere.

`canonical_prefix(text, pos)` gives the canonical serialization of the value starting at
`pos` as far as `text` decides it, and where the value ends (None while it goes on). The
canonical form is `json.dumps(json.loads(value), ensure_ascii=False)` for values without
repeated keys: separators ", " and ": ", no other whitespace, strings re-escaped as json.dumps
escapes them, numbers and literals as json.dumps writes what json.loads reads. Contract: the
output for any prefix of a text is a prefix of the output for the whole text (nothing it gives
is taken back): a number or literal is only given once a delimiter ends it, an escape sequence
once it is whole. The reader checks the tokens it meets, not the grammar between them (a
value that is not JSON is the caller's concern).

Pure functions over text, standard library only.
"""

from __future__ import annotations

import json
from json.decoder import scanstring

WHITESPACE = " \t\r\n"
_DELIMITERS = WHITESPACE + ",:{}[]\""
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class NotJSON(ValueError):
    """The text at hand cannot continue as JSON."""


def skip_whitespace(text: str, pos: int, also: str = "") -> int:
    """The first position at or after `pos` that is not JSON whitespace (nor in `also`)."""
    while pos < len(text) and (text[pos] in WHITESPACE or text[pos] in also):
        pos += 1
    return pos


def read_string(text: str, pos: int) -> tuple[str, int] | None:
    """The decoded JSON string opening at `text[pos] == '"'` and the position after it; None if
    the text ends inside it; NotJSON if it is malformed."""
    end = pos + 1
    while end < len(text) and text[end] != '"':
        end += 2 if text[end] == "\\" else 1
    if end >= len(text):
        return None
    try:
        return scanstring(text, pos + 1, True)
    except json.JSONDecodeError as e:
        raise NotJSON(str(e)) from e


def value_end(text: str, pos: int) -> int | None:
    """Where the JSON value starting at `pos` ends, by its brackets and strings (not checked
    further); None if the text ends first."""
    depth = 0
    i = pos
    while i < len(text):
        c = text[i]
        if c == '"':
            found = read_string(text, i)
            if found is None:
                return None
            i = found[1]
        elif c in "{[":
            depth, i = depth + 1, i + 1
        elif c in "}]":
            depth, i = depth - 1, i + 1
        elif c in WHITESPACE or c in ",:":
            i += 1
        else:  # a number or literal: it ends at a delimiter
            start = i
            while i < len(text) and text[i] not in _DELIMITERS:
                i += 1
            if i == len(text) and depth == 0:
                return None  # a top-level number may go on
            if depth == 0 and start == pos:
                return i
        if depth <= 0:
            return i
    return None


def canonical_prefix(text: str, pos: int) -> tuple[str, int | None]:
    """(the canonical serialization of the decided part of the value at `pos`, the position
    after the value or None while it goes on). NotJSON at a token that cannot be JSON."""
    out: list[str] = []
    depth = 0
    i = pos
    while i < len(text):
        c = text[i]
        if c in WHITESPACE:
            i += 1
            continue
        if c in "{[":
            out.append(c)
            depth, i = depth + 1, i + 1
        elif c in "}]":
            out.append(c)
            depth, i = depth - 1, i + 1
        elif c == ",":
            out.append(", ")
            i += 1
        elif c == ":":
            out.append(": ")
            i += 1
        elif c == '"':
            piece, i, is_closed = _string_prefix(text, i)
            out.append(piece)
            if not is_closed:
                return "".join(out), None
        else:
            end = i
            while end < len(text) and text[end] not in _DELIMITERS:
                end += 1
            if end == len(text):
                return "".join(out), None  # a number or literal that may go on
            try:
                out.append(json.dumps(json.loads(text[i:end])))
            except json.JSONDecodeError as e:
                raise NotJSON(f"not a JSON number or literal: {text[i:end]!r:.40}") from e
            i = end
        if depth <= 0:
            return "".join(out), i
    return "".join(out), None


def _string_prefix(text: str, pos: int) -> tuple[str, int, bool]:
    """(the canonical form of the string at `pos` as far as it is decided, where reading
    stopped, whether the string closed)."""
    out = ['"']
    i = pos + 1
    while i < len(text):
        c = text[i]
        if c == '"':
            out.append('"')
            return "".join(out), i + 1, True
        if c != "\\":
            char, size = c, 1
        else:
            escaped = _escape(text, i)
            if escaped is None:
                break
            char, size = escaped
        out.append(json.dumps(char, ensure_ascii=False)[1:-1])
        i += size
    return "".join(out), i, False


def _escape(text: str, pos: int) -> tuple[str, int] | None:
    """(the character of the escape sequence at `text[pos] == '\\'`, its length); None if the
    text ends before it is decided."""
    if pos + 1 >= len(text):
        return None
    kind = text[pos + 1]
    if kind in _ESCAPES:
        return _ESCAPES[kind], 2
    if kind != "u":
        raise NotJSON(f"invalid escape \\{kind}")
    code = _hex4(text, pos + 2)
    if code is None:
        return None
    if not 0xD800 <= code < 0xDC00:
        return chr(code), 6
    # a high surrogate: one character with the low half that may follow
    follow = text[pos + 6: pos + 8]
    if len(follow) < 2 and "\\u".startswith(follow):
        return None
    if follow == "\\u":
        low = _hex4(text, pos + 8)
        if low is None:
            return None
        if 0xDC00 <= low < 0xE000:
            return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), 12
    return chr(code), 6


def _hex4(text: str, pos: int) -> int | None:
    digits = text[pos: pos + 4]
    if any(d not in "0123456789abcdefABCDEF" for d in digits):
        raise NotJSON(f"invalid \\u escape {digits!r}")
    return int(digits, 16) if len(digits) == 4 else None
