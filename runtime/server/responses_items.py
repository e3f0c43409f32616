"""Responses API items <-> the chat machinery: input items (and `tools` / `tool_choice`, which
have their own flat shape here) validated one by one and turned into chat messages; a finished
output read back as output items; the conversation kept for `previous_response_id`; and the
follow-up's prompt tokens built on the stored turn's exact tokens (`continued_prompt_ids`).
"""

from __future__ import annotations

import uuid
from typing import Any

from radixlm.formats.tool_calls import ToolCall
from radixlm.runtime.api.protocol import ChatMessage, parse_body
from radixlm.runtime.api.protocol_responses import (
    INPUT_ITEM_MODELS,
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    MessageItem,
    TextConfig,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)
from radixlm.runtime.api.request_io import RequestError
from radixlm.runtime.server.chat_common import finish_of
from radixlm.runtime.server.response_store import TurnTokens
from radixlm.runtime.tokenizer.tokenizer import Tokenizer


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def parse_input(value: str | list[dict[str, Any]]) -> list[InputItem]:
    """`input` as typed items: a string is one user message; each listed item is validated by
    the model of its `type` (a message may leave `type` out), errors naming `input[i]...`."""
    if isinstance(value, str):
        return [MessageItem(role="user", content=value)]
    items: list[InputItem] = []
    for i, raw in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(raw, dict):
            raise RequestError(f"{where} must be an object (an input item), got {raw!r:.80}")
        kind = raw.get("type", "message" if "role" in raw else None)
        if kind is None:
            raise RequestError(f"{where}.type is required (or a 'role', for a message)")
        model = INPUT_ITEM_MODELS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise RequestError(f"{where}.type {kind!r:.60} is not supported here; the item types a text model "
                               f"takes are {', '.join(INPUT_ITEM_MODELS)}")
        items.append(parse_body(model, raw, prefix=where))
    return items


def items_to_messages(items: list[InputItem], history: tuple[ChatMessage, ...]) -> list[ChatMessage]:
    """The chat messages of `items`, after `history` (whose calls an output may answer): calls
    join the assistant message before them, outputs become `tool` messages, reasoning is left
    out (templates drop a past turn's reasoning). 400 for an output whose call_id no call has."""
    known_calls = {c["id"] for m in history for c in (m.tool_calls or []) if isinstance(c, dict)}
    out: list[ChatMessage] = []
    for i, item in enumerate(items):
        if isinstance(item, MessageItem):
            out.append(ChatMessage(role=item.role, content=_text(item.content)))
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            known_calls.add(item.call_id)
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                out[-1] = last.model_copy(update={"tool_calls": [*(last.tool_calls or []), call]})
            else:
                out.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in known_calls:
                raise RequestError(f"input[{i}].call_id: no function_call with call_id {item.call_id!r:.80} comes "
                                   "before this output (in this input or the previous response's conversation)")
            out.append(ChatMessage(role="tool", content=_text(item.output), tool_call_id=item.call_id))
    return out


def _text(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", None) or getattr(part, "refusal", "") for part in content)


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """`tools` (the Responses shape: flat function tools) in chat-completions' shape, for
    `parse_tools`; 400 naming `tools[i]` for a hosted tool (web_search, file_search, ...)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestError(f"tools must be a list of function tools, got {tools!r:.80}")
    out = []
    for i, raw in enumerate(tools):
        kind = raw.get("type") if isinstance(raw, dict) else None
        if isinstance(raw, dict) and kind != "function":
            raise RequestError(f"tools[{i}].type {kind!r:.60} is not supported here: this server runs "
                               "function tools only (type 'function')")
        tool: FunctionTool = parse_body(FunctionTool, raw, prefix=f"tools[{i}]")
        out.append({"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)})
    return out


def response_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The (chat-shaped, checked) tools as a response echoes them (flat)."""
    return [{"type": "function", "description": None, "parameters": None, "strict": None, **t["function"]}
            for t in tools or []]


def chat_tool_choice(choice: Any) -> Any:
    """`tool_choice` in chat-completions' shape, for `parse_tool_choice`."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        if set(choice) - {"type", "name"}:
            raise RequestError(f"tool_choice: unknown field(s) {sorted(set(choice) - {'type', 'name'})}")
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, dict) and choice.get("type") not in (None, "function"):
        raise RequestError(f"tool_choice.type {choice.get('type')!r:.60} is not supported here: "
                           "'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}")
    return choice


def format_of(text: TextConfig | None) -> dict[str, Any] | None:
    """`text.format` as chat-completions' `response_format` (None: plain text)."""
    fmt = text.format if text is not None else None
    if isinstance(fmt, TextFormatJsonSchema):
        return {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}}
    if isinstance(fmt, TextFormatJsonObject):
        return {"type": "json_object"}
    return None


def check_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    metadata = metadata or {}
    if len(metadata) > MAX_METADATA_PAIRS:
        raise RequestError(f"metadata holds at most {MAX_METADATA_PAIRS} pairs, got {len(metadata)}")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS:
            raise RequestError(f"metadata[{key[:40]!r}]: keys hold at most {MAX_METADATA_KEY_CHARS} characters and "
                               f"values at most {MAX_METADATA_VALUE_CHARS}")
    return metadata


def item_status(meta: dict[str, Any]) -> str:
    """The status of an output's items: incomplete when it ran out of tokens."""
    return "incomplete" if finish_of(meta) == "length" else "completed"


def output_items(thought: str, content: str | None, calls: list[ToolCall], status: str) -> list[dict[str, Any]]:
    """A finished output as items: its reasoning (if separated), its text as a message (also
    when empty, unless there are calls), then one function_call item per call."""
    items: list[dict[str, Any]] = []
    if thought:
        items.append(reasoning_item(new_id("rs"), thought))
    if content or not calls:
        items.append(message_item(new_id("msg"), content or "", status))
    items += [function_call_item(new_id("fc"), new_id("call"), call.name, call.arguments, "completed")
              for call in calls]
    return items


def reasoning_item(item_id: str, text: str | None) -> dict[str, Any]:
    """A reasoning item (`text` None: just opened, no content yet)."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant message item (`text` None: just opened, no content part yet)."""
    content = [] if text is None else [output_text_part(text)]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def output_messages(items: list[dict[str, Any]], output_text: str) -> list[ChatMessage]:
    """The output as the conversation continues it: one assistant message with its text and
    calls. Without calls its content is the raw `output_text`, the text the model wrote, so
    the next prompt renders it as it was generated (and reuses its cached tokens)."""
    calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
             for i in items if i["type"] == "function_call"]
    if not calls:
        return [ChatMessage(role="assistant", content=output_text)]
    text = "".join(i["content"][0]["text"] for i in items if i["type"] == "message" and i["content"])
    return [ChatMessage(role="assistant", content=text or None, tool_calls=calls)]


def continued_prompt_ids(tokenizer: Tokenizer, turn: TurnTokens, prompt: str) -> list[int] | None:
    """The tokens of `prompt` (a follow-up's whole prompt text) beginning with the stored turn's
    own tokens (prompt, then output, whose K/V the radix cache holds), when `prompt` begins
    with that turn's prompt and output text; None otherwise (tokenize `prompt` anew).

    The output's trailing special tokens (the EOS that ended it) are left to the rest of the
    prompt, which renders the end of the turn itself; the rest is tokenized without a BOS."""
    head = turn.prompt_text + turn.output_text
    if not prompt.startswith(head):
        return None
    output_ids = list(turn.output_ids)
    while output_ids and output_ids[-1] in tokenizer.all_special_ids:
        output_ids.pop()
    if tokenizer.decode(output_ids) != turn.output_text:
        return None
    return [*turn.prompt_ids, *output_ids, *tokenizer.encode(prompt[len(head):], add_special_tokens=False)]
