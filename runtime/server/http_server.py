"""The HTTP server (FastAPI): the app, built from the route modules, behind the API key.

`create_app` adds the API-key middleware, answers each error type with its status (400 for a bad
request, 503 when the scheduler is gone), registers the route modules (`native_api`: SGLang's
native API, health, metrics; `openai_api`: the OpenAI routes; `responses_api`: OpenAI's
/v1/responses; `dashboard`: /cache_tree and the
page; `traces`: /traces) and serves /openapi.json from their documentation. The route modules
share `http_common` and never import each other; this module is the one that imports them all.
"""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from radixlm.formats.reasoning import UnknownReasoningParser
from radixlm.formats.tool_calls import ToolSpecError
from radixlm.runtime.api.protocol import OpenAPIDocs
from radixlm.runtime.api.request_io import RequestError
from radixlm.runtime.server.dashboard import PAGE_FILES, register_dashboard_routes
from radixlm.runtime.server.http_common import error_response
from radixlm.runtime.server.native_api import register_native_routes
from radixlm.runtime.server.openai_api import register_openai_routes
from radixlm.runtime.server.responses_api import register_responses_routes
from radixlm.runtime.server.tokenizer_manager import ServiceUnavailable, TokenizerManager
from radixlm.runtime.server.traces import register_trace_routes

OPEN_PATHS = {"/health", *PAGE_FILES}  # reachable without the API key (the dashboard's page holds no data)


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


def create_app(
    tm: TokenizerManager, api_key: str | None = None, enable_metrics: bool = True, tool_call_parser: str = "auto",
    reasoning_parser: str | None = None, response_store_size: int = 1000,
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

    docs = OpenAPIDocs()
    secured = api_key is not None
    register_native_routes(app, tm, docs, secured, enable_metrics)
    register_openai_routes(app, tm, tool_call_parser, docs, secured, reasoning_parser=reasoning_parser)
    register_responses_routes(app, tm, tool_call_parser, docs, secured, reasoning_parser=reasoning_parser,
                              store_size=response_store_size)
    register_dashboard_routes(app, tm, docs, secured)
    register_trace_routes(app, docs, secured)
    add_method_not_allowed_routes(app)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = docs.apply(get_openapi(title=app.title, version=app.version, routes=app.routes,
                                                        description="SGLang's native API and the OpenAI API"))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def add_method_not_allowed_routes(app: FastAPI) -> None:
    """After every route: one catch-all per path that answers a method the path does not serve
    with 405 and an `Allow` header listing every method it does. (Starlette's own 405 lists the
    methods of the first route of the path only: `OPTIONS /traces` said `GET` though `POST` is
    served too.) A served method never reaches these: the router takes the first full match."""
    path_to_methods: dict[str, set[str]] = {}
    for route in app.router.routes:
        if isinstance(route, Route) and route.methods:
            path_to_methods.setdefault(route.path, set()).update(route.methods)
    for path, methods in path_to_methods.items():
        # an ASGI app, not a function: Starlette would make a function's route GET-only
        app.router.routes.append(Route(path, MethodNotAllowed(", ".join(sorted(methods))), include_in_schema=False))


class MethodNotAllowed:
    """405 with `Allow: <allow>` and our JSON error body, whatever the method."""

    def __init__(self, allow: str):
        self.allow = allow

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(f"{scope['method']} is not served at {scope['path']}; it serves {self.allow}", 405)
        response.headers["Allow"] = self.allow
        await response(scope, receive, send)
