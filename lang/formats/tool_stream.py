"""Tool calls read as the model writes them: `ToolCallStream` turns an output that arrives in
text deltas into content deltas and, per call, a first delta with the call's index, id and name,
then fragments of its arguments, as OpenAI streams `delta.tool_calls`.

    stream = ToolCallStream(tool_call_reader("hermes"), {"get_weather"})
    for piece in pieces:
        for delta in stream.feed(piece): ...
    for delta in stream.finish(): ...

Contract:
- nothing sent is taken back: text that may still turn out to be part of a call (a partial
  `<tool_call>` tag, a block not yet decided, trailing whitespace) is held until decided;
- a call is sent once its header is read (`{"name": <offered tool>, "arguments": {` in the JSON
  formats, `f(a=<literal>` or `f()` in pythonic, `name[ARGS]{` in Mistral's per-call form); its
  arguments then go out in the canonical form `ToolCallReader.parse` gives (json_prefix);
- the final content and calls equal `ToolCallReader.parse` of the whole text, however it was cut
  into deltas, for every output whose calls are well formed once opened. A call the stream has
  sent stays sent: if its JSON is later cut off (max_tokens) or broken, or a later call of a
  whole-message format (json, llama3, mistral, pythonic) is not one, the stream keeps what it
  sent where parse would read the whole text as content. An arguments object with a repeated
  key is sent as written (parse keeps the last value, as json.loads does).

Each feed re-reads the output from its start (outputs with tools are short); the reading is
a pure function of the text so far, and the deltas are its growth.
"""

from __future__ import annotations

import ast
import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from radixlm.formats.json_prefix import NotJSON, canonical_prefix, read_string, skip_whitespace, value_end
from radixlm.formats.tool_formats import (
    _MISTRAL_ARGS,
    _MISTRAL_BOT,
    _PYTHON_TAG,
    ToolCallReader,
    _loads,
    call_from_value,
)


@dataclass(frozen=True)
class ToolCallDelta:
    """One step of a streamed output: content text (`index` -1), or a part of call `index`: its
    first delta has `id` and `name` (and arguments ""), later ones an `arguments` fragment."""

    index: int
    id: str | None
    name: str | None
    arguments: str
    content: str


@dataclass(frozen=True)
class _Call:
    name: str
    arguments: str  # canonical, as far as decided
    end: int | None  # the position after the call's text, None while it goes on


@dataclass(frozen=True)
class _Reading:
    content: str
    calls: tuple[tuple[str, str], ...]  # (name, arguments so far)


class ToolCallStream:
    """See the module docstring. One per output; `finish` once, after the last `feed`."""

    def __init__(self, reader: ToolCallReader, tool_names: Iterable[str]):
        self._reader = reader
        self._tool_names = set(tool_names)
        self._text = ""
        self._sent_content = ""
        self._sent_calls: list[tuple[str, str]] = []  # (name, arguments sent)
        self.is_parsed = False  # after finish: the calls sent are parse's, whole (none cut off)

    @property
    def num_calls(self) -> int:
        """How many calls have been sent (begun) so far."""
        return len(self._sent_calls)

    def feed(self, text: str) -> list[ToolCallDelta]:
        self._text += text
        return self._grow(self._read(is_final=False))

    def finish(self) -> list[ToolCallDelta]:
        """What was held back, now decided: `parse` of the whole text where it agrees with
        what was sent, else (a call broken after it was sent) the stream's own reading."""
        content, calls = self._reader.parse(self._text, self._tool_names)
        parsed = _Reading(content or "", tuple((c.name, c.arguments) for c in calls))
        self.is_parsed = self._extends(parsed)
        return self._grow(parsed if self.is_parsed else self._read(is_final=True))

    def _read(self, is_final: bool) -> _Reading:
        scan = _Scan(self._text, self._tool_names, is_final)
        try:
            _READERS[self._reader.format.name](scan, self._reader.json_fallback)
        except _Deferred:
            pass
        content = "".join(scan.content)
        if not is_final or scan.calls:
            content = content.rstrip()  # trailing whitespace is dropped if calls follow or the output has any
        return _Reading(content, tuple((c.name, c.arguments) for c in scan.calls))

    def _extends(self, reading: _Reading) -> bool:
        return (reading.content.startswith(self._sent_content) and len(reading.calls) >= len(self._sent_calls)
                and all(name == sent_name and args.startswith(sent_args)
                        for (name, args), (sent_name, sent_args) in zip(reading.calls, self._sent_calls)))

    def _grow(self, reading: _Reading) -> list[ToolCallDelta]:
        """The deltas from what was sent to `reading`; a part that does not extend what was sent
        is not sent (the reading is monotone, so this only guards the contract)."""
        deltas: list[ToolCallDelta] = []
        if reading.content.startswith(self._sent_content) and len(reading.content) > len(self._sent_content):
            deltas.append(ToolCallDelta(-1, None, None, "", reading.content[len(self._sent_content):]))
            self._sent_content = reading.content
        for index, (name, arguments) in enumerate(reading.calls):
            if index == len(self._sent_calls):
                deltas.append(ToolCallDelta(index, f"call_{uuid.uuid4().hex[:24]}", name, "", ""))
                self._sent_calls.append((name, ""))
            sent_name, sent = self._sent_calls[index]
            if sent_name != name or not arguments.startswith(sent):
                break
            if len(arguments) > len(sent):
                deltas.append(ToolCallDelta(index, None, None, arguments[len(sent):], ""))
                self._sent_calls[index] = (name, arguments)
        return deltas


class _Deferred(Exception):
    """Nothing more is decided before the end of the output (then `parse` decides)."""


class _Scan:
    """One reading of the output so far: the content pieces and calls it decides."""

    def __init__(self, text: str, tool_names: set[str], is_final: bool):
        self.text = text
        self.tool_names = tool_names
        self.is_final = is_final
        self.content: list[str] = []
        self.calls: list[_Call] = []

    def add_content(self, piece: str, marker: str) -> None:
        """`piece` as content, but for an end that may begin `marker` (unless final)."""
        keep = 0 if self.is_final else _marker_prefix_len(piece, marker)
        self.content.append(piece[: len(piece) - keep])

    def header(self, pos: int, keys: tuple[str, ...]) -> tuple[str, int] | str:
        """At `pos`, `{"name": <offered tool>, "<key>": {`: (the name, the position of that
        `{`); "hold" while the text may still become one; "other" if it cannot."""
        text = self.text
        name = ""
        for expected in ("{", "name", ":", "<name>", ",", "<key>", ":", "{"):
            pos = skip_whitespace(text, pos)
            if pos >= len(text):
                return "hold"
            if expected in "{:,":
                if text[pos] != expected:
                    return "other"
                if expected == "{" and name:
                    return name, pos
                pos += 1
                continue
            if text[pos] != '"':
                return "other"
            try:
                found = read_string(text, pos)
            except NotJSON:
                return "other"
            if found is None:
                return "hold"
            value, pos = found
            wanted = {"name": ("name",), "<name>": tuple(self.tool_names), "<key>": keys}[expected]
            if value not in wanted:
                return "other"
            if expected == "<name>":
                name = value
        return "other"  # not reached

    def arguments_at(self, brace: int, name: str) -> _Call:
        """The call whose arguments object opens at `brace`, read as far as decided; it ends
        with that object (a broken object: the arguments so far, and no end)."""
        try:
            arguments, end = canonical_prefix(self.text, brace)
        except NotJSON:
            return _Call(name, "", None)
        return _Call(name, arguments, end)

    def call_at(self, brace: int, name: str) -> _Call:
        """`arguments_at`, in a call object: it ends after the `}` closing that object (other
        members skipped)."""
        call = self.arguments_at(brace, name)
        return call if call.end is None else _Call(name, call.arguments, _object_end(self.text, call.end))

    def item(self, pos: int, keys: tuple[str, ...], is_first: bool) -> _Call | None:
        """The call object at `pos` of a sequence; None if the text has not decided it (or it is
        no call: reading stops). The first item of a message is sent on its header, or else
        decided by `parse` at the end (_Deferred)."""
        head = self.header(pos, keys)
        if isinstance(head, tuple):
            return self.call_at(head[1], head[0])
        if is_first:
            raise _Deferred
        end = value_end(self.text, pos) if head == "other" else None
        if end is None:
            return None
        value = _loads(self.text[pos:end])
        key = "parameters" if isinstance(value, dict) and "parameters" in value and "parameters" in keys else "arguments"
        call = call_from_value(value, self.tool_names, key)
        return None if call is None else _Call(call.name, call.arguments, end)

    def sequence(self, pos: int, keys: tuple[str, ...], separators: str, closer: str | None) -> None:
        """Call objects from `pos`, apart by whitespace and `separators`, up to `closer` (if any)."""
        is_first = True
        while True:
            pos = skip_whitespace(self.text, pos, "" if is_first else separators)
            if pos >= len(self.text) or (closer is not None and self.text[pos] == closer):
                return
            call = self.item(pos, keys, is_first)
            if call is None:
                return
            self.calls.append(call)
            if call.end is None:
                return
            pos, is_first = call.end, False


def _object_end(text: str, pos: int) -> int | None:
    """After a call's arguments at `pos`: the position after the call object's `}`, skipping
    any other members; None if the text ends first or the object is broken."""
    while True:
        pos = skip_whitespace(text, pos)
        if pos >= len(text):
            return None
        if text[pos] == "}":
            return pos + 1
        if text[pos] != ",":
            return None
        pos = skip_whitespace(text, pos + 1)
        try:
            key = read_string(text, pos) if pos < len(text) and text[pos] == '"' else None
        except NotJSON:
            return None
        if key is None:
            return None
        pos = skip_whitespace(text, key[1])
        if pos >= len(text) or text[pos] != ":":
            return None
        end = value_end(text, skip_whitespace(text, pos + 1))
        if end is None:
            return None
        pos = end


def _marker_prefix_len(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[len(text) - size:]):
            return size
    return 0


# ---------------------------------------------------------------- the formats


def _read_json_message(scan: _Scan, pos: int) -> None:
    """json: the message is one call object or a list of them."""
    if scan.text[pos] == "[":
        scan.sequence(pos + 1, ("arguments",), ",", "]")
    else:
        scan.sequence(pos, ("arguments",), "", None)


def _opens_json(scan: _Scan) -> int | None:
    """Where the message's JSON begins if it opens with `{` or `[{` (a call or a list of them);
    _Deferred while that is undecided."""
    pos = skip_whitespace(scan.text, 0)
    if pos >= len(scan.text):
        if scan.is_final:
            return None
        raise _Deferred
    if scan.text[pos] == "[":  # a list that does not open with an object is no list of calls
        first = skip_whitespace(scan.text, pos + 1)
        if first < len(scan.text) and scan.text[first] != "{":
            return None
        if first >= len(scan.text) and not scan.is_final:
            raise _Deferred
    return pos if scan.text[pos] in "{[" else None


def read_json(scan: _Scan, json_fallback: bool) -> None:
    pos = _opens_json(scan)
    if pos is None:
        scan.content.append(scan.text)  # a message that is not JSON is content
    else:
        _read_json_message(scan, pos)


def _blocks(opening: str, closing: str) -> Callable[[_Scan, bool], None]:
    def read_blocks(scan: _Scan, json_fallback: bool) -> None:
        """hermes / qwen25: content with `<tool_call>` blocks; with `json_fallback`, a message
        that opens with JSON is read as the json format."""
        if json_fallback:
            pos = _opens_json(scan)
            if pos is not None:
                _read_json_message(scan, pos)
                return
        text, pos = scan.text, 0
        while True:
            start = text.find(opening, pos)
            if start < 0:
                scan.add_content(text[pos:], opening)
                return
            scan.content.append(text[pos:start])
            body = start + len(opening)
            head = scan.header(skip_whitespace(text, body), ("arguments",))
            if isinstance(head, tuple):
                call = scan.call_at(head[1], head[0])
                scan.calls.append(call)
                close = -1 if call.end is None else text.find(closing, call.end)
                if close < 0:
                    return  # what follows the call object up to the closing tag is dropped
                pos = close + len(closing)
                continue
            close = text.find(closing, body)
            if close < 0 and not scan.is_final:
                return
            end = len(text) if close < 0 else close + len(closing)
            call = call_from_value(_loads(text[body: len(text) if close < 0 else close]), scan.tool_names)
            if call is None:
                scan.content.append(text[start:end])
            else:
                scan.calls.append(_Call(call.name, call.arguments, end))
            pos = end
    return read_blocks


def read_llama3(scan: _Scan, json_fallback: bool) -> None:
    """llama3: calls `;`-separated, the whole message or after content and `<|python_tag|>`."""
    keys = ("parameters", "arguments")
    pos = _opens_json(scan)
    if pos is not None and scan.text[pos] == "{":
        scan.sequence(pos, keys, ";", None)
        return
    tag = scan.text.find(_PYTHON_TAG)
    if tag < 0:
        scan.add_content(scan.text, _PYTHON_TAG)
        return
    scan.content.append(scan.text[:tag])
    scan.sequence(tag + len(_PYTHON_TAG), keys, ";", None)


def read_mistral(scan: _Scan, json_fallback: bool) -> None:
    """mistral: content, then `[TOOL_CALLS] [calls]` or `[TOOL_CALLS]name[ARGS]{...}` per call."""
    text = scan.text
    bot = text.find(_MISTRAL_BOT)
    if bot < 0:
        if json_fallback and _opens_json(scan) is not None:
            raise _Deferred
        scan.add_content(text, _MISTRAL_BOT)
        return
    scan.content.append(text[:bot])
    pos = skip_whitespace(text, bot + len(_MISTRAL_BOT))
    rest = text[pos: pos + len(_MISTRAL_ARGS)]
    if _MISTRAL_ARGS.startswith(rest) and len(rest) < len(_MISTRAL_ARGS):
        return
    if rest.startswith("[") and rest != _MISTRAL_ARGS:
        scan.sequence(pos + 1, ("arguments",), ",", "]")
        return
    pos = bot + len(_MISTRAL_BOT)
    while True:
        args = text.find(_MISTRAL_ARGS, pos)
        if args < 0:
            raise _Deferred  # a name not yet closed by [ARGS], or what parse decides at the end
        name = text[pos:args].strip()
        brace = skip_whitespace(text, args + len(_MISTRAL_ARGS))
        if brace >= len(text):
            return
        if name not in scan.tool_names or text[brace] != "{":
            raise _Deferred
        call = scan.arguments_at(brace, name)
        scan.calls.append(call)
        if call.end is None:
            return
        following = skip_whitespace(text, call.end)
        if not text.startswith(_MISTRAL_BOT, following):
            return
        pos = following + len(_MISTRAL_BOT)


_PYTHON_START = "<|python_start|>"


def read_pythonic(scan: _Scan, json_fallback: bool) -> None:
    """pythonic: the message is `[f(a=1), g()]` (optionally inside `<|python_start|>`)."""
    text = scan.text
    pos = skip_whitespace(text, 0)
    opened = text[pos: pos + len(_PYTHON_START)]
    if _PYTHON_START.startswith(opened) and len(opened) < len(_PYTHON_START) and not scan.is_final:
        raise _Deferred  # blank so far, or a partial <|python_start|>
    if opened == _PYTHON_START:
        pos = skip_whitespace(text, pos + len(_PYTHON_START))
    if pos < len(text) and text[pos] != "[" or pos >= len(text) and scan.is_final:
        if json_fallback and _opens_json(scan) is not None:
            raise _Deferred
        scan.content.append(text)
        return
    pos += 1
    while True:
        call = _python_call(scan, skip_whitespace(text, pos), is_first=not scan.calls)
        if call is None:
            return
        scan.calls.append(call)
        if call.end is None:
            return
        pos = skip_whitespace(text, call.end)
        if pos >= len(text) or text[pos] != ",":
            return
        pos += 1


def _python_call(scan: _Scan, pos: int, is_first: bool) -> _Call | None:
    """The call `name(k=literal, ...)` at `pos`, sent from its first argument (or `)`) on; None
    while undecided or if not a call (reading stops; the first call: _Deferred)."""
    text = scan.text
    end = pos
    while end < len(text) and (text[end].isalnum() or text[end] == "_"):
        end += 1
    name, pos = text[pos:end], skip_whitespace(text, end)
    if pos >= len(text):
        return None
    if text[pos] != "(" or name not in scan.tool_names:
        return _not_a_call(is_first)
    items: list[str] = []
    pos += 1
    while True:
        pos = skip_whitespace(text, pos)
        if pos >= len(text):
            break
        if text[pos] == ")":
            return _Call(name, "{" + ", ".join(items) + "}", pos + 1)
        argument = _python_argument(text, pos)
        if argument is None:
            break
        if isinstance(argument, str):
            return _not_a_call(is_first)
        items.append(argument[0])
        pos = argument[1]
    if not items:
        return None
    return _Call(name, "{" + ", ".join(items), None)


def _not_a_call(is_first: bool) -> None:
    if is_first:
        raise _Deferred
    return None


def _python_argument(text: str, pos: int) -> tuple[str, int] | str | None:
    """At `pos`, `key=literal` then `,` or before `)`: (`"key": <json>`, the position after);
    None while undecided; "other" if it is not one."""
    equals = text.find("=", pos)
    if equals < 0:
        return None
    key = text[pos:equals].strip()
    if not key.isidentifier():
        return "other"
    end = _literal_end(text, equals + 1)
    if end is None:
        return None
    try:
        value = ast.literal_eval(text[equals + 1: end].strip())
        encoded = json.dumps(value, ensure_ascii=False)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return "other"
    return f"{json.dumps(key)}: {encoded}", end + 1 if text[end] == "," else end


def _literal_end(text: str, pos: int) -> int | None:
    """The position of the `,` or `)` that ends the Python literal at `pos`, None if not yet."""
    depth = 0
    quote = ""
    i = pos
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return i if c == ")" else None
            depth -= 1
        elif c == "," and depth == 0:
            return i
        i += 1
    return None


_READERS = {
    "hermes": _blocks("<tool_call>", "</tool_call>"),
    "qwen25": _blocks("<tool_call>", "</tool_call>"),
    "llama3": read_llama3,
    "mistral": read_mistral,
    "pythonic": read_pythonic,
    "json": read_json,
}
