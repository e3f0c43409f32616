"""What the chat-shaped OpenAI routes share (`openai_api`'s /v1/chat/completions and
`responses_api`'s /v1/responses): the messages as the chat template takes them and the prompt
rendered from them (`prompt_messages`, `render_chat_prompt`), the grammars of `response_format`
and of a forced tool choice (`response_format_grammar`, `tool_choice_grammar`), a finished
output read back as reasoning, content and tool calls (`split_reasoning`, `split_calls`), and
usage counted from results (`usage_of`). Factored out of `openai_api` unchanged but for one rule:
a forced tool call wins over `response_format` (see `tool_choice_grammar`).
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.formats.reasoning import ReasoningFormat, separate_reasoning
from radixlm.formats.tool_calls import (
    Tool,
    ToolCall,
    add_tools_to_messages,
    render_history_calls,
    render_tool_response,
    template_tool_calls,
    template_tools,
    tool_call_schema,
)
from radixlm.formats.tool_formats import ToolCallReader
from radixlm.runtime.api.protocol import ChatMessage, ContentPart
from radixlm.runtime.api.request_io import RequestError
from radixlm.runtime.server.tokenizer_manager import TokenizerManager

GRAMMAR_KEYS = ("regex", "json_schema", "ebnf", "structural_tag")


def check_model(tm: TokenizerManager, name: str | None) -> None:
    """404 unless `name` is the served model (or unset, "default", or "unknown": what
    sglang-router sends when its client named no model)."""
    if name is not None and name not in (tm.model_name, "default", "unknown"):
        raise RequestError(f"model {name!r} is not served here; this server serves {tm.model_name!r}", 404)


def response_format_grammar(response_format: dict[str, Any] | None) -> dict[str, str]:
    """OpenAI `response_format` -> our grammar sampling params (`json_schema`, `regex` or
    `structural_tag`)."""
    if response_format is None:
        return {}
    if not isinstance(response_format, dict):
        raise RequestError(f"response_format must be an object with a 'type', got {response_format!r:.80}")
    kind = response_format.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_schema": json.dumps({"type": "object"})}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise RequestError("response_format.json_schema must be an object with a 'schema' object")
        return {"json_schema": json.dumps(spec.get("schema", {"type": "object"}))}
    if kind == "regex":
        if not isinstance(response_format.get("regex"), str):
            raise RequestError("response_format of type 'regex' needs a 'regex' string")
        return {"regex": response_format["regex"]}
    if kind == "structural_tag":  # SGLang's: {"type", "structures": [{begin, schema, end}], "triggers"}
        return {"structural_tag": json.dumps(response_format)}
    raise RequestError("response_format.type must be text, json_object, json_schema, regex or structural_tag, "
                       f"got {kind!r}")


def finish_of(meta: dict[str, Any]) -> str | None:
    """The finish reason's type of a result's meta info; None while it runs."""
    reason = meta.get("finish_reason")
    return None if reason is None else str(reason["type"])


def usage_of(results: list[dict[str, Any]], num_prompts: int) -> dict[str, Any]:
    """Chat-completions usage of finished results (`n` copies of each prompt count it once)."""
    metas = [r["meta_info"] for r in results]
    n = max(1, len(metas) // max(1, num_prompts))
    prompt = sum(m["prompt_tokens"] for m in metas[::n])
    completion = sum(m["completion_tokens"] for m in metas)
    cached = sum(m["cached_tokens"] for m in metas)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def split_reasoning(text: str, split: ReasoningFormat | None) -> tuple[str, str]:
    """(reasoning, answer) of a choice's whole text; without `split`, no reasoning."""
    return separate_reasoning(text, split) if split is not None else ("", text)


def prompt_messages(messages: list[ChatMessage], native_tools: bool) -> list[dict[str, Any]]:
    """Chat messages as the chat template takes them. Tool calls and results: for a template
    that renders tools (`native_tools`), the calls as objects and the results as `tool`
    messages; else both rendered as text in our prompt convention."""
    out: list[dict[str, Any]] = []
    for m in messages:
        content = content_text(m.content)
        if m.tool_calls is not None and not isinstance(m.tool_calls, list):
            raise RequestError(f"messages: tool_calls must be a list of calls, got {m.tool_calls!r:.80}")
        if native_tools:
            message: dict[str, Any] = {"role": m.role, "content": content}
            if m.role == "assistant" and m.tool_calls:
                message["tool_calls"] = template_tool_calls(m.tool_calls)
            out.append(message)
            continue
        if m.role == "assistant" and m.tool_calls:
            content = render_history_calls(content, m.tool_calls)
        elif m.role == "tool":
            content = render_tool_response(content)
        out.append({"role": m.role, "content": content})
    return out


def render_chat_prompt(tm: TokenizerManager, messages: list[dict[str, Any]], offered: list[Tool], native_tools: bool,
                       continue_final_message: bool = False,
                       template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt text of template-ready `messages` (`prompt_messages`) with the `offered`
    tools: given to a template that renders them (`native_tools`), else in our tools section.
    400 for messages longer than the context can hold or that the template rejects."""
    if offered and not native_tools:
        messages = add_tools_to_messages(messages, offered)
    num_chars = sum(len(m["content"]) for m in messages)
    if num_chars > tm.validator.max_prompt_chars:  # refused before the template renders it all
        raise RequestError(f"the messages hold {num_chars} characters, more than the context length "
                           f"({tm.context_len} tokens) can hold")
    try:
        return tm.tokenizer.apply_chat_template(
            messages, continue_final_message=continue_final_message, template_kwargs=template_kwargs,
            tools=template_tools(offered) if offered and native_tools else None)
    except Exception as e:  # a template that rejects these messages: the client's problem
        raise RequestError(f"messages: cannot apply the chat template: {e}") from e


def tool_choice_grammar(tool_choice: str | Tool, tools: list[Tool], params: dict[str, Any],
                        structures: dict[str, Any] | None, format_grammar: dict[str, str]) -> dict[str, str]:
    """The grammar params of a request whose other grammar params are `params` (SGLang's
    extensions) and whose `response_format` asks for `format_grammar`: for `required` or a
    named tool, the grammar that forces one call (the format is for a text answer, which a forced
    call rules out: dropped); for `auto` with `structures` and no other grammar, that structural
    tag (each opened call well formed); else `format_grammar` (the output is only parsed)."""
    constrained = any(k in params for k in GRAMMAR_KEYS)
    if tool_choice in ("none", "auto"):
        if tool_choice == "auto" and structures is not None and not constrained and not format_grammar:
            return {"structural_tag": json.dumps(structures)}
        return format_grammar
    if constrained:
        raise RequestError("tool_choice 'required' or a named function cannot be combined with "
                           "regex, json_schema, ebnf or structural_tag")
    forced = tools if tool_choice == "required" else [tool_choice]
    return {"json_schema": json.dumps(tool_call_schema([t for t in forced if isinstance(t, Tool)]))}


def split_calls(text: str, tool_names: set[str], reader: ToolCallReader,
                is_parallel: bool = True) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of one choice's text as `reader` reads it; without tools, the text as is.
    Not `is_parallel` (`parallel_tool_calls: false`): the first call only."""
    content, calls = reader.parse(text, tool_names) if tool_names else (text, [])
    return content, calls if is_parallel else calls[:1]


def content_text(content: str | list[ContentPart] | None) -> str:
    """A message's text (its parts joined; the contract admits text parts only)."""
    if content is None:
        return ""
    return content if isinstance(content, str) else "".join(part.text for part in content)
