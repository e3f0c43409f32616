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
text is buffered and sent at its end as content and/or one `delta.tool_calls` chunk.
With `--reasoning-parser`, chat requests are generated as reasoning (`require_reasoning`: a
grammar applies after it) and, unless `separate_reasoning` is false, answered with the reasoning in
`message.reasoning_content` (streamed as `delta.reasoning_content` chunks, or in one chunk when it
ends if `stream_reasoning` is false) and the rest in `content` (`radixlm.formats.reasoning`).
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

from radixlm.formats.reasoning import ReasoningFormat, ReasoningStream, reasoning_format, separate_reasoning
from radixlm.formats.tool_calls import (
    Tool,
    ToolCall,
    add_tools_to_messages,
    openai_tool_calls,
    parse_tool_choice,
    parse_tools,
    render_history_calls,
    render_tool_response,
    template_tool_calls,
    template_tools,
    tool_call_schema,
)
from radixlm.formats.tool_formats import ToolCallReader, detect_format, tool_call_reader
from radixlm.runtime.api.protocol import (
    JSON,
    SSE,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatMessage,
    ChatRequest,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    ContentPart,
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
from radixlm.runtime.server.http_common import merged_outputs, prepare_all, read_json, run_all, sse, sse_error
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


def _finish(meta: dict[str, Any]) -> str | None:
    reason = meta.get("finish_reason")
    return None if reason is None else str(reason["type"])


def _grammar_backend(results: list[dict[str, Any]]) -> dict[str, str]:
    """`{"grammar_backend": engine}` (a radixlm extension) when a grammar constrained the
    results: the engine the door chose for it (`constrained.engine_choice`); else empty."""
    engines = {r["meta_info"]["grammar_backend"] for r in results if "grammar_backend" in r["meta_info"]}
    return {"grammar_backend": engines.pop()} if len(engines) == 1 else {}


def _usage(results: list[dict[str, Any]], num_prompts: int) -> dict[str, Any]:
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

    def check_model(name: str | None) -> None:
        # "unknown": what sglang-router sends when its client named no model
        if name is not None and name not in (tm.model_name, "default", "unknown"):
            raise RequestError(f"model {name!r} is not served here; this server serves {tm.model_name!r}", 404)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": tm.model_name, "object": "model", "created": 0, "owned_by": "radixlm"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req: CompletionRequest = parse_body(CompletionRequest, await read_json(request))
        check_model(req.model)
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
                data_parallel_rank=requested_rank(req),
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
            "finish_reason": _finish(r["meta_info"]),
        } for i, r in enumerate(results)]
        return JSONResponse({
            "id": base_id, "object": "text_completion", "created": int(time.time()), "model": tm.model_name,
            "choices": choices, "usage": _usage(results, len(prompts)), **_grammar_backend(results),
        })

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req: ChatRequest = parse_body(ChatRequest, await read_json(request))
        check_model(req.model)
        tools = parse_tools(req.tools, allow_empty=True) if req.tools is not None else []  # []: no tools
        tool_choice = parse_tool_choice(req.tool_choice, tools)
        offered = tools if tool_choice != "none" else []
        tool_names = {t.name for t in offered}
        reader = auto_reader if tool_choice == "auto" else forced_reader
        messages = _prompt_messages(req.messages, native_tools)
        if offered and not native_tools:
            messages = add_tools_to_messages(messages, offered)
        num_chars = sum(len(m["content"]) for m in messages)
        if num_chars > tm.validator.max_prompt_chars:  # refused before the template renders it all
            raise RequestError(f"the messages hold {num_chars} characters, more than the context length "
                               f"({tm.context_len} tokens) can hold")
        try:
            prompt = tm.tokenizer.apply_chat_template(
                messages, continue_final_message=req.continue_final_message, template_kwargs=req.chat_template_kwargs,
                tools=template_tools(offered) if offered and native_tools else None)
        except Exception as e:  # a template that rejects these messages: the client's problem
            raise RequestError(f"messages: cannot apply the chat template: {e}") from e
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        base_id = f"chatcmpl-{uuid.uuid4().hex}"
        params = {**_sampling_params(req, max_tokens), **response_format_grammar(req.response_format)}
        # `auto` on a context-free backend: each <tool_call> block the model opens is one well-formed call
        structures = (reader.structures(tools)
                      if tm.validator.grammar_backend != "outlines" and tool_choice == "auto" else None)
        params.update(_tool_choice_grammar(tool_choice, tools, params, structures))
        base = GenerateRequest(
            text=prompt, sampling_params=params, return_logprob=req.logprobs,
            top_logprobs_num=(req.top_logprobs or 0) if req.logprobs else 0, return_text_in_logprobs=True, stream=req.stream,
            require_reasoning=reasoning is not None,  # as SGLang: whether or not it is separated
            data_parallel_rank=requested_rank(req),
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
            thought, text = _split_reasoning(r["text"], split)
            content, calls = _split_calls(text, tool_names, reader, req.parallel_tool_calls)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if split is not None:
                message["reasoning_content"] = thought or None
            if calls:
                message["tool_calls"] = openai_tool_calls(calls)
            choices.append({
                "index": i,
                "message": message,
                "logprobs": _chat_logprobs(r["meta_info"]) if req.logprobs else None,
                "finish_reason": "tool_calls" if calls else _finish(r["meta_info"]),
            })
        return JSONResponse({
            "id": base_id, "object": "chat.completion", "created": int(time.time()), "model": tm.model_name,
            "choices": choices, "usage": _usage(results, 1), **_grammar_backend(results),
        })

    async def _stream_tool_calls(reqs: list[PreparedRequest], req: ChatRequest, base_id: str, tool_names: set[str],
                                 reader: ToolCallReader, split: ReasoningFormat | None) -> AsyncIterator[bytes]:
        """Chat SSE with tools: a role chunk per choice now; at each choice's end, its reasoning
        (if separated), its content (if any), one `delta.tool_calls` chunk (if calls), and the
        finish chunk; then optional usage."""
        created = int(time.time())

        def chunk(index: int, delta: dict[str, Any], finish: str | None) -> bytes:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            return sse({"id": base_id, "object": "chat.completion.chunk", "created": created, "model": tm.model_name,
                        "choices": [choice]})

        for i in range(len(reqs)):
            yield chunk(i, {"role": "assistant", "content": ""}, None)
        finals: list[dict[str, Any]] = []
        async for index, item in merged_outputs(tm, reqs):
            if isinstance(item, Exception):
                yield sse_error(item)
                continue
            finish = _finish(item.meta_info)
            if finish is None:
                continue
            finals.append(item.result)
            thought, text = _split_reasoning(item.result["text"], split)
            if thought:
                yield chunk(index, {"reasoning_content": thought}, None)
            content, calls = _split_calls(text, tool_names, reader, req.parallel_tool_calls)
            if content:
                yield chunk(index, {"content": content}, None)
            if calls:
                yield chunk(index, {"tool_calls": openai_tool_calls(calls, with_index=True)}, None)
            yield chunk(index, {}, "tool_calls" if calls else finish)
        if req.stream_options is not None and req.stream_options.include_usage:
            yield sse({"id": base_id, "object": "chat.completion.chunk", "created": created, "model": tm.model_name,
                       "choices": [], "usage": _usage(finals, 1)})
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
            return sse({"id": base_id, "object": kind, "created": created, "model": tm.model_name, "choices": [choice]})

        started = [False] * len(reqs)
        offsets = [0] * len(reqs)  # completions: text offset of each choice's next logprob token
        splitters = [ReasoningStream(split, getattr(req, "stream_reasoning", True)) for _ in reqs] if split else None
        finals: list[dict[str, Any]] = []
        if echo:
            for i in range(len(reqs)):
                started[i] = True
                yield chunk(i, choice_text(i, ""), None, False, None)
        async for index, item in merged_outputs(tm, reqs):
            if isinstance(item, Exception):
                yield sse_error(item)
                continue
            finish = _finish(item.meta_info)
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
                       "choices": [], "usage": _usage(finals, num_prompts)})
        yield b"data: [DONE]\n\n"


def _split_reasoning(text: str, split: ReasoningFormat | None) -> tuple[str, str]:
    """(reasoning, answer) of a choice's whole text; without `split`, no reasoning."""
    return separate_reasoning(text, split) if split is not None else ("", text)


def _split_delta(splitter: ReasoningStream, text: str, is_last: bool) -> tuple[str, str]:
    """(reasoning, answer) of one choice's new text; with its last, what the splitter held back."""
    thought, answer = splitter.feed(text)
    if is_last:
        rest_thought, rest_answer = splitter.finish()
        thought, answer = thought + rest_thought, answer + rest_answer
    return thought, answer


def _prompt_messages(messages: list[ChatMessage], native_tools: bool) -> list[dict[str, Any]]:
    """Chat messages as the chat template takes them. Tool calls and results: for a template
    that renders tools (`native_tools`), the calls as objects and the results as `tool`
    messages; else both rendered as text in our prompt convention."""
    out: list[dict[str, Any]] = []
    for m in messages:
        content = _content_text(m.content)
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


def _tool_choice_grammar(tool_choice: str | Tool, tools: list[Tool], params: dict[str, Any],
                         structures: dict[str, Any] | None) -> dict[str, str]:
    """The grammar that forces one call for `required` or a named tool; for `auto` with
    `structures` and no other grammar, that structural tag (each opened call well formed);
    {} otherwise (the output is only parsed)."""
    constrained = any(k in params for k in ("regex", "json_schema", "ebnf", "structural_tag"))
    if tool_choice == "auto" and structures is not None and not constrained:
        return {"structural_tag": json.dumps(structures)}
    if tool_choice in ("none", "auto"):
        return {}
    if constrained:
        raise RequestError("tool_choice 'required' or a named function cannot be combined with "
                           "response_format, regex, json_schema, ebnf or structural_tag")
    forced = tools if tool_choice == "required" else [tool_choice]
    return {"json_schema": json.dumps(tool_call_schema([t for t in forced if isinstance(t, Tool)]))}


def _split_calls(text: str, tool_names: set[str], reader: ToolCallReader,
                 is_parallel: bool = True) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of one choice's text as `reader` reads it; without tools, the text as is.
    Not `is_parallel` (`parallel_tool_calls: false`): the first call only."""
    content, calls = reader.parse(text, tool_names) if tool_names else (text, [])
    return content, calls if is_parallel else calls[:1]


def _content_text(content: str | list[ContentPart] | None) -> str:
    """A message's text (its parts joined; the contract admits text parts only)."""
    if content is None:
        return ""
    return content if isinstance(content, str) else "".join(part.text for part in content)
