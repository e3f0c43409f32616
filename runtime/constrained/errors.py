"""The one error a request's grammar can raise: the request is rejected (HTTP 400), never a crash."""

from __future__ import annotations


class GrammarError(ValueError):
    """A grammar that cannot be used: bad regex, invalid or unsupported JSON schema, bad choices,
    or a regex the token index cannot be built for. The message names the problem."""
