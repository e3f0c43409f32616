"""The HTTP server (FastAPI): SGLang's native API, health, metrics and the API key; the OpenAI
routes are added by `openai_api.register_openai_routes`.

Native API: POST /generate (text or input_ids, single or batch, `n`, logprobs, SSE `stream`),
GET /get_model_info, GET /get_server_info (= /server_info), POST /flush_cache, GET /health,
GET /health_generate, POST /abort_request, GET /metrics.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from radixlm.chat_template import derive_chat_template
from radixlm.runtime.limits import (
    MAX_BATCH,
    MAX_BODY_BYTES,
    MAX_JSON_DEPTH,
    MAX_N,
    MAX_RID_CHARS,
    MAX_SEQUENCES,
    json_depth,
)
from radixlm.runtime.request_io import GenerateRequest, RequestError, copy_seed
from radixlm.runtime.server.tokenizer_manager import PreparedRequest, ServiceUnavailable, TokenizerManager
from radixlm.tool_calls import ToolSpecError

GENERATE_FIELDS = {
    "text", "input_ids", "sampling_params", "rid", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "return_text_in_logprobs", "stream",
}
OPEN_PATHS = {"/health"}  # reachable without the API key


def error_response(message: str, status_code: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status_code}}, status_code=status_code)


# A JSON escape of a UTF-16 surrogate; valid UTF-8 bytes never encode one (the decoder refuses them).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


async def read_json(request: Request) -> Any:
    """The body as JSON: at most MAX_BODY_BYTES (413; read no further), valid UTF-8 JSON without
    NaN / Infinity, nested at most MAX_JSON_DEPTH deep, and no string holding a lone surrogate
    (`"\\ud800"` parses in Python but is not Unicode: it breaks tokenizers and encoders)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestError(f"the request body is larger than {MAX_BODY_BYTES} bytes", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise RequestError(f"the request body is larger than {MAX_BODY_BYTES} bytes", 413)
        chunks.append(chunk)
    body = b"".join(chunks)
    try:
        value = json.loads(body, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise RequestError(f"the request body is nested too deeply (the limit is {MAX_JSON_DEPTH} levels)") from None
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise RequestError(f"the request body is not valid JSON: {e}") from e
    if json_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise RequestError(f"the request body is nested too deeply (the limit is {MAX_JSON_DEPTH} levels)")
    if _SURROGATE_ESCAPE.search(body) and _has_lone_surrogate(value):
        raise RequestError("the request body holds a string with a lone UTF-16 surrogate (e.g. \"\\ud800\"), "
                           "which is not valid Unicode")
    return value


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string (key or value) in a parsed JSON value holds an unpaired surrogate."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed in JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False, allow_nan=False)}\n\n".encode()


def chat_role_wrappers(tokenizer: Any) -> dict[str, Any] | None:
    if tokenizer.chat_template is None:
        return None
    template = derive_chat_template(lambda m: tokenizer.apply_chat_template(m, add_generation_prompt=False))
    return None if template is None else template.to_dict()


def create_app(
    tm: TokenizerManager, api_key: str | None = None, enable_metrics: bool = True, tool_call_parser: str = "auto"
) -> FastAPI:
    app = FastAPI(title="radixlm", version="0.1.0")
    app.state.tm = tm

    @app.middleware("http")
    async def check_api_key(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if api_key is not None and request.url.path not in OPEN_PATHS:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return error_response("missing or wrong API key (Authorization: Bearer <key>)", 401)
        return await call_next(request)

    @app.exception_handler(RequestError)
    async def on_request_error(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(str(exc), exc.status_code)

    @app.exception_handler(ToolSpecError)
    async def on_tool_spec_error(_: Request, exc: ToolSpecError) -> JSONResponse:
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
        req = GenerateRequest(input_ids=(0,), sampling_params={"max_new_tokens": 1, "temperature": 0})
        async for _ in tm.generate(tm.validate(req)):
            pass
        return Response(status_code=200)

    role_wrappers = chat_role_wrappers(tm.tokenizer)

    @app.get("/get_model_info")
    async def get_model_info() -> dict[str, Any]:
        # chat_template: the text around each role's content, for the language's role blocks
        return {"model_path": tm.model_name, "tokenizer_path": tm.model_name, "is_generation": True,
                "chat_template": role_wrappers}

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def get_server_info() -> dict[str, Any]:
        return await tm.get_server_info()

    @app.post("/flush_cache")
    async def flush_cache() -> Response:
        ok = await tm.flush_cache()
        if not ok:
            return PlainTextResponse("cache not flushed: requests are running", status_code=400)
        return PlainTextResponse("cache flushed", status_code=200)

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("rid"), str):
            raise RequestError("abort_request needs {\"rid\": \"<request id>\"}")
        await tm.abort(body["rid"])
        return Response(status_code=200)

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
        results = await run_all(tm, prepared, request)
        return JSONResponse(results if is_batch else results[0])

    from radixlm.runtime.server.openai_api import register_openai_routes

    register_openai_routes(app, tm, tool_call_parser)
    return app


async def prepare_all(tm: TokenizerManager, reqs: list[GenerateRequest]) -> list[PreparedRequest]:
    """Validate every request before any runs (a bad batch item fails the whole batch with 400).
    Runs in a worker thread: tokenizing a long prompt (the tokenizer releases the GIL) or
    translating a schema must not stall the event loop, which serves everyone else meanwhile."""
    if tm.dead_reason is not None:
        raise ServiceUnavailable(tm.dead_reason)
    return await asyncio.to_thread(lambda: [tm.validate(r) for r in reqs])


async def run_all(tm: TokenizerManager, reqs: list[PreparedRequest], request: Request | None) -> list[dict[str, Any]]:
    """Run requests concurrently to their final results; a client that disconnects aborts them."""

    async def one(req: PreparedRequest) -> dict[str, Any]:
        final: dict[str, Any] = {}
        async for latest in tm.generate(req):
            final = latest
        reason = final.get("meta_info", {}).get("finish_reason") or {}
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


async def merged_outputs(
    tm: TokenizerManager, reqs: list[PreparedRequest]
) -> AsyncIterator[tuple[int, dict[str, Any] | Exception]]:
    """Run requests concurrently and yield (index, latest result or error) as they progress.
    Closing the iterator (client gone) cancels the rest, which aborts them in the scheduler."""
    queue: asyncio.Queue[tuple[int, dict[str, Any] | Exception | None]] = asyncio.Queue()

    async def pump(index: int, req: PreparedRequest) -> None:
        try:
            async for result in tm.generate(req):
                await queue.put((index, result))
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
            yield sse({**item, "index": index} if is_batch else item)
    yield b"data: [DONE]\n\n"


def parse_generate(body: Any) -> tuple[list[GenerateRequest], bool]:
    """The /generate body -> one GenerateRequest per prompt and copy (`n`), prompt-major."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    unknown = sorted(set(body) - GENERATE_FIELDS)
    if unknown:
        raise RequestError(f"unknown field(s) in /generate: {unknown}")
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise RequestError("exactly one of 'text' and 'input_ids' is required")
    if text is not None:
        is_batch = isinstance(text, list)
        prompts: list[Any] = text if is_batch else [text]
        if not prompts or not all(isinstance(t, str) for t in prompts):
            raise RequestError("'text' must be a string or a non-empty list of strings")
    else:
        is_batch = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
        prompts = input_ids if is_batch else [input_ids]
        if not isinstance(input_ids, list) or not all(isinstance(p, list) for p in prompts):
            raise RequestError("'input_ids' must be a list of token ids or a list of such lists")
    if len(prompts) > MAX_BATCH:
        raise RequestError(f"a batch holds at most {MAX_BATCH} prompts, got {len(prompts)}")
    params_list = _per_prompt(body.get("sampling_params"), len(prompts), "sampling_params", dict)
    rids = _per_prompt(body.get("rid"), len(prompts), "rid", str)
    if any(rid is not None and len(rid) > MAX_RID_CHARS for rid in rids):
        raise RequestError(f"'rid' is longer than {MAX_RID_CHARS} characters")
    copies = [_num_copies(params) for params in params_list]
    if sum(copies) > MAX_SEQUENCES:
        raise RequestError(f"a request generates at most {MAX_SEQUENCES} sequences (prompts x n), got {sum(copies)}")
    opts = {
        "return_logprob": _typed(body, "return_logprob", bool, False),
        "logprob_start_len": _typed(body, "logprob_start_len", int, -1),
        "top_logprobs_num": _typed(body, "top_logprobs_num", int, 0),
        "return_text_in_logprobs": _typed(body, "return_text_in_logprobs", bool, False),
        "stream": _typed(body, "stream", bool, False),
    }
    reqs = []
    for prompt, params, rid, n in zip(prompts, params_list, rids, copies):
        params = dict(params or {})
        params.pop("n", None)
        for copy in range(n):
            copy_params = params
            if n > 1 and isinstance(params.get("seed"), int):
                copy_params = {**params, "seed": copy_seed(params["seed"], copy)}
            copy_rid = rid if n == 1 or rid is None else f"{rid}-{copy}"
            key = "text" if isinstance(prompt, str) else "input_ids"
            value = prompt if isinstance(prompt, str) else tuple(prompt)
            reqs.append(GenerateRequest(**{key: value}, sampling_params=copy_params, rid=copy_rid, **opts))
    return reqs, is_batch or len(reqs) > 1


def _num_copies(params: dict[str, Any] | None) -> int:
    n = (params or {}).get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise RequestError(f"sampling_params.n must be an integer in [1, {MAX_N}], got {n!r}")
    return n


def _per_prompt(value: Any, count: int, name: str, kind: type) -> list[Any]:
    if value is None or isinstance(value, kind):
        return [value] * count if name != "rid" or count == 1 or value is None else _rid_batch_error(name)
    if isinstance(value, list) and len(value) == count and all(v is None or isinstance(v, kind) for v in value):
        return value
    raise RequestError(f"'{name}' must be a {kind.__name__} or a list of {count} of them")


def _rid_batch_error(name: str) -> list[Any]:
    raise RequestError(f"a batch needs '{name}' as a list with one id per prompt")


def _typed(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RequestError(f"'{name}' must be an integer, got {value!r}")
    if kind is bool and not isinstance(value, bool):
        raise RequestError(f"'{name}' must be true or false, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestError(f"'{name}' must be finite")
    return value
