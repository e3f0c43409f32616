"""The OpenAI-compatible API: GET /v1/models, POST /v1/completions, POST /v1/chat/completions.

Requests are validated by pydantic models that forbid unknown fields (400 naming the field),
mapped onto our sampling parameters (plus SGLang's extensions: top_k, min_p,
repetition_penalty, min_tokens, ignore_eos, stop_token_ids, skip_special_tokens), run through
the tokenizer manager, and shaped as OpenAI responses; `stream` gives SSE chunks with text
deltas and, with `stream_options.include_usage`, a final usage chunk. `response_format`
(`json_schema`, `json_object`, and SGLang's `regex` and `structural_tag` extensions) constrains
the output. `tools` and `tool_choice` follow `tool_calls` (prompt convention, constraint) and
`tool_formats` (the formats calls are read in: `--tool-call-parser`, by default the one the chat
template teaches; a template that renders tools itself is given them and the history's calls as
objects; under `auto` on a context-free grammar backend each opened call is constrained by a
structural tag in that format, where it has one): calls come back as
`message.tool_calls` with `finish_reason: "tool_calls"`; when streaming with tools, each choice's
text is read as it comes (`ToolCallStream`): content deltas, and per call a first
`delta.tool_calls` entry (index, id, type, name) then its arguments in fragments, as OpenAI
streams them. `stream_options.continuous_usage_stats` puts each choice's usage so far in every chunk.
With `--reasoning-parser`, chat requests are generated as reasoning (`require_reasoning`: a
grammar applies after it) and, unless `separate_reasoning` is false, answered with the reasoning in
`message.reasoning_content` (streamed as `delta.reasoning_content` chunks, or in one chunk when it
ends if `stream_reasoning` is false) and the rest in `content` (`radixlm.formats.reasoning`).
What chat shares with /v1/responses (prompt, grammars, reading outputs) is in `chat_common`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixlm.formats.reasoning import ReasoningFormat, ReasoningStream, reasoning_format
from radixlm.formats.tool_calls import openai_tool_calls, parse_tool_choice, parse_tools
from radixlm.formats.tool_formats import ToolCallReader, detect_format, tool_call_reader
from radixlm.formats.tool_stream import ToolCallStream
from radixlm.runtime.api.protocol import (
    JSON,
    SSE,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatRequest,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    ModelList,
    OpenAPIDocs,
    Operation,
    SamplingFields,
    SseEvents,
    error_responses,
    parse_body,
)
from radixlm.runtime.api.request_io import (
    GenerateRequest,
    PreparedRequest,
    RequestError,
    expand_copies,
    requested_rank,
)
from radixlm.runtime.config.limits import MAX_BATCH, MAX_SEQUENCES
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
from radixlm.runtime.server.http_common import merged_outputs, prepare_all, read_json, run_all, sse, sse_error
from radixlm.runtime.server.openai_chunks import UsageTracker, tool_call_delta
from radixlm.runtime.server.tokenizer_manager import TokenizerManager


def _sampling_params(req: CompletionRequest | ChatRequest, max_tokens: int | None) -> dict[str, Any]:
    pairs = {
        "max_new_tokens": max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "stop": req.stop,
        "stop_regex": req.stop_regex,
        "no_stop_trim": req.no_stop_trim,
        "seed": req.seed,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "repetition_penalty": req.repetition_penalty,
        "min_new_tokens": req.min_tokens,
        "ignore_eos": req.ignore_eos,
        "stop_token_ids": req.stop_token_ids,
        "skip_special_tokens": req.skip_special_tokens,
        "regex": req.regex,
        "json_schema": req.json_schema if not isinstance(req.json_schema, dict) else json.dumps(req.json_schema),
        "ebnf": req.ebnf,
        "structural_tag": req.structural_tag if not isinstance(req.structural_tag, dict)
        else json.dumps(req.structural_tag),
    }
    return {k: v for k, v in pairs.items() if v is not None}


def _grammar_backend(results: list[dict[str, Any]]) -> dict[str, Any]:
    """`{"grammar_backend": engine}` (a radixlm extension) when a grammar constrained the
    results: the engine the door chose for it (`constrained.engine_choice`), and
    `schema_stricter`, the JSON schema's keywords it served by a stricter rewrite, when any
    (`constrained.schema_notes`); else empty."""
    engines = {r["meta_info"]["grammar_backend"] for r in results if "grammar_backend" in r["meta_info"]}
    if len(engines) != 1:
        return {}
    stricter = list(dict.fromkeys(k for r in results for k in r["meta_info"].get("schema_stricter", ())))
    return {"grammar_backend": engines.pop(), **({"schema_stricter": stricter} if stricter else {})}


def _completion_logprobs(meta: dict[str, Any], echo: bool, offset: int = 0) -> dict[str, Any]:
    """OpenAI completion logprobs of the entries in `meta` (a whole result, or a stream chunk's
    new entries, whose first token starts at text offset `offset`)."""
    entries = (meta.get("input_token_logprobs", []) if echo else []) + meta.get("output_token_logprobs", [])
    tops = (meta.get("input_top_logprobs", []) if echo else []) + meta.get("output_top_logprobs", [])
    tokens = [e[2] for e in entries]
    offsets = []
    for tok in tokens:
        offsets.append(offset)
        offset += len(tok or "")
    return {
        "tokens": tokens,
        "token_logprobs": [e[0] for e in entries],
        "top_logprobs": [None if t is None else {x[2]: x[0] for x in t} for t in tops] or None,
        "text_offset": offsets,
    }


def _chat_logprobs(meta: dict[str, Any]) -> dict[str, Any]:
    tops = meta.get("output_top_logprobs") or [[] for _ in meta.get("output_token_logprobs", [])]
    content = []
    for (lp, _, text), top in zip(meta.get("output_token_logprobs", []), tops):
        content.append({
            "token": text, "logprob": lp, "bytes": list(text.encode()),
            "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for v, _, t in top],
        })
    return {"content": content}


def register_openai_routes(app: FastAPI, tm: TokenizerManager, tool_call_parser: str, docs: OpenAPIDocs,
                           secured: bool, reasoning_parser: str | None = None) -> None:
    auth = (401,) if secured else ()
    reasoning = None if reasoning_parser is None else reasoning_format(reasoning_parser)
    template = tm.tokenizer.chat_template
    native_tools = detect_format(template) is not None  # the template renders tools in a format we read
    auto_reader = tool_call_reader(tool_call_parser, template)  # resolved once, not per request
    forced_reader = tool_call_reader("json")  # a forced call is generated as bare JSON under a schema
    docs.add("/v1/models", "get", Operation(responses={200: ("the served model", {JSON: ModelList}),
                                                       **error_responses(*auth)}))
    for path, request_model, response_model, chunk in (
            ("/v1/completions", CompletionRequest, CompletionResponse, CompletionChunk),
            ("/v1/chat/completions", ChatRequest, ChatCompletionResponse, ChatCompletionChunk)):
        docs.add(path, "post", Operation(request_model, {
            200: ("the completion; with stream, server-sent events", {JSON: response_model, SSE: SseEvents(chunk)}),
            **error_responses(400, 404, 413, 503, *auth)}))

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": tm.model_name, "object": "model", "created": 0, "owned_by": "radixlm"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req: CompletionRequest = parse_body(CompletionRequest, await read_json(request))
        check_model(tm, req.model)
        prompts = req.prompt if isinstance(req.prompt, list) and req.prompt and not isinstance(req.prompt[0], int) else [req.prompt]
        if len(prompts) > MAX_BATCH:
            raise RequestError(f"a batch holds at most {MAX_BATCH} prompts, got {len(prompts)}")
        if len(prompts) * req.n > MAX_SEQUENCES:
            raise RequestError(f"a request generates at most {MAX_SEQUENCES} sequences (prompts x n), "
                               f"got {len(prompts) * req.n}")
        want_logprobs = req.logprobs is not None
        base_id = f"cmpl-{uuid.uuid4().hex}"
        reqs: list[GenerateRequest] = []
        for i, prompt in enumerate(prompts):
            key = "text" if isinstance(prompt, str) else "input_ids"
            value = prompt if isinstance(prompt, str) else tuple(prompt)
            base = GenerateRequest(
                **{key: value}, sampling_params={**_sampling_params(req, req.max_tokens),
                                                 **response_format_grammar(req.response_format)},
                return_logprob=want_logprobs, top_logprobs_num=req.logprobs or 0, return_text_in_logprobs=True,
                logprob_start_len=0 if req.echo and want_logprobs else -1, stream=req.stream,
                data_parallel_rank=requested_rank(req), cache_salt=req.cache_salt,
            )
            reqs += expand_copies(replace(base, rid=f"{base_id}-{i}"), req.n)
        prepared = await prepare_all(tm, reqs)
        prompt_texts = [p if isinstance(p, str) else tm.tokenizer.decode(p) for p in prompts]

        def choice_text(index: int, text: str) -> str:
            return prompt_texts[index // req.n] + text if req.echo else text

        if req.stream:
            return StreamingResponse(
                _stream(tm, prepared, req, base_id, "text_completion", len(prompts), choice_text, None),
                media_type="text/event-stream",
            )
        results = [chunk.result for chunk in await run_all(tm, prepared, request)]
        choices = [{
            "index": i,
            "text": choice_text(i, r["text"]),
            "logprobs": _completion_logprobs(r["meta_info"], req.echo) if want_logprobs else None,
            "finish_reason": finish_of(r["meta_info"]),
        } for i, r in enumerate(results)]
        return JSONResponse({
            "id": base_id, "object": "text_completion", "created": int(time.time()), "model": tm.model_name,
            "choices": choices, "usage": usage_of(results, len(prompts)), **_grammar_backend(results),
        })

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req: ChatRequest = parse_body(ChatRequest, await read_json(request))
        check_model(tm, req.model)
        tools = parse_tools(req.tools, allow_empty=True) if req.tools is not None else []  # []: no tools
        tool_choice = parse_tool_choice(req.tool_choice, tools)
        offered = tools if tool_choice != "none" else []
        tool_names = {t.name for t in offered}
        reader = auto_reader if tool_choice == "auto" else forced_reader
        messages = prompt_messages(req.messages, native_tools)
        prompt = render_chat_prompt(tm, messages, offered, native_tools, req.continue_final_message,
                                    req.chat_template_kwargs)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        base_id = f"chatcmpl-{uuid.uuid4().hex}"
        params = _sampling_params(req, max_tokens)
        # `auto` on a context-free backend: each <tool_call> block the model opens is one well-formed call
        structures = (reader.structures(tools)
                      if tm.validator.grammar_backend != "outlines" and tool_choice == "auto" else None)
        params.update(tool_choice_grammar(tool_choice, tools, params, structures,
                                          response_format_grammar(req.response_format)))
        base = GenerateRequest(
            text=prompt, sampling_params=params, return_logprob=req.logprobs,
            top_logprobs_num=(req.top_logprobs or 0) if req.logprobs else 0, return_text_in_logprobs=True, stream=req.stream,
            require_reasoning=reasoning is not None,  # as SGLang: whether or not it is separated
            data_parallel_rank=requested_rank(req), cache_salt=req.cache_salt,
        )
        prepared = await prepare_all(tm, expand_copies(replace(base, rid=base_id), req.n))
        split = reasoning if req.separate_reasoning else None
        if req.stream and tool_names:
            return StreamingResponse(_stream_tool_calls(prepared, req, base_id, tool_names, reader, split),
                                     media_type="text/event-stream")
        if req.stream:
            return StreamingResponse(
                _stream(tm, prepared, req, base_id, "chat.completion.chunk", 1, None, split), media_type="text/event-stream"
            )
        results = [chunk.result for chunk in await run_all(tm, prepared, request)]
        choices = []
        for i, r in enumerate(results):
            thought, text = split_reasoning(r["text"], split)
            content, calls = split_calls(text, tool_names, reader, req.parallel_tool_calls)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if split is not None:
                message["reasoning_content"] = thought or None
            if calls:
                message["tool_calls"] = openai_tool_calls(calls)
            choices.append({
                "index": i,
                "message": message,
                "logprobs": _chat_logprobs(r["meta_info"]) if req.logprobs else None,
                "finish_reason": "tool_calls" if calls else finish_of(r["meta_info"]),
            })
        return JSONResponse({
            "id": base_id, "object": "chat.completion", "created": int(time.time()), "model": tm.model_name,
            "choices": choices, "usage": usage_of(results, 1), **_grammar_backend(results),
        })

    async def _stream_tool_calls(reqs: list[PreparedRequest], req: ChatRequest, base_id: str, tool_names: set[str],
                                 reader: ToolCallReader, split: ReasoningFormat | None) -> AsyncIterator[bytes]:
        """Chat SSE with tools, as OpenAI streams it: per choice, a role chunk, its reasoning
        (if separated), content and `delta.tool_calls` chunks as `ToolCallStream` reads them
        (a call's index, id, type and name first, then its arguments in fragments), and the
        finish chunk (the response's finish_reason); then optional usage."""
        created = int(time.time())
        usage = UsageTracker(req.stream_options, len(reqs))

        def chunk(index: int, delta: dict[str, Any], finish: str | None) -> bytes:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            return sse({"id": base_id, "object": "chat.completion.chunk", "created": created, "model": tm.model_name,
                        "choices": [choice], **usage.of_chunk(index)})

        streams = [ToolCallStream(reader, tool_names) for _ in reqs]
        splitters = [ReasoningStream(split, req.stream_reasoning) for _ in reqs] if split else None
        started = [False] * len(reqs)
        finals: list[dict[str, Any]] = []
        async for index, item in merged_outputs(tm, reqs):
            if isinstance(item, Exception):
                yield sse_error(item)
                continue
            usage.update(index, item.meta_info)
            if not started[index]:
                started[index] = True
                yield chunk(index, {"role": "assistant", "content": ""}, None)
            finish = finish_of(item.meta_info)
            # piece by piece, as the deltas came: the fragments sent do not depend on how many
            # deltas waited for this loop (a busy server coalesces them into one chunk)
            pieces = item.new_pieces or ("",)
            for k, piece in enumerate(pieces):
                is_last = finish is not None and k == len(pieces) - 1
                text, thought = piece, ""
                if splitters is not None:
                    thought, text = _split_delta(splitters[index], text, is_last)
                if thought:
                    yield chunk(index, {"reasoning_content": thought}, None)
                deltas = streams[index].feed(text) + (streams[index].finish() if is_last else [])
                for delta in deltas:
                    if delta.index < 1 or req.parallel_tool_calls:  # not parallel: the first call only
                        yield chunk(index, tool_call_delta(delta), None)
            if finish is not None:
                finals.append(item.result)
                # as the response: "tool_calls" if whole calls were made ("length" if one was cut off)
                made_calls = streams[index].num_calls and streams[index].is_parsed
                yield chunk(index, {}, "tool_calls" if made_calls else finish)
        if req.stream_options is not None and req.stream_options.include_usage:
            yield sse({"id": base_id, "object": "chat.completion.chunk", "created": created, "model": tm.model_name,
                       "choices": [], "usage": usage_of(finals, 1)})
        yield b"data: [DONE]\n\n"

    async def _stream(tm: TokenizerManager, reqs: list[PreparedRequest], req: SamplingFields, base_id: str,
                      kind: str, num_prompts: int, choice_text: Any, split: ReasoningFormat | None) -> AsyncIterator[bytes]:
        """OpenAI SSE chunks: text deltas per choice, a finish chunk each, an optional usage chunk.
        Chat with `split`: each choice's reasoning as `reasoning_content` chunks before its
        content (`ReasoningStream`: no marker is cut across chunks)."""
        created = int(time.time())
        is_chat = kind == "chat.completion.chunk"

        asked = getattr(req, "logprobs", None)  # chat: a bool; completions: the top count or None
        want_logprobs = bool(asked) if is_chat else asked is not None
        echo = not is_chat and getattr(req, "echo", False)

        def chunk(index: int, delta: str, finish: str | None, first: bool, logprobs: dict[str, Any] | None,
                  field: str = "content") -> bytes:
            if is_chat:
                payload: dict[str, Any] = {"role": "assistant", field: delta} if first else {field: delta}
                choice = {"index": index, "delta": payload, "logprobs": logprobs, "finish_reason": finish}
            else:
                choice = {"index": index, "text": delta, "logprobs": logprobs, "finish_reason": finish}
            return sse({"id": base_id, "object": kind, "created": created, "model": tm.model_name, "choices": [choice],
                        **usage.of_chunk(index)})

        usage = UsageTracker(req.stream_options, len(reqs))
        started = [False] * len(reqs)
        offsets = [0] * len(reqs)  # completions: text offset of each choice's next logprob token
        splitters = [ReasoningStream(split, getattr(req, "stream_reasoning", True)) for _ in reqs] if split else None
        finals: list[dict[str, Any]] = []
        async for index, item in merged_outputs(tm, reqs):
            if isinstance(item, Exception):
                yield sse_error(item)
                continue
            usage.update(index, item.meta_info)
            if echo and not started[index]:  # the prompt first, with the choice's first output (and usage)
                started[index] = True
                yield chunk(index, choice_text(index, ""), None, False, None)
            finish = finish_of(item.meta_info)
            logprobs = None
            if want_logprobs and is_chat:
                logprobs = _chat_logprobs(item.meta_info)
            elif want_logprobs:
                logprobs = _completion_logprobs(item.meta_info, echo, offsets[index])
                if logprobs["tokens"]:
                    offsets[index] = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1] or "")
            has_logprobs = bool(logprobs and (logprobs.get("content") or logprobs.get("tokens")))
            text, thought = item.new_text, ""
            if splitters is not None:
                thought, text = _split_delta(splitters[index], text, finish is not None)
            if thought:
                yield chunk(index, thought, None, not started[index], None, field="reasoning_content")
                started[index] = True
            if text or finish or not started[index] or has_logprobs:
                yield chunk(index, text, finish, is_chat and not started[index], logprobs)
                started[index] = True
            if finish is not None:
                finals.append(item.result)
        if req.stream_options is not None and req.stream_options.include_usage:
            yield sse({"id": base_id, "object": kind, "created": created, "model": tm.model_name,
                       "choices": [], "usage": usage_of(finals, num_prompts)})
        yield b"data: [DONE]\n\n"


def _split_delta(splitter: ReasoningStream, text: str, is_last: bool) -> tuple[str, str]:
    """(reasoning, answer) of one choice's new text; with its last, what the splitter held back."""
    thought, answer = splitter.feed(text)
    if is_last:
        rest_thought, rest_answer = splitter.finish()
        thought, answer = thought + rest_thought, answer + rest_answer
    return thought, answer
