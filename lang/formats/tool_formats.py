"""How model families write tool calls: one parser per format, named as SGLang's
`--tool-call-parser` names them, the structural tag that keeps a call the model opens well
formed under `tool_choice: "auto"`, and the format a chat template asks for.

  hermes    <tool_call>{"name": "f", "arguments": {...}}</tool_call>, one block per call: the
            convention our own tools prompt teaches (tool_calls.tools_system_prompt)
  qwen25    the same blocks with the JSON on its own line (Qwen2.5 / Qwen3 / SmolLM3 templates)
  llama3    {"name": "f", "parameters": {...}}, optionally after `<|python_tag|>`, several
            calls separated by `;` (Llama 3.1-3.3 JSON tool calling)
  mistral   [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...], or the newer
            [TOOL_CALLS]f[ARGS]{...} per call
  pythonic  [f(a=1, b="x"), g()]: Python call syntax with literal arguments (Llama 3.2 / 4)
  json      the whole message is one call object `{"name", "arguments"}` or a list of them

Every parser returns (the text outside the calls, or None if blank; the calls). A call that does
not parse, or names a tool that was not offered, stays in the content. `auto` is the format the
server's chat template asks for (`detect_format`), then a bare JSON message as a fallback; with
no template that renders tools, our own prompt's `hermes`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixlm.formats.tool_calls import Tool, ToolCall

ParseResult = tuple[str | None, list[ToolCall]]


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    parse: Callable[[str, set[str]], ParseResult]
    # the structural tag ({"structures", "triggers"}) for `auto`; None: the format is only parsed
    structures: Callable[[list[Tool]], dict[str, Any] | None]


# ---------------------------------------------------------------- the JSON call objects


def call_from_value(value: Any, tool_names: set[str], arguments_key: str = "arguments") -> ToolCall | None:
    """The call a decoded JSON object stands for, if it names an offered tool and its arguments
    (under `arguments_key`, or a JSON string of them) are an object."""
    if not isinstance(value, dict) or value.get("name") not in tool_names:
        return None
    arguments = value.get(arguments_key, {})
    if isinstance(arguments, str):  # some models serialize the arguments themselves
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _calls_of_json(raw: str, tool_names: set[str], arguments_key: str = "arguments") -> list[ToolCall] | None:
    """The calls of a JSON text holding one call object or a list of them; None unless all are calls."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [call_from_value(v, tool_names, arguments_key) for v in items]
    if not items or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _content(parts: list[str]) -> str | None:
    """The text outside the calls of a message that has some: trailing whitespace dropped,
    None if blank (leading whitespace is kept: a stream sends it before any call is seen)."""
    text = "".join(parts).rstrip()
    return text or None


# ---------------------------------------------------------------- the formats


_BLOCK_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def parse_blocks(text: str, tool_names: set[str]) -> ParseResult:
    """hermes / qwen25: `<tool_call>` blocks (the last may lack its closing tag)."""
    calls: list[ToolCall] = []
    outside: list[str] = []
    pos = 0
    for match in _BLOCK_RE.finditer(text):
        call = call_from_value(_loads(match.group(1)), tool_names)
        if call is None:
            continue  # left in place as content
        outside.append(text[pos : match.start()])
        calls.append(call)
        pos = match.end()
    if not calls:
        return text, []
    outside.append(text[pos:])
    return _content(outside), calls


def parse_json(text: str, tool_names: set[str]) -> ParseResult:
    """json: the whole message is a call object or a list of them."""
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        calls = _calls_of_json(stripped, tool_names)
        if calls:
            return None, calls
    return text, []


_PYTHON_TAG = "<|python_tag|>"


def parse_llama3(text: str, tool_names: set[str]) -> ParseResult:
    """llama3: the message (after any content before `<|python_tag|>`) is one or more
    `{"name", "parameters"}` objects separated by `;` (`arguments` is read too)."""
    before, tag, rest = text.partition(_PYTHON_TAG)
    body = rest if tag else text
    calls: list[ToolCall] = []
    decoder = json.JSONDecoder()
    pos = 0
    while True:
        while pos < len(body) and body[pos] in " \t\r\n;":
            pos += 1
        if pos == len(body):
            break
        try:
            value, pos = decoder.raw_decode(body, pos)
        except json.JSONDecodeError:
            return text, []
        key = "parameters" if isinstance(value, dict) and "parameters" in value else "arguments"
        call = call_from_value(value, tool_names, key)
        if call is None:
            return text, []
        calls.append(call)
    if not calls:
        return text, []
    return (_content([before]) if tag else None), calls


_MISTRAL_BOT = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"


def parse_mistral(text: str, tool_names: set[str]) -> ParseResult:
    """mistral: `[TOOL_CALLS]` then a JSON list of calls, or (newer tokenizers) each call as
    `[TOOL_CALLS]name[ARGS]{arguments}`."""
    if _MISTRAL_BOT not in text:
        return text, []
    content, _, rest = text.partition(_MISTRAL_BOT)
    calls: list[ToolCall] = []
    if _MISTRAL_ARGS in rest:
        for part in rest.split(_MISTRAL_BOT):
            name, args, arguments = part.partition(_MISTRAL_ARGS)
            call = call_from_value({"name": name.strip(), "arguments": _loads(arguments)}, tool_names) if args else None
            if call is None:
                return text, []
            calls.append(call)
    else:
        found = _calls_of_json(rest.strip(), tool_names)
        if not found:
            return text, []
        calls = found
    return _content([content]), calls


def parse_pythonic(text: str, tool_names: set[str]) -> ParseResult:
    """pythonic: the message is a list of calls `[f(a=1), g(b="x")]` whose keyword arguments are
    Python literals (`<|python_start|>` / `<|python_end|>` around it are dropped)."""
    stripped = text.replace("<|python_start|>", "").replace("<|python_end|>", "").strip()
    if not (stripped.startswith("[") and stripped.endswith("]")):
        return text, []
    try:
        tree = ast.parse(stripped, mode="eval").body
    except SyntaxError:
        return text, []
    if not isinstance(tree, ast.List) or not tree.elts:
        return text, []
    calls: list[ToolCall] = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
                and node.func.id in tool_names and all(k.arg is not None for k in node.keywords)):
            return text, []
        try:
            arguments = {str(k.arg): ast.literal_eval(k.value) for k in node.keywords}
            calls.append(ToolCall(node.func.id, json.dumps(arguments, ensure_ascii=False)))
        except (ValueError, TypeError, SyntaxError, RecursionError):  # not a literal, or not JSON-serializable
            return text, []
    return None, calls


def _loads(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return None


# ---------------------------------------------------------------- structural tags


def _structures(begin: Callable[[str], str], end: str, triggers: list[str]) -> Callable[[list[Tool]], dict[str, Any]]:
    """Each call of `tools` opened as `begin(name)`, its arguments under the tool's schema, then `end`."""
    def build(tools: list[Tool]) -> dict[str, Any]:
        return {"structures": [{"begin": begin(t.name), "schema": t.parameters, "end": end} for t in tools],
                "triggers": triggers}
    return build


def _json_name(name: str) -> str:
    return json.dumps(name)


FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (
    ToolCallFormat("hermes", parse_blocks, _structures(
        lambda n: f'<tool_call>{{"name": {_json_name(n)}, "arguments": ', "}</tool_call>", ["<tool_call>"])),
    ToolCallFormat("qwen25", parse_blocks, _structures(
        lambda n: f'<tool_call>\n{{"name": {_json_name(n)}, "arguments": ', "}\n</tool_call>", ["<tool_call>"])),
    ToolCallFormat("llama3", parse_llama3, _structures(
        lambda n: f'{{"name": {_json_name(n)}, "parameters": ', "}", ['{"name":'])),
    ToolCallFormat("mistral", parse_mistral, _structures(
        lambda n: f'[TOOL_CALLS] [{{"name": {_json_name(n)}, "arguments": ', "}]", [_MISTRAL_BOT])),
    ToolCallFormat("pythonic", parse_pythonic, lambda tools: None),
    ToolCallFormat("json", parse_json, lambda tools: None),
)}
TOOL_CALL_PARSERS = ("auto", *FORMATS)


def detect_format(template: str | None) -> str | None:
    """The format a chat template's text teaches its model, if it renders tools in one we read:
    its call markers, or the wording of its instructions; None otherwise."""
    if not template or "tools" not in template:
        return None
    if "func_name1(" in template or "[func_name(" in template:  # pythonic instructions (Llama 3.2 / 4)
        return "pythonic"
    if _MISTRAL_BOT in template:
        return "mistral"
    if "<tool_call>" in template:
        return "qwen25"
    if _PYTHON_TAG in template or ('"parameters"' in template and "<|start_header_id|>" in template):
        return "llama3"
    return None


def resolve_parser(parser: str, template: str | None) -> str:
    """The format `--tool-call-parser parser` reads with this chat template: `auto` is the
    template's own (detect_format), else our prompt's hermes."""
    if parser not in TOOL_CALL_PARSERS:
        raise ValueError(f"unknown tool-call parser {parser!r}; choose one of {TOOL_CALL_PARSERS}")
    if parser != "auto":
        return parser
    return detect_format(template) or "hermes"


@dataclass(frozen=True)
class ToolCallReader:
    """How one server reads calls: a format, resolved once (`tool_call_reader`), and whether a
    bare JSON message is read when the format finds none (`auto`)."""

    format: ToolCallFormat
    json_fallback: bool

    def parse(self, text: str, tool_names: set[str]) -> ParseResult:
        content, calls = self.format.parse(text, tool_names)
        if not calls and self.json_fallback:
            return parse_json(text, tool_names)
        return content, calls

    def structures(self, tools: list[Tool]) -> dict[str, Any] | None:
        """The structural tag under which each call of `tools` the model opens is well formed;
        None for the formats that are only parsed (pythonic, json)."""
        return self.format.structures(tools)


def tool_call_reader(parser: str = "auto", template: str | None = None) -> ToolCallReader:
    return ToolCallReader(FORMATS[resolve_parser(parser, template)], json_fallback=parser == "auto")


def parse_tool_calls(text: str, tool_names: set[str], parser: str = "auto", template: str | None = None) -> ParseResult:
    """(the text outside the calls, or None if blank; the calls found) in `parser`'s format
    (`auto`: the template's format, then a bare JSON message)."""
    return tool_call_reader(parser, template).parse(text, tool_names)


def tool_call_structures(tools: list[Tool], parser: str = "hermes", template: str | None = None) -> dict[str, Any] | None:
    """`tool_call_reader(parser, template).structures(tools)`."""
    return tool_call_reader(parser, template).structures(tools)
