"""Program traces sent by the language (`radixlm.trace`): `POST /traces` takes a run's model
calls (counts and times, no text; at most MAX_TRACE_CALLS_PER_POST per request), `GET /traces`
gives the newest back for the dashboard's timeline. Both follow the API-key rules.

The server keeps the newest TRACE_CALLS_KEPT entries in the main process's memory (a ring: an
old entry drops out when a new one comes), so what clients send cannot grow it. Nothing is
written to disk and nothing reaches the scheduler.
"""

from __future__ import annotations

from collections import deque
from typing import Annotated

from fastapi import FastAPI, Query, Request

from radixlm.runtime.api.protocol import (
    JSON,
    OpenAPIDocs,
    Operation,
    TraceCall,
    TracesAccepted,
    TracesInput,
    TracesOutput,
    error_responses,
    parse_body,
)
from radixlm.runtime.config.limits import TRACE_CALLS_KEPT
from radixlm.runtime.server.http_common import read_json  # the one body reader (its checks)


class TraceStore:
    def __init__(self, capacity: int = TRACE_CALLS_KEPT):
        self.entries: deque[TraceCall] = deque(maxlen=capacity)

    def add(self, calls: list[TraceCall]) -> None:
        self.entries.extend(calls)

    def newest(self, count: int) -> list[TraceCall]:
        """The newest `count` entries, oldest first."""
        skip = max(0, len(self.entries) - count)
        return [call for i, call in enumerate(self.entries) if i >= skip]


def register_trace_routes(app: FastAPI, docs: OpenAPIDocs, secured: bool) -> TraceStore:
    store = TraceStore()
    auth = (401,) if secured else ()

    @app.post("/traces")
    async def post_traces(request: Request) -> TracesAccepted:
        body: TracesInput = parse_body(TracesInput, await read_json(request))
        store.add(body.entries)
        return TracesAccepted(accepted=len(body.entries), kept=len(store.entries))

    @app.get("/traces")
    async def get_traces(
        max_entries: Annotated[int, Query(ge=1, le=TRACE_CALLS_KEPT, description="the most entries")] = 500,
    ) -> TracesOutput:
        return TracesOutput(entries=store.newest(max_entries))

    docs.add("/traces", "post", Operation(TracesInput, {
        200: ("taken (the server keeps the newest 2000 entries)", {JSON: TracesAccepted}),
        **error_responses(400, 413, *auth)}))
    docs.add("/traces", "get", Operation(responses={
        200: ("the newest entries, oldest first", {JSON: TracesOutput}), **error_responses(400, *auth)}))
    return store
