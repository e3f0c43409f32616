"""The live dashboard: `GET /cache_tree` (JSON: the radix tree, the KV pool, the requests, the
server's counters) and `GET /dashboard` (the page that draws it, with its script and style; it
also shows the program traces of `traces.py` as a timeline).

Auth: the page and its two files are open and hold no data (a page load cannot send an
`Authorization` header). The page starts polling `/cache_tree` (which follows the API-key rules
of every other endpoint) at once, without a key: on a server without one it is live with no
click. Only a 401 makes it show its key form; the key typed there is kept in the page's memory
and sent with every later `fetch`.
Everything the page uses is served from here (`static/`, bundled in the package): no
third-party script, no build step, and a Content-Security-Policy that lets the page reach only
this server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Annotated, Any

from fastapi import FastAPI, Query
from fastapi.responses import Response

from radixlm.runtime.api.protocol import JSON, CacheTree, OpenAPIDocs, Operation, error_responses
from radixlm.runtime.config.limits import DEFAULT_CACHE_TREE_NODES, MAX_CACHE_TREE_NODES
from radixlm.runtime.server.tokenizer_manager import TokenizerManager

# path -> (file in static/, media type); open: no data in them
PAGE_FILES = {
    "/dashboard": ("dashboard.html", "text/html; charset=utf-8"),
    "/dashboard/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def page_file(name: str) -> bytes:
    return resources.files("radixlm.runtime.server").joinpath("static", name).read_bytes()


def _file_route(content: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
    async def serve() -> Response:
        return Response(content, media_type=media_type, headers=PAGE_HEADERS)

    return serve


def server_counters(tm: TokenizerManager) -> dict[str, Any]:
    """The HTTP process's own counters (`Metrics`): the page derives TTFT / ITL over time from them."""
    m = tm.metrics
    return {"requests_started": m.requests_started, "requests_finished": m.requests_finished,
            "requests_aborted": m.requests_aborted, "prompt_tokens": m.prompt_tokens,
            "generation_tokens": m.generation_tokens, "ttft_sum": m.ttft.total, "ttft_count": m.ttft.count,
            "itl_sum": m.itl.total, "itl_count": m.itl.count}


def register_dashboard_routes(app: FastAPI, tm: TokenizerManager, docs: OpenAPIDocs, secured: bool) -> None:
    auth = (401,) if secured else ()

    @app.get("/cache_tree")
    async def cache_tree(
        max_nodes: Annotated[int, Query(ge=1, le=MAX_CACHE_TREE_NODES,
                                        description="the most tree nodes in the answer")] = DEFAULT_CACHE_TREE_NODES,
    ) -> Response:
        state = await tm.get_cache_tree(max_nodes)
        body = CacheTree.model_validate({**state, "server": server_counters(tm)})
        return Response(body.model_dump_json(), media_type=JSON)

    docs.add("/cache_tree", "get", Operation(responses={
        200: ("the radix cache's largest nodes, the KV pool and the requests", {JSON: CacheTree}),
        **error_responses(400, 503, *auth)}))

    for path, (name, media_type) in PAGE_FILES.items():
        app.add_api_route(path, _file_route(page_file(name), media_type), methods=["GET"],
                          include_in_schema=path == "/dashboard")
    docs.add("/dashboard", "get", Operation(responses={
        200: ("the dashboard page (open: it holds no data; it asks for the API key if /cache_tree answers 401)",
              {"text/html": {"type": "string"}})}))
