"""Errors shared by the server's modules; torch-free, so the language can use the pure helpers
(e.g. tool_calls) that raise them."""

from __future__ import annotations


class RequestError(ValueError):
    """A client request is malformed or out of range; the server answers 400 with this message."""

    def __init__(self, message: str, status_code: int = 400):
        super().__init__(message)
        self.status_code = status_code
