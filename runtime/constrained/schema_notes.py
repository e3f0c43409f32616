"""Which keywords a schema's rewrite served by a *stricter* form (`note`, `noting`).

A stricter rewrite (docs/json-schema.md) never lets an invalid output through, but it may leave
out valid ones, sometimes most of them (GitLab's `when: delayed` jobs only, an action that is not
composite). The response says so: the door collects the keywords here while it rewrites a
schema (`schema_rewrite`, `engine_choice.for_engine`) and reports them beside the engine
(`meta_info.schema_stricter`, the OpenAI responses' `schema_stricter`). A keyword is named where
its rewrite *may* leave out a valid value; an exact rewrite names nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_NOTED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("schema_stricter", default=None)


def note(keyword: str) -> None:
    """Record that `keyword` was served by a stricter form (no-op outside `noting`)."""
    noted = _NOTED.get()
    if noted is not None and keyword not in noted:
        noted.append(keyword)


@contextlib.contextmanager
def noting() -> Iterator[list[str]]:
    """The keywords `note`d inside the block, in the order first noted."""
    noted: list[str] = []
    token = _NOTED.set(noted)
    try:
        yield noted
    finally:
        _NOTED.reset(token)
