"""uvicorn's h11 protocol with a header timer, a body idle timer, a request deadline and a
connection cap (issues 19 and 38).

Plain uvicorn only closes idle keep-alive connections: a client that connects and sends nothing,
sends half a header line, or declares a body it never sends holds its connection forever. Here:

  header timer    armed when a connection opens, and on a keep-alive connection when the first
                  byte of the next request arrives; stopped once the request line and headers
                  are complete. It fires after --timeout-header seconds:
                    no byte of the request received  -> the connection is closed, no response;
                    part of the request line/headers -> 408 Request Timeout, then closed.
  body timer      armed while the request body is being received, restarted by every byte that
                  arrives; paused while uvicorn has stopped reading (the app has not consumed what
                  it has) or the client waits for `100 Continue`. It fires after --timeout-body
                  seconds without a byte: 408 if the response has not started (else no response),
                  the connection closed, and the app's pending receive() returns `http.disconnect`,
                  so its handler unwinds (Starlette raises ClientDisconnect).
  request timer   the overall deadline: armed by a request's first byte, stopped once its line,
                  headers and body are all received; never restarted in between, so a client that
                  trickles a byte just inside each idle timeout is still stopped. It fires after
                  --timeout-request seconds: 408 if the response has not started (else no
                  response), the connection closed, and a handler reading the body sees a
                  disconnect, as for the body timer. Paused, like the body timer, while the
                  server is the one not reading.
  connection cap  a connection opened while --max-connections others are open gets 503 at once;
                  its input is then read and dropped until the client closes or the header timer
                  fires, so that the client reads the 503 rather than a connection reset.

Between requests on a keep-alive connection uvicorn's own timer (timeout_keep_alive) closes an
idle connection; the header timer takes over from the next request's first byte, so the two are
never armed together.

Why not uvicorn's `limit_concurrency`: it is checked when a request head arrives, counts the open
connections (the asking one included) and the running request tasks, and answers 503 to whichever
request asks, an old keep-alive connection's too, while idle sockets beyond it are never refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)


def error_response(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response with our JSON error body and `Connection: close`, as raw bytes:
    h11 cannot send a response before it has a complete request head."""
    body = json.dumps({"error": {"message": message, "code": status}}).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class TimedH11Protocol(H11Protocol):
    """One per connection (uvicorn makes it); timeouts in seconds. Invariant after every event:
    the header timer is armed iff a request head is awaited (on a new connection, or with bytes of
    it buffered), the body timer iff the request body is being received, the request timer iff
    some but not all of a request has been received (it is not re-armed while it stays so)."""

    def __init__(self, *args: Any, timeout_header: float, timeout_body: float, max_connections: int,
                 timeout_request: float = float("inf"), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_header = timeout_header
        self.timeout_body = timeout_body
        self.timeout_request = timeout_request
        self.max_connections = max_connections
        self.header_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.request_timer: asyncio.TimerHandle | None = None
        self.is_refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # adds this connection to self.connections
        if len(self.connections) > self.max_connections:
            logger.warning("503 to %s: already %d connections open (--max-connections)",
                           self.peer, self.max_connections)
            self.is_refused = True
            transport.write(error_response(503, f"the server has {self.max_connections} connections open; retry later"))
            if transport.can_write_eof():
                transport.write_eof()  # our side is done; theirs is read (and dropped) until they close
        self.sync_timers()

    def data_received(self, data: bytes) -> None:
        if self.is_refused:
            return  # dropped: closing with unread input would reset the connection before the 503 is read
        super().data_received(data)
        self.cancel_body_timer()  # a byte arrived: the body timer starts over
        self.sync_timers()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timer, runs pipelined requests
        self.sync_timers()

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_header_timer()
        self.cancel_body_timer()
        self.cancel_request_timer()
        super().connection_lost(exc)

    def sync_timers(self) -> None:
        """Arm or stop the timers to match h11's state (see the class docstring)."""
        their_state = self.conn.their_state
        is_closing = self.transport.is_closing()
        if not is_closing and their_state is h11.IDLE and (self.cycle is None or self.received_head_bytes()):
            if self.header_timer is None:
                self._unset_keepalive_if_required()
                self.header_timer = self.loop.call_later(self.timeout_header, self.on_header_timeout)
        else:
            self.cancel_header_timer()
        if not is_closing and their_state is h11.SEND_BODY:
            if self.body_timer is None:
                self.body_timer = self.loop.call_later(self.timeout_body, self.on_body_timeout)
        else:
            self.cancel_body_timer()
        is_receiving = their_state is h11.SEND_BODY or (their_state is h11.IDLE and self.received_head_bytes())
        if not is_closing and is_receiving:
            if self.request_timer is None and self.timeout_request < float("inf"):
                self.request_timer = self.loop.call_later(self.timeout_request, self.on_request_timeout)
        else:
            self.cancel_request_timer()

    @property
    def peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"

    def received_head_bytes(self) -> bool:
        return bool(self.conn.trailing_data[0])  # bytes h11 holds but has not yet parsed into a request

    def on_header_timeout(self) -> None:
        self.header_timer = None
        if self.transport.is_closing():
            return
        if self.received_head_bytes():
            logger.info("408 to %s: request headers not complete within %gs", self.peer, self.timeout_header)
            self.transport.write(error_response(408, f"the request line and headers did not arrive within "
                                                     f"{self.timeout_header:g} seconds"))
        self.transport.close()

    def on_body_timeout(self) -> None:
        self.body_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        if self.is_server_not_reading():
            self.body_timer = self.loop.call_later(self.timeout_body, self.on_body_timeout)
            return
        logger.info("408 to %s: no request body byte for %gs", self.peer, self.timeout_body)
        self.abandon_body(f"the request body stalled: no byte for {self.timeout_body:g} seconds")

    def on_request_timeout(self) -> None:
        self.request_timer = None
        if self.transport.is_closing():
            return
        message = f"the request (line, headers and body) did not arrive whole within {self.timeout_request:g} seconds"
        their_state = self.conn.their_state
        if their_state is h11.IDLE and self.received_head_bytes():
            logger.info("408 to %s: request head not complete within %gs (--timeout-request)",
                        self.peer, self.timeout_request)
            self.transport.write(error_response(408, message))
            self.transport.close()
        elif their_state is h11.SEND_BODY:
            if self.is_server_not_reading():
                self.request_timer = self.loop.call_later(self.timeout_request, self.on_request_timeout)
                return
            logger.info("408 to %s: request body not complete within %gs (--timeout-request)",
                        self.peer, self.timeout_request)
            self.abandon_body(message)

    def is_server_not_reading(self) -> bool:
        """True while the client waits for us: uvicorn paused reading (the app has not taken what
        arrived) or the client waits for `100 Continue`."""
        return bool(self.flow.read_paused or self.cycle.waiting_for_100_continue)

    def abandon_body(self, message: str) -> None:
        """Give up on a request whose body is being received: 408 with `message` if the response
        has not started, the connection closed, and the app's pending receive() returns
        `http.disconnect` (its send() is then a no-op), so its handler unwinds."""
        if not self.cycle.response_started:
            self.transport.write(error_response(408, message))
        self.cycle.disconnected = True
        self.cycle.message_event.set()
        self.transport.close()

    def cancel_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def cancel_body_timer(self) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None

    def cancel_request_timer(self) -> None:
        if self.request_timer is not None:
            self.request_timer.cancel()
            self.request_timer = None
