"""SGLang's native API: POST /generate (text or input_ids, single or batch, `n`, logprobs, SSE
`stream`), GET /get_model_info (= /model_info), GET /get_server_info (= /server_info), POST (or
GET) /flush_cache, GET /health, GET /health_generate, POST /abort_request, GET /metrics, GET
/get_load (what sglang-router reads of a worker's load), POST /separate_reasoning (a text split by
a named reasoning parser, `radixlm.formats.reasoning`); their bodies in /openapi.json.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from radixlm.formats.chat_template import derive_chat_template
from radixlm.formats.reasoning import separate_reasoning
from radixlm.runtime.api.protocol import (
    JSON,
    SSE,
    TEXT,
    AbortReqInput,
    GenerateOutput,
    GenerateReqInput,
    LoadInfo,
    ModelInfo,
    OpenAPIDocs,
    Operation,
    SeparateReasoningOutput,
    SeparateReasoningReqInput,
    ServerInfo,
    SseEvents,
    error_responses,
    parse_body,
)
from radixlm.runtime.api.request_io import GenerateRequest, PreparedRequest, parse_generate
from radixlm.runtime.server.http_common import (
    error_response,
    merged_outputs,
    prepare_all,
    read_json,
    run_all,
    sse,
    sse_error,
)
from radixlm.runtime.server.tokenizer_manager import TokenizerManager


def chat_role_wrappers(tokenizer: Any) -> dict[str, Any] | None:
    if tokenizer.chat_template is None:
        return None
    template = derive_chat_template(lambda m: tokenizer.apply_chat_template(m, add_generation_prompt=False))
    return None if template is None else template.to_dict()


def register_native_routes(app: FastAPI, tm: TokenizerManager, docs: OpenAPIDocs, secured: bool,
                           enable_metrics: bool = True) -> None:
    @app.get("/health")
    async def health() -> Response:
        if tm.dead_reason is not None:
            return error_response(f"unhealthy: {tm.dead_reason}", 503)
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        req = GenerateRequest(input_ids=(0,), sampling_params={"max_new_tokens": 1, "temperature": 0},
                              log_metrics=False)  # as SGLang: health checks stay out of /metrics
        async for _ in tm.generate(tm.validator.validate(req)):
            pass
        return Response(status_code=200)

    role_wrappers = chat_role_wrappers(tm.tokenizer)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def get_model_info() -> dict[str, Any]:
        # chat_template: the text around each role's content, for the language's role blocks
        return {"model_path": tm.model_name, "tokenizer_path": tm.model_name, "is_generation": True,
                "chat_template": role_wrappers}

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def get_server_info() -> dict[str, Any]:
        return await tm.get_server_info()

    @app.post("/flush_cache")
    @app.get("/flush_cache")
    async def flush_cache() -> Response:
        ok = await tm.flush_cache()
        if not ok:
            return PlainTextResponse("cache not flushed: requests are running", status_code=400)
        return PlainTextResponse("cache flushed", status_code=200)

    @app.get("/get_load")
    async def get_load() -> list[dict[str, Any]]:
        """What sglang-router reads of each worker's load: one entry per data-parallel rank."""
        info = await tm.get_server_info()
        return [rank_load(rank, state) for rank, state in enumerate(info.get("internal_states") or [info])]

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body: AbortReqInput = parse_body(AbortReqInput, await read_json(request))
        await tm.abort(body.rid)
        return Response(status_code=200)

    @app.post("/separate_reasoning")
    async def separate_reasoning_request(request: Request) -> dict[str, str]:
        body: SeparateReasoningReqInput = parse_body(SeparateReasoningReqInput, await read_json(request))
        reasoning, answer = separate_reasoning(body.text, body.reasoning_parser)
        return {"text": answer, "reasoning_text": reasoning}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        if not enable_metrics:
            return PlainTextResponse("metrics are disabled (--no-enable-metrics)", status_code=404)
        info = None if tm.dead_reason is not None else await tm.get_server_info()
        return PlainTextResponse(tm.metrics.render(info), media_type="text/plain; version=0.0.4")

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        body = await read_json(request)
        reqs, is_batch = parse_generate(body)
        prepared = await prepare_all(tm, reqs)
        if reqs[0].stream:
            return StreamingResponse(stream_generate(tm, prepared, is_batch), media_type="text/event-stream")
        results = [chunk.result for chunk in await run_all(tm, prepared, request)]
        return JSONResponse(results if is_batch else results[0])

    document_native_routes(docs, secured)


def document_native_routes(docs: OpenAPIDocs, secured: bool) -> None:
    """The native routes' bodies in /openapi.json (`protocol.OpenAPIDocs`)."""
    auth = (401,) if secured else ()
    unavailable = error_responses(503, *auth)
    docs.add("/health", "get", Operation(responses={200: ("healthy", {}), **error_responses(503)}))
    docs.add("/health_generate", "get", Operation(responses={200: ("generated one token", {}), **unavailable}))
    for path in ("/get_model_info", "/model_info"):
        docs.add(path, "get", Operation(responses={200: ("the model", {JSON: ModelInfo}), **error_responses(*auth)}))
    docs.add("/get_load", "get", Operation(responses={200: ("the load of each data-parallel rank",
                                                            {JSON: list[LoadInfo]}), **unavailable}))
    for path in ("/get_server_info", "/server_info"):
        docs.add(path, "get", Operation(responses={200: ("settings and state", {JSON: ServerInfo}), **unavailable}))
    for method in ("get", "post"):
        docs.add("/flush_cache", method, Operation(responses={
            200: ("flushed", {TEXT: {"type": "string"}}),
            400: ("not flushed: requests are running", {TEXT: {"type": "string"}}), **unavailable}))
    docs.add("/abort_request", "post", Operation(AbortReqInput, {200: ("aborted (if it was running)", {}),
                                                                 **error_responses(400, 413, 503, *auth)}))
    docs.add("/separate_reasoning", "post", Operation(SeparateReasoningReqInput, {
        200: ("the answer and the reasoning", {JSON: SeparateReasoningOutput}), **error_responses(400, 413, *auth)}))
    docs.add("/metrics", "get", Operation(responses={
        200: ("Prometheus text format", {TEXT: {"type": "string"}}),
        404: ("metrics are disabled", {TEXT: {"type": "string"}}), **error_responses(*auth)}))
    docs.add("/generate", "post", Operation(GenerateReqInput, {
        200: ("the result (a list for a batch or n > 1); with stream, server-sent events",
              {JSON: GenerateOutput | list[GenerateOutput], SSE: SseEvents(GenerateOutput)}),
        **error_responses(400, 413, 503, *auth)}))


def rank_load(dp_rank: int, info: dict[str, Any]) -> dict[str, Any]:
    """One rank's /get_load entry from its scheduler info."""
    held = info["max_total_num_tokens"] - info["kv_pool"]["free_tokens"] - info["radix_cache"]["evictable_tokens"]
    return {"dp_rank": dp_rank, "num_reqs": info["num_running_reqs"] + info["num_waiting_reqs"],
            "num_waiting_reqs": info["num_waiting_reqs"], "num_tokens": max(0, held)}


async def stream_generate(tm: TokenizerManager, reqs: list[PreparedRequest], is_batch: bool) -> AsyncIterator[bytes]:
    """SSE: `data: {...}` per update (text cumulative), `data: [DONE]` at the end. The requests
    were validated before the response started."""
    async for index, item in merged_outputs(tm, reqs):
        if isinstance(item, Exception):
            yield sse_error(item)
        else:
            yield sse({**item.result, "index": index} if is_batch else item.result)
    yield b"data: [DONE]\n\n"
