"""OpenAI's Responses API for what a text model can do: POST /v1/responses, GET and DELETE
/v1/responses/{response_id}.

A request is read into chat messages (`responses_items`: input items, `instructions` as a first
system message, a stored conversation before them with `previous_response_id`) and run through
the chat machinery that /v1/chat/completions uses (`chat_common`: the chat template, tools and
their forced-call grammar, `text.format` as a `response_format` grammar, the reasoning split).
The output comes back as items (reasoning, message, function_call), with usage and, with
`stream`, as typed server-sent events (`responses_stream`).

With `store` (the default, as OpenAI's), the response is kept (`response_store`, bounded by
`--response-store-size`) with its conversation and its last turn's exact tokens: a follow-up
naming it as `previous_response_id` gets a prompt that begins with those tokens
(`continued_prompt_ids`), so the radix cache serves the whole previous turn and only the new turn
is prefilled; `usage.input_tokens_details.cached_tokens` shows it. `instructions` are per
request, as OpenAI's: a follow-up gives its own.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixlm.formats.reasoning import ReasoningFormat, reasoning_format
from radixlm.formats.tool_calls import parse_tool_choice, parse_tools
from radixlm.formats.tool_formats import ToolCallReader, detect_format, tool_call_reader
from radixlm.formats.tool_stream import ToolCallStream
from radixlm.runtime.api.protocol import (
    JSON,
    SSE,
    ChatMessage,
    ErrorResponse,
    OpenAPIDocs,
    Operation,
    SseEvents,
    error_responses,
    parse_body,
)
from radixlm.runtime.api.protocol_responses import (
    DeletedResponse,
    ResponseEvent,
    ResponseObject,
    ResponsesRequest,
)
from radixlm.runtime.api.request_io import GenerateRequest, PreparedRequest, RequestError
from radixlm.runtime.server.chat_common import (
    check_model,
    finish_of,
    prompt_messages,
    render_chat_prompt,
    response_format_grammar,
    split_calls,
    split_reasoning,
    tool_choice_grammar,
    usage_of,
)
from radixlm.runtime.server.http_common import prepare_all, read_json, run_all
from radixlm.runtime.server.response_store import ResponseStore, StoredResponse, TurnTokens
from radixlm.runtime.server.responses_items import (
    chat_tool_choice,
    chat_tools,
    check_metadata,
    continued_prompt_ids,
    format_of,
    item_status,
    items_to_messages,
    new_id,
    output_items,
    output_messages,
    parse_input,
    response_tools,
)
from radixlm.runtime.server.responses_stream import stream_response
from radixlm.runtime.server.tokenizer_manager import TokenizerManager

NOT_STORED = ("no stored response has this id: responses are kept when created with store true, at most "
              "--response-store-size of them (the least recently used is dropped first), until deleted")


@dataclass(frozen=True)
class Turn:
    """One /v1/responses request, prepared: what shaping its output and storing it need."""

    response_id: str
    created_at: int
    req: ResponsesRequest
    echo: dict[str, Any]  # the request's settings as the response object repeats them
    prompt: str
    prepared: PreparedRequest
    conversation: tuple[ChatMessage, ...]  # the stored history, then this request's input
    tool_names: frozenset[str]
    reader: ToolCallReader
    split: ReasoningFormat | None


def register_responses_routes(app: FastAPI, tm: TokenizerManager, tool_call_parser: str, docs: OpenAPIDocs,
                              secured: bool, reasoning_parser: str | None = None, store_size: int = 1000) -> None:
    auth = (401,) if secured else ()
    store = ResponseStore(store_size)
    reasoning = None if reasoning_parser is None else reasoning_format(reasoning_parser)
    template = tm.tokenizer.chat_template
    native_tools = detect_format(template) is not None  # the template renders tools in a format we read
    auto_reader, forced_reader = tool_call_reader(tool_call_parser, template), tool_call_reader("json")
    unknown = {404: ("no stored response has this id", {JSON: ErrorResponse})}
    docs.add("/v1/responses", "post", Operation(ResponsesRequest, {
        200: ("the response; with stream, typed server-sent events", {JSON: ResponseObject, SSE: SseEvents(ResponseEvent)}),
        **error_responses(400, 404, 413, 503, *auth)}))
    docs.add("/v1/responses/{response_id}", "get", Operation(None, {
        200: ("the stored response", {JSON: ResponseObject}), **unknown, **error_responses(*auth)}))
    docs.add("/v1/responses/{response_id}", "delete", Operation(None, {
        200: ("the response was deleted", {JSON: DeletedResponse}), **unknown, **error_responses(*auth)}))

    async def prepare(req: ResponsesRequest) -> Turn:
        check_model(tm, req.model)
        metadata = check_metadata(req.metadata)
        previous = None
        if req.previous_response_id is not None:
            previous = store.get(req.previous_response_id)
            if previous is None:
                raise RequestError(f"previous_response_id {req.previous_response_id!r:.80}: {NOT_STORED}", 404)
        history = previous.messages if previous is not None else ()
        conversation = (*history, *items_to_messages(parse_input(req.input), history))
        if not conversation:
            raise RequestError("input must hold at least one item")
        tools_spec = chat_tools(req.tools)
        tools = parse_tools(tools_spec, allow_empty=True) if tools_spec is not None else []
        tool_choice = parse_tool_choice(chat_tool_choice(req.tool_choice), tools)
        offered = tools if tool_choice != "none" else []
        reader = auto_reader if tool_choice == "auto" else forced_reader
        system = (ChatMessage(role="system", content=req.instructions),) if req.instructions else ()
        prompt = render_chat_prompt(tm, prompt_messages([*system, *conversation], native_tools), offered, native_tools)
        ids = None
        if previous is not None and previous.turn is not None:
            ids = continued_prompt_ids(tm.tokenizer, previous.turn, prompt)
        params: dict[str, Any] = {k: v for k, v in (("max_new_tokens", req.max_output_tokens),
                                                    ("temperature", req.temperature), ("top_p", req.top_p)) if v is not None}
        structures = (reader.structures(tools)
                      if tm.validator.grammar_backend != "outlines" and tool_choice == "auto" else None)
        params.update(tool_choice_grammar(tool_choice, tools, params, structures,
                                          response_format_grammar(format_of(req.text))))
        response_id = new_id("resp")
        generate = GenerateRequest(text=prompt if ids is None else None, input_ids=None if ids is None else tuple(ids),
                                   sampling_params=params, rid=response_id, stream=req.stream,
                                   require_reasoning=reasoning is not None)
        prepared = (await prepare_all(tm, [generate]))[0]
        echo = settings_echo(req, tm.model_name, response_tools(tools_spec), metadata)
        return Turn(response_id, int(time.time()), req, echo, prompt, prepared, conversation,
                    frozenset(t.name for t in offered), reader, reasoning)

    def finish(turn: Turn, result: dict[str, Any], items: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The response of a finished output (stored if asked): its `items` as streamed, or else
        read from the whole text."""
        thought, text = split_reasoning(result["text"], turn.split)
        status, error, incomplete = outcome(result["meta_info"])
        if items is None:
            content, calls = split_calls(text, set(turn.tool_names), turn.reader, turn.req.parallel_tool_calls)
            items = output_items(thought, content, calls, item_status(result["meta_info"]))
        body = response_body(turn, status, items, usage(result, thought), error, incomplete)
        keep(turn, body, items, result)
        return body

    def usage(result: dict[str, Any], thought: str) -> dict[str, Any]:
        counts = usage_of([result], 1)
        reasoning_tokens = len(tm.tokenizer.encode(thought, add_special_tokens=False)) if thought else 0
        return {
            "input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": counts["prompt_tokens_details"]["cached_tokens"],
                                     "cache_write_tokens": 0},
            "output_tokens": counts["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": counts["total_tokens"],
        }

    def keep(turn: Turn, body: dict[str, Any], items: list[dict[str, Any]], result: dict[str, Any]) -> None:
        if not turn.req.store:
            return
        tokens = None
        if body["status"] != "failed":
            tokens = TurnTokens(turn.prompt, array("i", turn.prepared.input_ids), array("i", result["output_ids"]),
                                result["text"])
        messages = (*turn.conversation, *output_messages(items, result["text"]))
        store.put(turn.response_id, StoredResponse(body, messages, tokens))

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        req: ResponsesRequest = parse_body(ResponsesRequest, await read_json(request))
        turn = await prepare(req)
        if req.stream:
            started = response_body(turn, "in_progress", [], None)
            calls = ToolCallStream(turn.reader, turn.tool_names) if turn.tool_names else None
            events = stream_response(tm, turn.prepared, turn.split, calls, turn.req.parallel_tool_calls,
                                     started, lambda result, items: finish(turn, result, items))
            return StreamingResponse(events, media_type="text/event-stream")
        result = (await run_all(tm, [turn.prepared], request))[0].result
        return JSONResponse(finish(turn, result))

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str) -> Response:
        stored = store.get(response_id)
        if stored is None:
            raise RequestError(f"response {response_id!r:.80}: {NOT_STORED}", 404)
        return JSONResponse(stored.body)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> Response:
        if not store.delete(response_id):
            raise RequestError(f"response {response_id!r:.80}: {NOT_STORED}", 404)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def settings_echo(req: ResponsesRequest, model: str, tools: list[dict[str, Any]],
                  metadata: dict[str, str]) -> dict[str, Any]:
    """The request's settings as the response object repeats them."""
    text_format = req.text.format if req.text is not None else None
    return {
        "model": model, "instructions": req.instructions, "tools": tools,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "parallel_tool_calls": req.parallel_tool_calls,
        "text": {"format": text_format.model_dump(by_alias=True, exclude_none=True)
                 if text_format is not None else {"type": "text"}},
        "max_output_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
        "metadata": metadata, "user": req.user, "store": req.store, "previous_response_id": req.previous_response_id,
    }


def outcome(meta: dict[str, Any]) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
    """(status, error, incomplete_details) of a finished output's meta info."""
    reason = finish_of(meta)
    if reason == "length":
        return "incomplete", None, {"reason": "max_output_tokens"}
    if reason == "abort":
        message = str((meta.get("finish_reason") or {}).get("message") or "the request was aborted")
        return "failed", {"code": "server_error", "message": message}, None
    return "completed", None, None


def response_body(turn: Turn, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
                  error: dict[str, Any] | None = None, incomplete: dict[str, Any] | None = None) -> dict[str, Any]:
    """The response object (`ResponseObject`) of `turn` in a given state."""
    return {"id": turn.response_id, "object": "response", "created_at": turn.created_at, "status": status,
            "output": output, **turn.echo, "usage": usage, "error": error,
            "incomplete_details": incomplete}
