"""OpenAI tool calls: validate `tools`, render them into the chat prompt, constrain `tool_choice`,
and parse calls out of generated text. Pure functions, no I/O.

The prompt convention (the default model, SmolLM2, has no tool-aware chat template; this is the
Hermes/Qwen convention): a system-prompt section lists each function as one JSON line
`{"name", "description", "parameters"}` and tells the model to call one by answering with
`<tool_call>{"name": <name>, "arguments": {...}}</tool_call>` (one block per call). In the history,
an assistant message's `tool_calls` are rendered back as such blocks, and a `tool` message's
content is wrapped in `<tool_response>...</tool_response>`.

`tool_choice`:
- `"none"`: the tools are not offered; plain generation, nothing parsed;
- `"auto"` (the default when tools are given): free text, then `parse_tool_calls`; on the
  context-free grammar backends each `<tool_call>` block the model opens is constrained to one
  well-formed call (`tool_call_structures`, a structural tag); the outlines backend only parses;
- `"required"`: the output is constrained by `tool_call_schema(tools)`, an anyOf over
  `{"name": <const>, "arguments": <the tool's parameters>}` objects, so it parses as exactly one call;
- `{"type": "function", "function": {"name": X}}`: the same with tool X alone.

`parse_tool_calls` reads the formats `--tool-call-parser` names: `hermes` (also Qwen): blocks
`<tool_call>{json}</tool_call>` (one or more; the last may lack its closing tag); `json`: the whole
message is one call object or a list of them; `auto` (default): both. A block whose JSON does not parse or names
no offered tool stays plain content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any


class ToolSpecError(ValueError):
    """A `tools` / `tool_choice` value is malformed; the server answers 400 with this message."""


DEFAULT_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BLOCK_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_TOOL_KEYS = {"type", "function"}
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, serialized (as OpenAI sends it)


def parse_tools(tools: Any, allow_empty: bool = False) -> list[Tool]:
    """The request's `tools` list, checked; ToolSpecError naming the offending field. With
    `allow_empty` (the OpenAI API, which reads `tools: []` as no tools), `[]` gives `[]`."""
    if isinstance(tools, list) and not tools and allow_empty:
        return []
    if not isinstance(tools, list) or not tools:
        raise ToolSpecError("tools must be a non-empty list of {\"type\": \"function\", \"function\": {...}}")
    parsed: list[Tool] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ToolSpecError(f"{where} must be an object")
        _check_keys(tool, _TOOL_KEYS, where)
        if tool.get("type") != "function":
            raise ToolSpecError(f"{where}.type must be 'function', got {tool.get('type')!r}")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ToolSpecError(f"{where}.function must be an object")
        _check_keys(function, _FUNCTION_KEYS, f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise ToolSpecError(f"{where}.function.name is required: 1-64 letters, digits, '_' or '-', got {name!r}")
        if any(t.name == name for t in parsed):
            raise ToolSpecError(f"{where}.function.name {name!r} is used by two tools")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise ToolSpecError(f"{where}.function.description must be a string")
        parameters = function.get("parameters", DEFAULT_PARAMETERS)
        if not isinstance(parameters, dict):
            raise ToolSpecError(f"{where}.function.parameters must be a JSON schema object, got {type(parameters).__name__}")
        parsed.append(Tool(name, description, parameters or DEFAULT_PARAMETERS))
    return parsed


def _check_keys(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ToolSpecError(f"{where} has unknown field(s) {unknown}")


def parse_tool_choice(tool_choice: Any, tools: list[Tool]) -> str | Tool:
    """`"none"`, `"auto"`, `"required"`, or the named Tool; ToolSpecError if invalid for `tools`."""
    if tool_choice is None:
        return "auto" if tools else "none"
    if tool_choice in ("none", "auto", "required"):
        if tool_choice == "required" and not tools:
            raise ToolSpecError("tool_choice 'required' needs a non-empty tools list")
        return str(tool_choice) if tools else "none"  # "auto" with no tools offers none
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise ToolSpecError("tool_choice.function.name is required")
        for tool in tools:
            if tool.name == name:
                return tool
        raise ToolSpecError(f"tool_choice names function {name!r}, which is not among the tools")
    raise ToolSpecError(
        "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}"
    )


def tool_call_schema(tools: list[Tool]) -> dict[str, Any]:
    """A JSON schema whose instances are exactly the calls `{"name", "arguments"}` of `tools`."""
    options = [{
        "type": "object",
        "properties": {"name": {"const": t.name}, "arguments": t.parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for t in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_call_structures(tools: list[Tool]) -> dict[str, Any]:
    """The structural tag (`runtime.constrained.structural_tag`) under which each `<tool_call>`
    block the model opens is one well-formed call of `tools`: `{"name": ..., "arguments": ...}`
    as the prompt convention writes it, then `</tool_call>`."""
    return {
        "structures": [{
            "begin": f'<tool_call>{{"name": {json.dumps(t.name)}, "arguments": ',
            "schema": t.parameters,
            "end": "}</tool_call>",
        } for t in tools],
        "triggers": ["<tool_call>"],
    }


def tools_system_prompt(tools: list[Tool]) -> str:
    """The system-prompt section that offers `tools` (see the module docstring)."""
    lines = [json.dumps({"name": t.name, "description": t.description or "", "parameters": t.parameters},
                        ensure_ascii=False) for t in tools]
    return (
        "# Tools\n\nYou may call one or more functions to answer the user. The functions, one JSON object a line:\n"
        + "\n".join(lines)
        + "\n\nTo call a function, answer with one block per call, holding a JSON object with the function's name"
        " and arguments:\n<tool_call>{\"name\": <function name>, \"arguments\": <arguments object>}</tool_call>"
    )


def add_tools_to_messages(messages: list[dict[str, str]], tools: list[Tool]) -> list[dict[str, str]]:
    """`messages` with the tools section appended to the first system (or developer) message, or
    in a new system message first."""
    section = tools_system_prompt(tools)
    if messages and messages[0]["role"] in ("system", "developer"):
        first = messages[0]
        return [{"role": first["role"], "content": f"{first['content']}\n\n{section}"}, *messages[1:]]
    return [{"role": "system", "content": section}, *messages]


def render_history_calls(content: str, tool_calls: list[dict[str, Any]]) -> str:
    """An assistant message's `tool_calls` (OpenAI shape) as prompt text: `content` + blocks."""
    blocks = []
    for i, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ToolSpecError(f"messages: tool_calls[{i}].function.name is required")
        arguments: Any = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError as e:
            raise ToolSpecError(f"messages: tool_calls[{i}].function.arguments is not JSON: {e}") from e
        call_json = json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False)
        blocks.append(f"<tool_call>{call_json}</tool_call>")
    return "\n".join(([content] if content else []) + blocks)


def render_tool_response(content: str) -> str:
    return f"<tool_response>{content}</tool_response>"


TOOL_CALL_PARSERS = ("auto", "hermes", "json")


def parse_tool_calls(text: str, tool_names: set[str], parser: str = "auto") -> tuple[str | None, list[ToolCall]]:
    """(the text outside the calls, or None if blank; the calls found). `parser` (the server's
    --tool-call-parser): "hermes" (also Qwen) reads <tool_call> blocks only, "json" a bare JSON
    call or list only, "auto" both."""
    if parser not in TOOL_CALL_PARSERS:
        raise ValueError(f"unknown tool-call parser {parser!r}; choose one of {TOOL_CALL_PARSERS}")
    if "<tool_call>" in text and parser in ("auto", "hermes"):
        calls: list[ToolCall] = []
        outside: list[str] = []
        pos = 0
        for match in _BLOCK_RE.finditer(text):
            call = _call_from_json(match.group(1), tool_names)
            if call is None:
                continue  # left in place as content
            outside.append(text[pos : match.start()])
            calls.append(call)
            pos = match.end()
        if not calls:
            return text, []
        outside.append(text[pos:])
        content = "".join(outside).strip()
        return (content or None), calls
    stripped = text.strip()
    if parser in ("auto", "json") and stripped.startswith(("{", "[")):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            return text, []
        items = value if isinstance(value, list) else [value]
        bare = [_call_from_value(v, tool_names) for v in items]
        if items and all(c is not None for c in bare):
            return None, [c for c in bare if c is not None]
    return text, []


def _call_from_json(raw: str, tool_names: set[str]) -> ToolCall | None:
    try:
        return _call_from_value(json.loads(raw), tool_names)
    except json.JSONDecodeError:
        return None


def _call_from_value(value: Any, tool_names: set[str]) -> ToolCall | None:
    if not isinstance(value, dict) or value.get("name") not in tool_names:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models serialize the arguments themselves
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def openai_tool_calls(calls: list[ToolCall], with_index: bool = False) -> list[dict[str, Any]]:
    """`calls` in OpenAI's `message.tool_calls` shape (`delta.tool_calls` with `with_index`)."""
    out = []
    for i, call in enumerate(calls):
        entry: dict[str, Any] = {"index": i} if with_index else {}
        entry.update({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call.name, "arguments": call.arguments}})
        out.append(entry)
    return out
