"""Slow and malformed connections through the real server (issues 19 and 38): the header timer,
the body idle timer, the request deadline and the connection cap of
runtime/server/http_protocol.py, driven by raw sockets.

No test measures elapsed time: each blocks on recv (with a generous socket timeout) and checks
what arrives. One server has 1-second timers; the cap and the request deadline are tested on a
second server whose idle timers are long enough that idle sockets stay open and a trickle never
trips them.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h11
import httpx
import pytest
from conftest import ServerHandle, start_server
from radixlm_testing import wait_until

from radixlm.runtime.config.server_args import ServerArgs, add_cli_args, from_cli_args
from radixlm.runtime.server.http_protocol import error_response

RECV_TIMEOUT = 60.0  # a socket waits this long for the server before the test fails
GENERATE = {"text": "Hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
DEADLINE = 2  # --timeout-request of the "capped" server: seconds for a whole request
TRICKLE_PAUSE = 0.25  # seconds the trickling client waits for an answer before its next byte


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerHandle]]:
    """Both servers, started side by side: "timed" with 1-second timers, "capped" with a header
    timer long enough that idle sockets stay open."""
    logs = tmp_path_factory.mktemp("slow")
    flags = {"timed": ("--log-level", "info", "--timeout-header", "1", "--timeout-body", "1", "--max-connections", "4"),
             "capped": ("--timeout-header", "600", "--max-connections", "2", "--timeout-request", str(DEADLINE))}
    with ThreadPoolExecutor(len(flags)) as pool:
        futures = {name: pool.submit(start_server, tiny_model_dir, logs / f"{name}.log", "--max-total-tokens", "1024", *f)
                   for name, f in flags.items()}
        started = {name: future.result() for name, future in futures.items()}
    yield started
    exit_codes = {name: server.stop() for name, server in started.items()}
    assert exit_codes == {"timed": 0, "capped": 0}
    for server in started.values():
        # every handler unwound: shutdown did not wait on a request task, nothing raised
        assert "Waiting for background tasks" not in server.log()
        assert "Traceback" not in server.log()


@pytest.fixture
def timed_server(servers: dict[str, ServerHandle]) -> ServerHandle:
    return servers["timed"]


@pytest.fixture
def capped_server(servers: dict[str, ServerHandle]) -> ServerHandle:
    return servers["capped"]


def connect(server: ServerHandle) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
    sock.settimeout(RECV_TIMEOUT)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def parse_response(raw: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    """(status, headers, body) of the one whole response in `raw`, read by h11 as a client would."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(raw)
    conn.receive_data(b"")
    head = conn.next_event()
    assert isinstance(head, h11.Response), raw
    body = b""
    while isinstance(event := conn.next_event(), h11.Data):
        body += event.data
    assert isinstance(event, h11.EndOfMessage), raw
    return head.status_code, dict(head.headers), body


def assert_error(raw: bytes, status: int) -> None:
    code, headers, body = parse_response(raw)
    assert code == status
    assert headers[b"connection"] == b"close"
    error = json.loads(body)["error"]
    assert error["code"] == status and error["message"]


def post_head(content_length: int) -> bytes:
    return (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % content_length)


def server_connection_count(server: ServerHandle) -> int:
    """TCP connections the server process holds on its port (from /proc: sockets it has accepted
    and not yet closed; one the kernel queued but the server has not accepted is not counted)."""
    port = int(server.url.rsplit(":", 1)[1])
    fd_dir = Path(f"/proc/{server.proc.pid}/fd")
    inodes = set()
    for fd in fd_dir.iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] != "0A" and fields[9] in inodes:  # 0A: LISTEN
                count += 1
    return count


def wait_connection_count(server: ServerHandle, expected: int) -> None:
    """Poll until the server holds `expected` connections (an event, not a delay: fails only if it never happens)."""
    wait_until(lambda: server_connection_count(server) == expected, f"the server holding {expected} connections")


def test_flags_parse_with_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    defaults = from_cli_args(parser.parse_args([]))
    assert (defaults.timeout_header, defaults.timeout_body, defaults.timeout_request,
            defaults.max_connections) == (10.0, 30.0, 30.0, 512)
    given = from_cli_args(parser.parse_args(["--timeout-header", "2.5", "--timeout-body", "4", "--max-connections", "7",
                                             "--timeout-request", "9"]))
    assert (given.timeout_header, given.timeout_body, given.timeout_request, given.max_connections) == (2.5, 4.0, 9.0, 7)
    for bad in ({"timeout_header": 0}, {"timeout_body": -1.0}, {"timeout_body": float("nan")},
                {"timeout_header": float("inf")}, {"max_connections": 0}, {"timeout_request": 0},
                {"timeout_request": float("inf")}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ServerArgs(**bad)  # type: ignore[arg-type]


def test_error_response_is_valid_http() -> None:
    assert_error(error_response(408, "too slow"), 408)
    assert_error(error_response(503, "too many"), 503)


def test_silent_socket_is_closed_without_response(timed_server: ServerHandle) -> None:
    with connect(timed_server) as sock:
        assert read_until_closed(sock) == b""


def test_partial_header_gets_408(timed_server: ServerHandle) -> None:
    with connect(timed_server) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Ty")
        assert_error(read_until_closed(sock), 408)


def test_stalled_body_gets_408_and_server_goes_on(timed_server: ServerHandle) -> None:
    with connect(timed_server) as sock:
        sock.sendall(post_head(100) + b'{"')
        assert_error(read_until_closed(sock), 408)
    reply = httpx.post(timed_server.url + "/generate", json=GENERATE, timeout=RECV_TIMEOUT)
    assert reply.status_code == 200 and reply.json()["meta_info"]["completion_tokens"] == 2
    # the handler saw a disconnect: one INFO line (the fixture checks there was no traceback)
    assert "client disconnected before sending the whole request body (POST /generate)" in timed_server.log()


def test_body_in_pieces_is_served(timed_server: ServerHandle) -> None:
    body = json.dumps(GENERATE).encode()[:-1] + b" " * 2048 + b"}"  # 2 KB: JSON allows the spaces
    pieces = [body[:100], body[100:1500], body[1500:]]
    with connect(timed_server) as sock:
        sock.sendall(post_head(len(body))[:-2] + b"Connection: close\r\n\r\n")
        for piece in pieces:
            sock.sendall(piece)
        code, _, reply = parse_response(read_until_closed(sock))
    assert code == 200, reply
    assert json.loads(reply)["meta_info"]["completion_tokens"] == 2


def test_keep_alive_second_request_partial_header_gets_408(timed_server: ServerHandle) -> None:
    """The header timer restarts for a keep-alive connection's next request."""
    with connect(timed_server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while b"\r\n\r\n" not in received:  # /health: a head and a short body
            received += sock.recv(65536)
        assert received.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /health HTTP/1.1\r\nHo")
        rest = read_until_closed(sock)
        assert b"HTTP/1.1 408 Request Timeout\r\n" in rest


def test_pipelined_requests_are_served(timed_server: ServerHandle) -> None:
    """Two requests in one packet: the second is parsed from the buffer after the first response,
    where the timers are re-synchronised."""
    with connect(timed_server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + post_head(len(json.dumps(GENERATE)))[:-2]
                     + b"Connection: close\r\n\r\n" + json.dumps(GENERATE).encode())
        received = read_until_closed(sock)
    assert received.startswith(b"HTTP/1.1 200 ") and received.count(b"HTTP/1.1 200 ") == 2, received
    assert b'"completion_tokens":2' in received


def test_connection_beyond_cap_gets_503(capped_server: ServerHandle) -> None:
    """--max-connections 2: a connection opened while one is open is served, one opened while two
    are open gets 503 (whatever it sends); once they close, new connections are served again."""
    health = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    wait_connection_count(capped_server, 0)
    with connect(capped_server):
        wait_connection_count(capped_server, 1)
        with connect(capped_server) as sock:
            sock.sendall(health)
            assert parse_response(read_until_closed(sock))[0] == 200
        with connect(capped_server):
            wait_connection_count(capped_server, 2)
            with connect(capped_server) as sock:
                sock.sendall(health)
                assert_error(read_until_closed(sock), 503)
            with connect(capped_server) as sock:  # refused before it sends a byte
                assert_error(read_until_closed(sock), 503)
    wait_connection_count(capped_server, 0)
    # the server drops a connection from its count just after closing its socket: retry on that
    statuses = []
    while len(statuses) < 20 and 200 not in statuses:
        statuses.append(httpx.get(capped_server.url + "/health", timeout=RECV_TIMEOUT).status_code)
    assert statuses[-1] == 200 and set(statuses) <= {200, 503}, statuses


def trickle(sock: socket.socket, data: bytes) -> tuple[int, bytes]:
    """Send `data` a byte at a time, before each byte waiting up to TRICKLE_PAUSE for the server
    to answer or close (a pace far inside the idle timers, never a wait for an ordering); then read
    until the server closes. Returns (bytes sent, everything received)."""
    for sent in range(len(data)):
        if select.select([sock], [], [], TRICKLE_PAUSE)[0]:  # the server spoke or closed
            return sent, read_until_closed(sock)
        try:
            sock.sendall(data[sent:sent + 1])
        except OSError:  # closed between our look and our byte
            return sent + 1, read_until_closed(sock)
    return len(data), read_until_closed(sock)


@pytest.mark.parametrize("part", ["head", "body"])
def test_a_trickled_request_gets_408_at_the_deadline(capped_server: ServerHandle, part: str) -> None:
    """--timeout-request: a request trickled a byte at a time (the head, or the body after a whole
    head), each byte well inside the idle timers, still gets 408 and a closed connection before
    it is whole: an overall deadline, not one per read."""
    body = json.dumps(GENERATE).encode()[:-1] + b" " * 4096 + b"}"
    head = post_head(len(body))
    with connect(capped_server) as sock:
        if part == "body":
            sock.sendall(head)
            sent, received = trickle(sock, body)
            assert sent < len(body)
        else:
            sent, received = trickle(sock, head + body)
            assert sent < len(head)
    assert_error(received, 408)
    message = json.loads(parse_response(received)[2])["error"]["message"]
    assert message == f"the request (line, headers and body) did not arrive whole within {DEADLINE} seconds"
    # the server goes on, and a whole request is served
    reply = httpx.post(capped_server.url + "/generate", json=GENERATE, timeout=RECV_TIMEOUT)
    assert reply.status_code == 200 and reply.json()["meta_info"]["completion_tokens"] == 2
