"""The server-sent events of a streamed /v1/responses request, as OpenAI sends them and the
`openai` client's `responses.stream()` accumulates them: each event `event: <type>` with
`data: {"type", "sequence_number", ...}`, numbered from 0.

    response.created, response.in_progress
    per output item: response.output_item.added, then
      reasoning:      response.reasoning_text.delta ... response.reasoning_text.done
      message:        response.content_part.added, response.output_text.delta ...,
                      response.output_text.done, response.content_part.done
      function_call:  response.function_call_arguments.delta ..., response.function_call_arguments.done
    then response.output_item.done
    response.completed (or response.incomplete at max_output_tokens, response.failed)

Without tools the reasoning and the text stream as they are generated (`ReasoningStream`: no
marker cut across deltas). With tools offered the text is held to its end, where it is read as
content and calls, and each item is sent whole. A call's arguments go out in
`call_argument_events`, the one place that decides how they are cut into deltas.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from radixlm.formats.reasoning import ReasoningFormat, ReasoningStream
from radixlm.runtime.api.request_io import PreparedRequest, RequestError
from radixlm.runtime.server.http_common import merged_outputs, sse
from radixlm.runtime.server.responses_items import (
    item_status,
    message_item,
    new_id,
    output_text_part,
    reasoning_item,
)
from radixlm.runtime.server.tokenizer_manager import ServiceUnavailable, TokenizerManager

# (the final result, the items as streamed or None to read them from the text) -> the final response
Finish = Callable[[dict[str, Any], "list[dict[str, Any]] | None"], dict[str, Any]]
FINAL_EVENTS = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


class Events:
    """Numbers the events of one stream."""

    def __init__(self) -> None:
        self.num_sent = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.num_sent, **fields}
        self.num_sent += 1
        return b"event: " + kind.encode() + b"\n" + sse(payload)


class _OpenItem:
    """An item being streamed: its id, place and text so far."""

    def __init__(self, kind: str, output_index: int):
        self.kind = kind
        self.item_id = new_id("rs" if kind == "reasoning" else "msg")
        self.output_index = output_index
        self.text = ""


def open_item_events(ev: Events, item: _OpenItem) -> Iterator[bytes]:
    where = {"output_index": item.output_index}
    if item.kind == "reasoning":
        yield ev("response.output_item.added", item=reasoning_item(item.item_id, None), **where)
        return
    yield ev("response.output_item.added", item=message_item(item.item_id, None, "in_progress"), **where)
    yield ev("response.content_part.added", item_id=item.item_id, content_index=0, part=output_text_part(""), **where)


def delta_event(ev: Events, item: _OpenItem, delta: str) -> bytes:
    item.text += delta
    kind = "response.reasoning_text.delta" if item.kind == "reasoning" else "response.output_text.delta"
    extra: dict[str, Any] = {} if item.kind == "reasoning" else {"logprobs": []}
    return ev(kind, item_id=item.item_id, output_index=item.output_index, content_index=0, delta=delta, **extra)


def close_item_events(ev: Events, item: _OpenItem, status: str) -> Iterator[bytes]:
    where = {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0}
    if item.kind == "reasoning":
        yield ev("response.reasoning_text.done", text=item.text, **where)
        yield ev("response.output_item.done", item=reasoning_item(item.item_id, item.text),
                 output_index=item.output_index)
        return
    yield ev("response.output_text.done", text=item.text, logprobs=[], **where)
    yield ev("response.content_part.done", part=output_text_part(item.text), **where)
    yield ev("response.output_item.done", item=message_item(item.item_id, item.text, status),
             output_index=item.output_index)


def whole_item_events(ev: Events, item: dict[str, Any], output_index: int) -> Iterator[bytes]:
    """The events of an item known whole (an output read at its end)."""
    if item["type"] == "function_call":
        yield ev("response.output_item.added", item={**item, "arguments": "", "status": "in_progress"},
                 output_index=output_index)
        yield from call_argument_events(ev, item, output_index)
        yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=output_index,
                 name=item["name"], arguments=item["arguments"])
        yield ev("response.output_item.done", item=item, output_index=output_index)
        return
    is_message = item["type"] == "message"
    opened = _OpenItem("message" if is_message else "reasoning", output_index)
    opened.item_id = item["id"]
    yield from open_item_events(ev, opened)
    text = item["content"][0]["text"] if item["content"] else ""
    if text:
        yield delta_event(ev, opened, text)
    yield from close_item_events(ev, opened, item.get("status", "completed"))


def call_argument_events(ev: Events, item: dict[str, Any], output_index: int) -> Iterator[bytes]:
    """A finished call's arguments as `response.function_call_arguments.delta` events: one, the
    whole arguments (the call is read when the output ends). An incremental tool-call reader
    would send its fragments here instead."""
    yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=output_index,
             delta=item["arguments"])


async def stream_response(tm: TokenizerManager, prepared: PreparedRequest, split: ReasoningFormat | None,
                          is_buffered: bool, started: dict[str, Any], finish: Finish) -> AsyncIterator[bytes]:
    """The events of one response: `started` is its object in progress; `finish` shapes (and
    stores) the final one. `is_buffered` (tools offered): items are sent whole at the end."""
    ev = Events()
    yield ev("response.created", response=started)
    yield ev("response.in_progress", response=started)
    splitter = ReasoningStream(split) if split is not None and not is_buffered else None
    items: list[_OpenItem] = []
    async for _, chunk in merged_outputs(tm, [prepared]):
        if isinstance(chunk, Exception):
            code = 503 if isinstance(chunk, ServiceUnavailable) else 400
            error = {"code": "server_error" if code == 503 else "invalid_request", "message": str(chunk)}
            yield ev("error", code=error["code"], message=str(chunk), param=None)
            yield ev("response.failed", response={**started, "status": "failed", "error": error})
            return
        is_last = chunk.meta_info.get("finish_reason") is not None
        if not is_buffered:
            thought, text = splitter.feed(chunk.new_text) if splitter is not None else ("", chunk.new_text)
            if is_last and splitter is not None:
                rest_thought, rest_text = splitter.finish()
                thought, text = thought + rest_thought, text + rest_text
            for kind, delta in (("reasoning", thought), ("message", text)):
                if not delta:
                    continue
                if not items or items[-1].kind != kind:
                    for event in _switch_item(ev, items, kind):
                        yield event
                yield delta_event(ev, items[-1], delta)
        if not is_last:
            continue
        result = chunk.result
        if is_buffered:
            body = finish(result, None)
            for index, item in enumerate(body["output"]):
                for event in whole_item_events(ev, item, index):
                    yield event
        else:
            status = item_status(result["meta_info"])
            if not items or items[-1].kind != "message":  # no text: an empty message, as without streaming
                for event in _switch_item(ev, items, "message"):
                    yield event
            for event in close_item_events(ev, items[-1], status):
                yield event
            body = finish(result, [reasoning_item(i.item_id, i.text) if i.kind == "reasoning"
                                   else message_item(i.item_id, i.text, status) for i in items])
        yield ev(FINAL_EVENTS[body["status"]], response=body)
        return
    raise RequestError("the output ended without a final result")  # merged_outputs always ends with one


def _switch_item(ev: Events, items: list[_OpenItem], kind: str) -> Iterator[bytes]:
    """Close the open reasoning item (if any) and open a new item of `kind`."""
    if items:
        yield from close_item_events(ev, items[-1], "completed")
    items.append(_OpenItem(kind, len(items)))
    yield from open_item_events(ev, items[-1])
