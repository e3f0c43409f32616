"""Tools in programs: Python functions as OpenAI-style tool specs, and the calls a gen makes.

`gen("call", tools=[get_weather, {...openai tool dict...}], tool_choice=...)`:
- a Python function becomes `{"type": "function", "function": {name, description, parameters}}`:
  the description is the docstring's first paragraph, `parameters` a JSON schema from the
  signature and type hints (str/int/float/bool, list[X], dict, Literal[...], Optional[X],
  enums of str values); parameters without a default are required; a Google-style `Args:`
  section gives the parameters' descriptions;
- `tool_choice="required"` or a tool's name: the arguments are generated under the schema (the
  text becomes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the Hermes
  convention the server's chat API uses too), so the call always parses and validates;
- `tool_choice="auto"`: free generation, then parsed for such a block; if none is found (or it
  does not validate), the variable is the plain text.
`s[name]` is then a `ToolCall` (or the text), and `s.run_tool(name)` calls the Python function
and appends its result as a `tool` message.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixlm.formats.tool_calls import Tool, parse_tools, tool_call_schema, tools_system_prompt
from radixlm.typed import schema_problem, type_schema

__all__ = ["ToolCall", "ToolSet", "function_to_tool", "schema_problem", "tools_prompt"]


@dataclass
class ToolCall:
    """A tool call a gen produced: the function's name and its parsed arguments."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)

    def __str__(self) -> str:
        return self.to_json()


class ToolSet:
    """The tools of one gen: their specs (checked) and the Python functions behind them."""

    def __init__(self, tools: list[Any]):
        specs, self.functions = [], {}
        for tool in tools:
            if callable(tool) and not isinstance(tool, dict):
                spec = function_to_tool(tool)
                self.functions[spec["function"]["name"]] = tool
                specs.append(spec)
            else:
                specs.append(tool)
        self.specs: list[dict[str, Any]] = specs
        self.tools: list[Tool] = parse_tools(specs)

    @property
    def names(self) -> set[str]:
        return {t.name for t in self.tools}

    def choose(self, tool_choice: Any) -> str | list[Tool]:
        """"auto" / "none", or the tools a forced call may use ("required": all; a name: one)."""
        if tool_choice in ("auto", "none", None):
            return "auto" if tool_choice != "none" else "none"
        if tool_choice == "required":
            return self.tools
        name = tool_choice
        if isinstance(tool_choice, dict):
            name = (tool_choice.get("function") or {}).get("name")
        for tool in self.tools:
            if tool.name == name:
                return [tool]
        raise ValueError(f"tool_choice {tool_choice!r} names no tool among {sorted(self.names)}")

    def schema(self, tools: list[Tool]) -> dict[str, Any]:
        return tool_call_schema(tools)

    def validate(self, call: ToolCall) -> str | None:
        """None if `call` names a tool and its arguments satisfy its schema, else the problem."""
        tool = next((t for t in self.tools if t.name == call.name), None)
        if tool is None:
            return f"no tool named {call.name!r}"
        return schema_problem(call.arguments, tool.parameters)

    def run(self, call: ToolCall) -> Any:
        if call.name not in self.functions:
            raise ValueError(f"tool {call.name!r} is not a Python function here; run it yourself")
        return self.functions[call.name](**call.arguments)


def tools_prompt(tools: list[Any]) -> str:
    """A system-prompt section offering `tools` (functions or tool dicts) in the Hermes convention
    gen(tools=...) parses: add it with `s += system(tools_prompt([...]))` for tool_choice="auto"."""
    return tools_system_prompt(ToolSet(tools).tools)


def function_to_tool(fn: Callable[..., Any]) -> dict[str, Any]:
    """An OpenAI-style tool dict describing `fn` (see the module docstring)."""
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ValueError(f"a tool function needs a plain name, got {name!r}")
    doc = inspect.getdoc(fn) or ""
    description, arg_docs = _parse_docstring(doc)
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required = []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        schema = type_schema(hints.get(pname, str), f"tool {name}({pname})")
        if pname in arg_docs:
            schema["description"] = arg_docs[pname]
        properties[pname] = schema
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    function: dict[str, Any] = {"name": name, "parameters": parameters}
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    paragraphs = doc.split("\n\n")
    description = " ".join(paragraphs[0].split()) if paragraphs and not paragraphs[0].startswith("Args:") else ""
    args: dict[str, str] = {}
    match = re.search(r"^Args:\n((?:[ \t]+.*\n?)+)", doc, re.MULTILINE)
    if match:
        for line in match.group(1).splitlines():
            item = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.+)", line)
            if item:
                args[item.group(1)] = item.group(2).strip()
    return description, args
