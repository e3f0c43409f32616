"""OpenAI tool calls: validate `tools`, render them into the chat prompt and constrain
`tool_choice` (the formats calls are read back from: tool_formats.py). Pure functions, no I/O.

The prompt convention (the default model, SmolLM2, has no tool-aware chat template; this is the
Hermes/Qwen convention): a system-prompt section lists each function as one JSON line
`{"name", "description", "parameters"}` and tells the model to call one by answering with
`<tool_call>{"name": <name>, "arguments": {...}}</tool_call>` (one block per call). In the history,
an assistant message's `tool_calls` are rendered back as such blocks, and a `tool` message's
content is wrapped in `<tool_response>...</tool_response>`.

`tool_choice`:
- `"none"`: the tools are not offered; plain generation, nothing parsed;
- `"auto"` (the default when tools are given): free text, then parsed in the format of the
  server's `--tool-call-parser` (tool_formats.py); on the context-free grammar backends each call
  the model opens is constrained to be well formed (a structural tag); the outlines backend only parses;
- `"required"`: the output is constrained by `tool_call_schema(tools)`, an anyOf over
  `{"name": <const>, "arguments": <the tool's parameters>}` objects, so it parses as exactly one call;
- `{"type": "function", "function": {"name": X}}`: the same with tool X alone.

A chat template that renders tools itself (Qwen2.5, Llama 3.1, Mistral, ...) is given them
instead (`native_messages`), and its model's calls are read in its own format.
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
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ToolSpecError(f"{where}.function.strict must be true, false or null, got {type(strict).__name__}")
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
    for call in template_tool_calls(tool_calls):
        call_json = json.dumps({"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
                               ensure_ascii=False)
        blocks.append(f"<tool_call>{call_json}</tool_call>")
    return "\n".join(([content] if content else []) + blocks)


def render_tool_response(content: str) -> str:
    return f"<tool_response>{content}</tool_response>"


def template_tools(tools: list[Tool]) -> list[dict[str, Any]]:
    """`tools` as a chat template that renders tools takes them (OpenAI's shape)."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.parameters}} for t in tools]


def template_tool_calls(tool_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` (OpenAI shape) as such templates take them: the
    arguments decoded into an object (templates write them with `tojson`)."""
    calls = []
    for i, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ToolSpecError(f"messages: tool_calls[{i}].function.name is required")
        arguments: Any = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError as e:
            raise ToolSpecError(f"messages: tool_calls[{i}].function.arguments is not JSON: {e}") from e
        calls.append({"id": str(call.get("id") or f"call{i}"), "type": "function",
                      "function": {"name": function["name"], "arguments": arguments}})
    return calls


def openai_tool_calls(calls: list[ToolCall], with_index: bool = False) -> list[dict[str, Any]]:
    """`calls` in OpenAI's `message.tool_calls` shape (`delta.tool_calls` with `with_index`)."""
    out = []
    for i, call in enumerate(calls):
        entry: dict[str, Any] = {"index": i} if with_index else {}
        entry.update({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call.name, "arguments": call.arguments}})
        out.append(entry)
    return out
