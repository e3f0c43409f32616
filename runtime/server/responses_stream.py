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

The reasoning and the text stream as they are generated (`ReasoningStream`: no marker cut
across deltas). With tools offered the text goes through a `ToolCallStream`: its content deltas
go to a message item, and each call is an item opened once its name is read, its arguments then
sent in fragments as they are generated (nothing sent is taken back: see lang/formats/tool_stream).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from radixlm.formats.reasoning import ReasoningFormat, ReasoningStream
from radixlm.formats.tool_stream import ToolCallDelta, ToolCallStream
from radixlm.runtime.api.request_io import PreparedRequest, RequestError
from radixlm.runtime.server.http_common import merged_outputs, sse
from radixlm.runtime.server.responses_items import (
    function_call_item,
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
    """An item being streamed: its id, place and text so far (a call's: its arguments)."""

    def __init__(self, kind: str, output_index: int, call: ToolCallDelta | None = None):
        self.kind = kind  # reasoning, message or function_call
        self.item_id = new_id({"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind])
        self.output_index = output_index
        self.text = ""
        self.call_id = call.id if call is not None and call.id is not None else new_id("call")
        self.name = call.name if call is not None and call.name is not None else ""

    def item(self, status: str) -> dict[str, Any]:
        """The item as it stands (`status` for a message)."""
        if self.kind == "reasoning":
            return reasoning_item(self.item_id, self.text)
        if self.kind == "message":
            return message_item(self.item_id, self.text, status)
        return function_call_item(self.item_id, self.call_id, self.name, self.text, "completed")


def open_item_events(ev: Events, item: _OpenItem) -> Iterator[bytes]:
    where = {"output_index": item.output_index}
    if item.kind == "reasoning":
        yield ev("response.output_item.added", item=reasoning_item(item.item_id, None), **where)
        return
    if item.kind == "function_call":
        added = function_call_item(item.item_id, item.call_id, item.name, "", "in_progress")
        yield ev("response.output_item.added", item=added, **where)
        return
    yield ev("response.output_item.added", item=message_item(item.item_id, None, "in_progress"), **where)
    yield ev("response.content_part.added", item_id=item.item_id, content_index=0, part=output_text_part(""), **where)


def delta_event(ev: Events, item: _OpenItem, delta: str) -> bytes:
    item.text += delta
    if item.kind == "function_call":
        return ev("response.function_call_arguments.delta", item_id=item.item_id, output_index=item.output_index,
                  delta=delta)
    kind = "response.reasoning_text.delta" if item.kind == "reasoning" else "response.output_text.delta"
    extra: dict[str, Any] = {} if item.kind == "reasoning" else {"logprobs": []}
    return ev(kind, item_id=item.item_id, output_index=item.output_index, content_index=0, delta=delta, **extra)


def close_item_events(ev: Events, item: _OpenItem, status: str) -> Iterator[bytes]:
    if item.kind == "function_call":
        yield ev("response.function_call_arguments.done", item_id=item.item_id, output_index=item.output_index,
                 name=item.name, arguments=item.text)
        yield ev("response.output_item.done", item=item.item(status), output_index=item.output_index)
        return
    where = {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0}
    if item.kind == "reasoning":
        yield ev("response.reasoning_text.done", text=item.text, **where)
    else:
        yield ev("response.output_text.done", text=item.text, logprobs=[], **where)
        yield ev("response.content_part.done", part=output_text_part(item.text), **where)
    yield ev("response.output_item.done", item=item.item(status), output_index=item.output_index)


class _Output:
    """The items of one streamed output, opened in order; the last one is open."""

    def __init__(self, ev: Events):
        self.ev = ev
        self.items: list[_OpenItem] = []

    def text(self, kind: str, delta: str) -> Iterator[bytes]:
        """`delta` of reasoning or message text, into the open item of that kind or a new one."""
        if not delta:
            return
        if not self.items or self.items[-1].kind != kind:
            yield from self.open(_OpenItem(kind, len(self.items)))
        yield delta_event(self.ev, self.items[-1], delta)

    def call(self, delta: ToolCallDelta) -> Iterator[bytes]:
        """A call's first delta opens its item; later ones are fragments of its arguments."""
        if delta.name is not None:
            yield from self.open(_OpenItem("function_call", len(self.items), delta))
        if delta.arguments:
            yield delta_event(self.ev, self.items[-1], delta.arguments)

    def open(self, item: _OpenItem) -> Iterator[bytes]:
        if self.items:
            yield from close_item_events(self.ev, self.items[-1], "completed")
        self.items.append(item)
        yield from open_item_events(self.ev, item)

    def close(self, status: str) -> Iterator[bytes]:
        """The end: a message (empty) if there is neither text nor a call, as without streaming;
        the open item closed with `status`."""
        if not any(i.kind != "reasoning" for i in self.items):
            yield from self.open(_OpenItem("message", len(self.items)))
        yield from close_item_events(self.ev, self.items[-1], status)

    def final_items(self, status: str) -> list[dict[str, Any]]:
        return [item.item(status) for item in self.items]


async def stream_response(tm: TokenizerManager, prepared: PreparedRequest, split: ReasoningFormat | None,
                          calls: ToolCallStream | None, parallel_calls: bool, started: dict[str, Any],
                          finish: Finish) -> AsyncIterator[bytes]:
    """The events of one response: `started` is its object in progress; `finish` shapes (and
    stores) the final one. `calls` (tools offered): the output is read for calls as it comes;
    without `parallel_calls` only the first call is kept."""
    ev = Events()
    yield ev("response.created", response=started)
    yield ev("response.in_progress", response=started)
    splitter = ReasoningStream(split) if split is not None else None
    out = _Output(ev)
    async for _, chunk in merged_outputs(tm, [prepared]):
        if isinstance(chunk, Exception):
            code = 503 if isinstance(chunk, ServiceUnavailable) else 400
            error = {"code": "server_error" if code == 503 else "invalid_request", "message": str(chunk)}
            yield ev("error", code=error["code"], message=str(chunk), param=None)
            yield ev("response.failed", response={**started, "status": "failed", "error": error})
            return
        is_last = chunk.meta_info.get("finish_reason") is not None
        pieces = chunk.new_pieces or ("",)  # as the deltas came (see OutputChunk.new_pieces)
        for k, piece in enumerate(pieces):
            for event in _piece_events(out, piece, is_last and k == len(pieces) - 1, splitter, calls,
                                       parallel_calls):
                yield event
        if not is_last:
            continue
        status = item_status(chunk.result["meta_info"])
        for event in out.close(status):
            yield event
        body = finish(chunk.result, out.final_items(status))
        yield ev(FINAL_EVENTS[body["status"]], response=body)
        return
    raise RequestError("the output ended without a final result")  # merged_outputs always ends with one


def _piece_events(out: _Output, piece: str, is_last: bool, splitter: ReasoningStream | None,
                  calls: ToolCallStream | None, parallel_calls: bool) -> Iterator[bytes]:
    """The events of one delta's text: reasoning, message text, function-call items and their
    argument fragments; `is_last`: the output's last delta (the splitter and the call reader
    give up what they held back)."""
    thought, text = splitter.feed(piece) if splitter is not None else ("", piece)
    if is_last and splitter is not None:
        rest_thought, rest_text = splitter.finish()
        thought, text = thought + rest_thought, text + rest_text
    yield from out.text("reasoning", thought)
    if calls is None:
        yield from out.text("message", text)
        return
    for delta in calls.feed(text) + (calls.finish() if is_last else []):
        if delta.index < 0:
            yield from out.text("message", delta.content)
        elif delta.index == 0 or parallel_calls:
            yield from out.call(delta)
