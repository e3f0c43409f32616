"""The HTTP server (FastAPI): SGLang's native API, health, metrics and the API key; the OpenAI
routes are added by `openai_api.register_openai_routes`.

Native API: POST /generate (text or input_ids, single or batch, `n`, logprobs, SSE `stream`),
GET /get_model_info (= /model_info), GET /get_server_info (= /server_info), POST (or GET)
/flush_cache, GET /health, GET /health_generate, POST /abort_request, GET /metrics, GET /get_load
(what sglang-router reads of a worker's load), POST /separate_reasoning (a text split by a named
reasoning parser, `radixlm.formats.reasoning`); the dashboard's GET /cache_tree and GET /dashboard are
added by `dashboard.register_dashboard_routes`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import re
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from radixlm.formats.chat_template import derive_chat_template
from radixlm.formats.reasoning import UnknownReasoningParser, separate_reasoning
from radixlm.formats.tool_calls import ToolSpecError
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
from radixlm.runtime.api.request_io import GenerateRequest, PreparedRequest, RequestError, parse_generate
from radixlm.runtime.api.request_output import OutputChunk
from radixlm.runtime.config.limits import MAX_BODY_BYTES, MAX_JSON_DEPTH, json_depth
from radixlm.runtime.server.dashboard import PAGE_FILES, register_dashboard_routes
from radixlm.runtime.server.tokenizer_manager import ServiceUnavailable, TokenizerManager

OPEN_PATHS = {"/health", *PAGE_FILES}  # reachable without the API key (the dashboard's page holds no data)
logger = logging.getLogger(__name__)


def error_response(message: str, status_code: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status_code}}, status_code=status_code)


class ApiKeyMiddleware:
    """Refuses (401) a request to any path but OPEN_PATHS without `Authorization: Bearer <api_key>`.

    Plain ASGI, not `@app.middleware("http")`: Starlette's BaseHTTPMiddleware hands every body
    chunk of a streamed response through an extra task and memory stream, a cost per streamed
    token on the process that also feeds the scheduler."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.api_key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
            # the scheme is case-insensitive (RFC 9110); the key is compared in constant time
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), self.api_key):
                response = error_response("missing or wrong API key (Authorization: Bearer <key>)", 401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# A JSON escape of a UTF-16 surrogate; valid UTF-8 bytes never encode one (the decoder refuses them).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


async def read_json(request: Request) -> Any:
    """The body as JSON: at most MAX_BODY_BYTES (413; read no further), UTF-8 without a byte order
    mark, JSON without NaN / Infinity, nested at most MAX_JSON_DEPTH deep, and no string that is
    not Unicode: invalid UTF-8 bytes (e.g. an encoded surrogate, ED A0 80) or a lone surrogate
    escape (`"\\ud800"` parses in Python but breaks tokenizers and encoders) is a 400 naming the
    field that holds it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestError(f"the request body is larger than {MAX_BODY_BYTES} bytes", 413)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise RequestError(f"the request body is larger than {MAX_BODY_BYTES} bytes", 413)
            chunks.append(chunk)
    except ClientDisconnect:  # nobody reads the answer: one line, not a traceback
        logger.info("client disconnected before sending the whole request body (%s %s)",
                    request.method, request.url.path)
        raise RequestError("the client disconnected before sending the whole request body") from None
    return parse_json_body(b"".join(chunks))


def parse_json_body(body: bytes) -> Any:
    """`read_json`'s checks of a whole body (RequestError naming what is wrong)."""
    if body.startswith(b"\xef\xbb\xbf"):
        raise RequestError("the request body starts with a byte order mark; send UTF-8 without one")
    invalid_at = None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:  # decoded anyway, to name the field that holds the bad bytes
        text, invalid_at = body.decode("utf-8", errors="surrogateescape"), e.start
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise RequestError(f"the request body is nested too deeply (the limit is {MAX_JSON_DEPTH} levels)") from None
    except ValueError as e:  # json.JSONDecodeError included
        if invalid_at is not None:
            raise RequestError(f"the request body is not valid UTF-8 (byte {invalid_at})") from None
        raise RequestError(f"the request body is not valid JSON: {e}") from e
    if json_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise RequestError(f"the request body is nested too deeply (the limit is {MAX_JSON_DEPTH} levels)")
    if invalid_at is not None or _SURROGATE_ESCAPE.search(body):
        where = _non_unicode_field(value)
        if where is not None:
            raise RequestError(f"{where}: not valid Unicode (invalid UTF-8 bytes, or a lone UTF-16 surrogate "
                               "such as \"\\ud800\")")
    return value


def _non_unicode_field(value: Any) -> str | None:
    """The path (`messages[0].content`, `sampling_params.stop[1]`) of the first string, key or
    value, in a parsed JSON value that holds an unpaired surrogate; None if there is none."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return path or "the request body"
        elif isinstance(node, dict):
            for key, item in node.items():
                shown = key.encode("utf-8", "backslashreplace").decode()  # a bad key still prints
                here = f"{path}.{shown}" if path else shown
                stack.append((here, item))
                stack.append((f"{here} (a key)", key))
        elif isinstance(node, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(node))
    return None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed in JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def sse(data: Any) -> bytes:
    """One server-sent event, `data: <JSON>\n\n`: compact UTF-8 by orjson (0.6 us for a W2 chunk
    against json.dumps' 8.7: an event per token per request is the front's hottest path); a NaN,
    which no result holds, would become null."""
    return b"data: " + orjson.dumps(data) + b"\n\n"


def chat_role_wrappers(tokenizer: Any) -> dict[str, Any] | None:
    if tokenizer.chat_template is None:
        return None
    template = derive_chat_template(lambda m: tokenizer.apply_chat_template(m, add_generation_prompt=False))
    return None if template is None else template.to_dict()


def create_app(
    tm: TokenizerManager, api_key: str | None = None, enable_metrics: bool = True, tool_call_parser: str = "auto",
    reasoning_parser: str | None = None,
) -> FastAPI:
    app = FastAPI(title="radixlm", version="0.1.0")
    app.state.tm = tm

    if api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)

    @app.exception_handler(RequestError)
    async def on_request_error(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(str(exc), exc.status_code)

    @app.exception_handler(RequestValidationError)  # no route takes typed parameters; kept as a 400 anyway
    async def on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        return error_response(f"invalid request: {'.'.join(map(str, first['loc']))}: {first['msg']}", 400)

    @app.exception_handler(ToolSpecError)
    @app.exception_handler(UnknownReasoningParser)
    async def on_bad_parser_name(_: Request, exc: ValueError) -> JSONResponse:
        return error_response(str(exc), 400)

    @app.exception_handler(ServiceUnavailable)
    async def on_unavailable(_: Request, exc: ServiceUnavailable) -> JSONResponse:
        return error_response(f"server unavailable: {exc}", 503)

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

    from radixlm.runtime.server.openai_api import register_openai_routes

    docs = OpenAPIDocs()
    document_native_routes(docs, secured=api_key is not None)
    register_openai_routes(app, tm, tool_call_parser, docs, secured=api_key is not None,
                           reasoning_parser=reasoning_parser)
    register_dashboard_routes(app, tm, docs, secured=api_key is not None)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = docs.apply(get_openapi(title=app.title, version=app.version, routes=app.routes,
                                                        description="SGLang's native API and the OpenAI API"))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


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


async def prepare_all(tm: TokenizerManager, reqs: list[GenerateRequest]) -> list[PreparedRequest]:
    """Validate every request before any runs (a bad batch item fails the whole batch with 400).
    Runs in a worker thread: tokenizing a long prompt (the tokenizer releases the GIL) or
    translating a schema must not stall the event loop, which serves everyone else meanwhile.
    Requests whose preparations overlap reach the scheduler together (`tm.arrivals`)."""
    if tm.dead_reason is not None:
        raise ServiceUnavailable(tm.dead_reason)
    for req in reqs:
        tm.check_rank(req.data_parallel_rank)
    with tm.arrivals.preparing(len(reqs)):
        return await asyncio.to_thread(lambda: [tm.validator.validate(r) for r in reqs])


async def run_all(tm: TokenizerManager, reqs: list[PreparedRequest], request: Request | None) -> list[OutputChunk]:
    """Run requests concurrently to their final results; a client that disconnects aborts them."""

    async def one(req: PreparedRequest) -> OutputChunk:
        final: OutputChunk | None = None
        async for chunk in tm.generate(req):
            final = chunk
        assert final is not None
        reason = final.meta_info["finish_reason"] or {}
        if reason.get("type") == "abort" and str(reason.get("message", "")).startswith("invalid grammar"):
            raise RequestError(reason["message"])  # a grammar that passed the quick check but failed to compile
        return final

    tasks = [asyncio.ensure_future(one(r)) for r in reqs]
    try:
        while True:
            done, _ = await asyncio.wait(tasks, timeout=1.0)
            if len(done) == len(tasks):
                return [t.result() for t in tasks]
            if request is not None and await request.is_disconnected():
                raise asyncio.CancelledError
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()  # tm.generate's cleanup aborts the request in the scheduler
            elif not task.cancelled():
                task.exception()  # retrieved: copies refused alike are reported once, not logged as lost


async def merged_outputs(
    tm: TokenizerManager, reqs: list[PreparedRequest]
) -> AsyncIterator[tuple[int, OutputChunk | Exception]]:
    """Run requests concurrently and yield (index, chunk or error) as they progress. Nothing
    piles up for a reader that stops reading: each request's pump holds at most one chunk (the
    queue has one place per request), and deltas arriving meanwhile coalesce in the tokenizer
    manager. Closing the iterator (client gone) cancels the rest, which aborts them."""
    if len(reqs) == 1:  # no pump needed
        outputs = tm.generate(reqs[0])
        try:
            async for chunk in outputs:
                yield 0, chunk
        except (RequestError, ServiceUnavailable) as e:
            yield 0, e
        finally:
            await outputs.aclose()  # now, not when collected: aborts the request if unfinished
        return
    queue: asyncio.Queue[tuple[int, OutputChunk | Exception | None]] = asyncio.Queue(maxsize=len(reqs))

    async def pump(index: int, req: PreparedRequest) -> None:
        try:
            async for chunk in tm.generate(req):
                await queue.put((index, chunk))
        except (RequestError, ServiceUnavailable) as e:
            await queue.put((index, e))
        await queue.put((index, None))

    tasks = [asyncio.ensure_future(pump(i, r)) for i, r in enumerate(reqs)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


def sse_error(exc: Exception) -> bytes:
    code = 503 if isinstance(exc, ServiceUnavailable) else 400
    return sse({"error": {"message": str(exc), "code": code}})


async def stream_generate(tm: TokenizerManager, reqs: list[PreparedRequest], is_batch: bool) -> AsyncIterator[bytes]:
    """SSE: `data: {...}` per update (text cumulative), `data: [DONE]` at the end. The requests
    were validated before the response started."""
    async for index, item in merged_outputs(tm, reqs):
        if isinstance(item, Exception):
            yield sse_error(item)
        else:
            yield sse({**item.result, "index": index} if is_batch else item.result)
    yield b"data: [DONE]\n\n"
