"""VertexAI: a program's backend over Vertex AI's Gemini REST API (`models/{model}:generateContent`
and `:streamGenerateContent?alt=sse`), with httpx (no Google SDK needed).

`VertexAI(model_name, safety_settings=None, project=..., location=..., access_token=...)`: the
project and location default to GCP_PROJECT_ID and GCP_LOCATION (as SGLang reads them; location
else us-central1); the OAuth access token to the `access_token` argument, else
GOOGLE_OAUTH_ACCESS_TOKEN, else the application-default credentials of `google-auth` when that
package is installed. `base_url` overrides `https://{location}-aiplatform.googleapis.com`.

How program steps map onto the API: as on the Anthropic backend, a gen opens an assistant
message; system messages become `systemInstruction`, user/assistant messages `contents` (roles
user/model). max_new_tokens -> maxOutputTokens, n -> candidateCount, stop -> stopSequences,
temperature, top_p, top_k as they are. select (no log-probabilities), tools, grammars and the
sampling extensions raise NotSupportedError.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from radixlm.backend.base import Backend, BackendError, NotSupportedError, chat_messages, refuse_unsupported
from radixlm.ir import Gen, SamplingArgs

if TYPE_CHECKING:
    from radixlm.interpreter import StreamExecutor

_SUPPORTED = {"max_new_tokens", "n", "stop", "temperature", "top_p", "top_k", "skip_special_tokens"}
_CONFIG = {"max_new_tokens": "maxOutputTokens", "n": "candidateCount", "temperature": "temperature",
           "top_p": "topP", "top_k": "topK"}
_FINISH = {"STOP": "stop", "MAX_TOKENS": "length"}


class VertexAI(Backend):
    sends_messages = True

    def __init__(self, model_name: str, safety_settings: list[dict[str, Any]] | None = None, *,
                 project: str | None = None, location: str | None = None, access_token: str | None = None,
                 base_url: str | None = None, timeout: float = 600.0):
        project = project or os.environ.get("GCP_PROJECT_ID")
        if not project:
            raise ValueError("VertexAI needs a Google Cloud project: pass project= or set GCP_PROJECT_ID")
        location = location or os.environ.get("GCP_LOCATION") or "us-central1"
        self.model_name = model_name
        self.safety_settings = safety_settings
        self.base_url = (base_url or f"https://{location}-aiplatform.googleapis.com").rstrip("/")
        self.model_path = f"/v1/projects/{quote(project, safe='')}/locations/{quote(location, safe='')}" \
                          f"/publishers/google/models/{quote(model_name, safe='')}"
        token = access_token or os.environ.get("GOOGLE_OAUTH_ACCESS_TOKEN") or _default_credentials_token()
        self._http = httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx.Timeout(timeout, connect=10.0))

    def describe(self) -> str:
        return f"the model {self.model_name!r} at {self.base_url}"

    def generate(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> tuple[Any, Any]:
        body = self._body(s, gen, sampling)
        try:
            response = self._http.post(f"{self.model_path}:generateContent", json=body)
        except httpx.TransportError as e:
            raise BackendError(f"cannot reach Vertex AI at {self.base_url}: {e or type(e).__name__}") from e
        data = self._checked(response)
        candidates = sorted(data.get("candidates") or [], key=lambda c: c.get("index", 0))
        if not candidates:
            raise BackendError(f"Vertex AI answered without a candidate: {json.dumps(data)[:300]}")
        texts = [_text(c) for c in candidates]
        metas = [_meta(data, c, data.get("usageMetadata") if i == 0 else None) for i, c in enumerate(candidates)]
        return (texts, metas) if (sampling.n or 1) > 1 else (texts[0], metas[0])

    def generate_stream(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> Iterator[tuple[str, dict[str, Any] | None]]:
        body = self._body(s, gen, sampling)
        last: dict[str, Any] = {}
        candidate: dict[str, Any] = {}
        try:
            with self._http.stream("POST", f"{self.model_path}:streamGenerateContent", params={"alt": "sse"},
                                   json=body) as response:
                if response.status_code != 200:
                    response.read()
                    self._checked(response)
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    last = json.loads(line[5:])
                    for candidate in last.get("candidates") or []:
                        piece = _text(candidate)
                        if piece:
                            yield piece, None
        except httpx.TransportError as e:
            raise BackendError(f"cannot reach Vertex AI at {self.base_url}: {e or type(e).__name__}") from e
        yield "", _meta(last, candidate, last.get("usageMetadata"))

    def shutdown(self) -> None:
        self._http.close()

    def _body(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> dict[str, Any]:
        refuse_unsupported(sampling, gen, "Vertex AI API", _SUPPORTED)
        messages = chat_messages(s, "Vertex AI API")
        contents = []
        for m in messages:
            if m["role"] not in ("system", "user", "assistant"):
                raise NotSupportedError("the VertexAI backend takes system, user and assistant messages only")
            if m["role"] != "system":
                contents.append({"role": "model" if m["role"] == "assistant" else "user", "parts": [{"text": m["content"]}]})
        body: dict[str, Any] = {"contents": contents}
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        if system:
            body["systemInstruction"] = {"parts": [{"text": system}]}
        config = {api: getattr(sampling, key) for key, api in _CONFIG.items() if getattr(sampling, key) is not None}
        if sampling.stop:
            config["stopSequences"] = [sampling.stop] if isinstance(sampling.stop, str) else list(sampling.stop)
        if config:
            body["generationConfig"] = config
        if self.safety_settings:
            body["safetySettings"] = self.safety_settings
        return body

    def _checked(self, response: httpx.Response) -> dict[str, Any]:
        try:
            data = response.json()
        except ValueError:
            data = {}
        if response.status_code != 200:
            message = (data.get("error") or {}).get("message") if isinstance(data, dict) else None
            raise BackendError(f"{self.base_url} answered {response.status_code}: {message or response.text[:300]}")
        return data if isinstance(data, dict) else {}


def _default_credentials_token() -> str:
    try:
        import google.auth
        import google.auth.transport.requests
    except ImportError:
        raise BackendError("VertexAI needs an OAuth access token: pass access_token=, set GOOGLE_OAUTH_ACCESS_TOKEN, "
                           "or install google-auth for application-default credentials") from None
    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    credentials.refresh(google.auth.transport.requests.Request())
    return str(credentials.token)


def _text(candidate: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in (candidate.get("content") or {}).get("parts") or [])


def _meta(data: dict[str, Any], candidate: dict[str, Any], usage: dict[str, Any] | None) -> dict[str, Any]:
    finish = candidate.get("finishReason")
    meta: dict[str, Any] = {
        "id": data.get("responseId"),
        "finish_reason": {"type": _FINISH.get(finish, str(finish).lower())} if finish else None,
    }
    if usage is not None:
        meta.update(prompt_tokens=usage.get("promptTokenCount"), cached_tokens=usage.get("cachedContentTokenCount", 0),
                    completion_tokens=usage.get("candidatesTokenCount"))
    return meta
