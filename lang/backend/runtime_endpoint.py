"""RuntimeEndpoint: a program's backend over HTTP, speaking the native /generate API (ours, or a
real SGLang server's: the same protocol)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

from radixlm.backend.base import BackendError, NativeBackend
from radixlm.formats.chat_template import CHATML, ChatTemplate

TRACE_CALLS_PER_POST = 256  # the server's limit (runtime.limits.MAX_TRACE_CALLS_PER_POST)


class RuntimeEndpoint(NativeBackend):
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0, chat_template: ChatTemplate | None = None):
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))
        self.model_info = self._request("GET", "/get_model_info")
        published = self.model_info.get("chat_template")
        # a server that does not publish its role wrappers (a real SGLang server) gets ChatML
        self.chat_template = chat_template or (ChatTemplate.from_dict(published) if isinstance(published, dict) else CHATML)

    def describe(self) -> str:
        return f"the model {self.model_info.get('model_path', '(unnamed)')} at {self.base_url}"

    def call(self, payload: dict[str, Any]) -> Any:
        return self._request("POST", "/generate", payload)

    def call_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        try:
            with self._client.stream("POST", "/generate", json=payload) as response:
                if response.status_code != 200:
                    response.read()
                    raise self._http_error(response)
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    item = json.loads(data)
                    if "error" in item:
                        raise BackendError(f"{self.base_url}/generate: {item['error'].get('message')}")
                    yield item
        except httpx.TransportError as e:
            raise self._connection_error(e) from e

    def flush_cache(self) -> bool:
        try:
            return self._client.post("/flush_cache").status_code == 200
        except httpx.TransportError as e:
            raise self._connection_error(e) from e

    def send_trace(self, trace: Any) -> int:
        """Send a run's trace (`state.trace()`, a ProgramTrace) to the server's `POST /traces`
        (its dashboard draws it), in parts of at most TRACE_CALLS_PER_POST; returns the count sent."""
        calls = trace.to_calls()
        for start in range(0, len(calls), TRACE_CALLS_PER_POST):
            self._request("POST", "/traces", {"entries": calls[start : start + TRACE_CALLS_PER_POST]})
        return len(calls)

    def get_server_info(self) -> dict[str, Any]:
        return self._request("GET", "/get_server_info")

    def shutdown(self) -> None:
        self._client.close()

    def _request(self, method: str, path: str, payload: Any = None) -> Any:
        try:
            response = self._client.request(method, path, json=payload)
        except httpx.TransportError as e:
            raise self._connection_error(e) from e
        if response.status_code != 200:
            raise self._http_error(response)
        return response.json()

    def _connection_error(self, e: Exception) -> BackendError:
        return BackendError(f"cannot reach the server at {self.base_url}: {e or type(e).__name__}")

    def _http_error(self, response: httpx.Response) -> BackendError:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        return BackendError(f"{self.base_url}{response.request.url.path} answered {response.status_code}: {message}")
