"""What every route module of the server shares, and the only module they share: the JSON body
read with its checks (`read_json`), errors as JSON (`error_response`), server-sent events (`sse`,
`sse_error`), and requests run from their preparation to their results (`prepare_all`, `run_all`)
or to one merged stream (`merged_outputs`). The route modules (`native_api`, `openai_api`,
`dashboard`, `traces`) import this one and never each other; `http_server` builds the app from
them (tests/test_imports.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from radixlm.runtime.api.request_io import GenerateRequest, PreparedRequest, RequestError
from radixlm.runtime.api.request_output import OutputChunk
from radixlm.runtime.config.limits import MAX_BODY_BYTES, MAX_JSON_DEPTH, json_depth
from radixlm.runtime.server.tokenizer_manager import ServiceUnavailable, TokenizerManager

logger = logging.getLogger(__name__)


def error_response(message: str, status_code: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status_code}}, status_code=status_code)


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
