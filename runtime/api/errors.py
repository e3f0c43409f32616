"""The error a request gets from either door, the Engine's or the server's: a message and the
HTTP status the server answers with. Each subsystem's own error (`GrammarError`,
`InvalidSamplingParams`, ...) stays in its room; the door turns it into this one."""

from __future__ import annotations


class RequestError(ValueError):
    """A client request is malformed or out of range; the server answers 400 with this message."""

    def __init__(self, message: str, status_code: int = 400):
        super().__init__(message)
        self.status_code = status_code
