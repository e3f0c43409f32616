"""Local stand-ins for remote LLM APIs, for the language's remote backends: real HTTP servers on
127.0.0.1 that speak Anthropic's Messages API and Vertex AI's generateContent API (JSON and SSE
streams, as documented), check each request's shape and credentials, and answer by relaying the
conversation to our own server's OpenAI chat API (the tiny model), so what comes back is real
generation. Every request body they accept is kept in `requests` for the tests to inspect."""

from __future__ import annotations

import http.server
import json
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx

ANTHROPIC_KEYS = {"model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p", "top_k",
                  "stream", "metadata"}
VERTEX_CONFIG_KEYS = {"maxOutputTokens", "temperature", "topP", "topK", "stopSequences", "candidateCount"}
VERTEX_PATH = re.compile(r"/v1/projects/([^/]+)/locations/([^/]+)/publishers/google/models/([^/:]+):(generateContent|"
                         r"streamGenerateContent)(\?alt=sse)?$")


class ApiError(Exception):
    def __init__(self, status: int, body: dict[str, Any]):
        self.status, self.body = status, body


class StandIn:
    """A threaded HTTP server; subclasses answer POSTs in `answer`."""

    def __init__(self, upstream: str, model: str, credential: str):
        self.upstream, self.model, self.credential = upstream, model, credential
        self.requests: list[dict[str, Any]] = []
        handler = type("Handler", (_Handler,), {"standin": self})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, path: str, headers: Any, body: dict[str, Any]) -> Any:
        raise NotImplementedError

    def relay(self, messages: list[dict[str, str]], max_tokens: int, n: int = 1, **params: Any) -> dict[str, Any]:
        """Our server's chat completion of `messages` (stops are applied by the caller)."""
        request = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "n": n,
                   **{k: v for k, v in params.items() if v is not None}}
        response = httpx.post(self.upstream + "/v1/chat/completions", json=request, timeout=120)
        if response.status_code != 200:
            raise ApiError(502, {"error": {"message": response.text}})
        return dict(response.json())


def apply_stops(text: str, stops: list[str]) -> tuple[str, str | None]:
    """`text` cut before the earliest stop sequence, and which one."""
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    start, stop = min(hits)
    return text[:start], stop


class AnthropicStandIn(StandIn):
    def answer(self, path: str, headers: Any, body: dict[str, Any]) -> Any:
        if path != "/v1/messages":
            raise ApiError(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
        # the key as `x-api-key` (older clients) or a bearer token (newer ones)
        if self.credential not in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer ")):
            raise ApiError(401, {"type": "error", "error": {"type": "authentication_error", "message": "invalid api key"}})
        if not headers.get("anthropic-version"):
            raise ApiError(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "anthropic-version"}})
        problem = _anthropic_problem(body)
        if problem:
            raise ApiError(400, {"type": "error", "error": {"type": "invalid_request_error", "message": problem}})
        self.requests.append(body)
        messages = ([{"role": "system", "content": body["system"]}] if body.get("system") else []) + body["messages"]
        done = self.relay(messages, body["max_tokens"], temperature=body.get("temperature"), top_p=body.get("top_p"),
                          top_k=body.get("top_k"))
        choice, usage = done["choices"][0], done["usage"]
        text, stop = apply_stops(choice["message"]["content"] or "", body.get("stop_sequences") or [])
        reason = "stop_sequence" if stop else {"length": "max_tokens"}.get(choice["finish_reason"], "end_turn")
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        message = {"id": f"msg_{uuid.uuid4().hex[:20]}", "type": "message", "role": "assistant", "model": body["model"],
                   "content": [{"type": "text", "text": text}], "stop_reason": reason, "stop_sequence": stop,
                   "usage": {"input_tokens": usage["prompt_tokens"] - cached, "output_tokens": usage["completion_tokens"],
                             "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}}
        if not body.get("stream"):
            return message
        return self._events(message)

    @staticmethod
    def _events(message: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """The message as Messages API stream events (text in a few deltas)."""
        text = message["content"][0]["text"]
        start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {**message["usage"], "output_tokens": 1}}
        yield "message_start", {"type": "message_start", "message": start}
        yield "content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        for i in range(0, len(text), 3):
            delta = {"type": "text_delta", "text": text[i : i + 3]}
            yield "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": 0}
        yield "message_delta", {"type": "message_delta", "usage": {"output_tokens": message["usage"]["output_tokens"]},
                                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}}
        yield "message_stop", {"type": "message_stop"}


def _anthropic_problem(body: dict[str, Any]) -> str | None:
    extra = set(body) - ANTHROPIC_KEYS
    if extra:
        return f"{sorted(extra)}: Extra inputs are not permitted"
    if not isinstance(body.get("model"), str) or not isinstance(body.get("max_tokens"), int):
        return "model and max_tokens are required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or messages[0].get("role") != "user":
        return "messages: a non-empty list starting with a user turn"
    for m in messages:
        if m.get("role") not in ("user", "assistant") or not isinstance(m.get("content"), (str, list)):
            return f"messages: bad turn {m!r}"
    if "system" in body and not isinstance(body["system"], (str, list)):
        return "system: a string or a list of text blocks"
    return None


class VertexStandIn(StandIn):
    def answer(self, path: str, headers: Any, body: dict[str, Any]) -> Any:
        match = VERTEX_PATH.fullmatch(path)
        if match is None:
            raise ApiError(404, {"error": {"code": 404, "message": f"no such method {path}", "status": "NOT_FOUND"}})
        if headers.get("authorization") != f"Bearer {self.credential}":
            raise ApiError(401, {"error": {"code": 401, "message": "invalid credentials", "status": "UNAUTHENTICATED"}})
        config = body.get("generationConfig") or {}
        contents = body.get("contents")
        if set(config) - VERTEX_CONFIG_KEYS or not isinstance(contents, list) or not contents or any(
                c.get("role") not in ("user", "model") or not c.get("parts") for c in contents):
            raise ApiError(400, {"error": {"code": 400, "message": "invalid request", "status": "INVALID_ARGUMENT"}})
        self.requests.append({"path": path, **body})
        system = " ".join(p["text"] for p in (body.get("systemInstruction") or {}).get("parts", []))
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "assistant" if c["role"] == "model" else "user", "content": "".join(p["text"] for p in c["parts"])}
            for c in contents]
        done = self.relay(messages, config.get("maxOutputTokens", 64), n=config.get("candidateCount", 1),
                          temperature=config.get("temperature"), top_p=config.get("topP"), top_k=config.get("topK"))
        usage = done["usage"]
        candidates = []
        for choice in done["choices"]:
            text, stop = apply_stops(choice["message"]["content"] or "", config.get("stopSequences") or [])
            finish = "STOP" if stop or choice["finish_reason"] != "length" else "MAX_TOKENS"
            candidates.append({"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": finish,
                               "index": choice["index"]})
        response = {"candidates": candidates, "modelVersion": match.group(3), "responseId": uuid.uuid4().hex,
                    "usageMetadata": {"promptTokenCount": usage["prompt_tokens"],
                                      "candidatesTokenCount": usage["completion_tokens"],
                                      "totalTokenCount": usage["total_tokens"],
                                      "cachedContentTokenCount": (usage.get("prompt_tokens_details") or {}).get(
                                          "cached_tokens", 0)}}
        if match.group(4) == "generateContent":
            return response
        return self._chunks(response)

    @staticmethod
    def _chunks(response: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """The response as streamGenerateContent's SSE chunks: text pieces, then the finish and usage."""
        text = response["candidates"][0]["content"]["parts"][0]["text"]
        for i in range(0, len(text), 4):
            yield "", {"candidates": [{"content": {"role": "model", "parts": [{"text": text[i : i + 4]}]}, "index": 0}]}
        last = response["candidates"][0]
        yield "", {**response, "candidates": [{**last, "content": {"role": "model", "parts": [{"text": ""}]}}]}


class _Handler(http.server.BaseHTTPRequestHandler):
    standin: StandIn
    protocol_version = "HTTP/1.1"
    timeout = 30  # an idle keep-alive connection is dropped after this long (its thread ends)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass

    def do_POST(self) -> None:  # noqa: N802 (the base class's name)
        length = int(self.headers.get("content-length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            headers = {k.lower(): v for k, v in self.headers.items()}
            result = self.standin.answer(self.path, headers, body)
        except ApiError as e:
            self._send(e.status, e.body)
            return
        if isinstance(result, dict):
            self._send(200, result)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for event, data in result:
            prefix = f"event: {event}\n" if event else ""
            self.wfile.write(f"{prefix}data: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()
        self.close_connection = True

    def _send(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
