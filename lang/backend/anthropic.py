"""Anthropic: a program's backend over Anthropic's Messages API (`POST /v1/messages`), through the
official `anthropic` client (`pip install radixlm[anthropic]`; imported when the backend is made).

How program steps map onto the API:
- gen: as on OpenAI chat models, the gen must open an assistant message (`s += assistant(gen(..))`);
  the state's system messages become the request's `system`, the others its `messages`.
  max_new_tokens -> max_tokens (required by the API), stop -> stop_sequences, temperature,
  top_p, top_k as they are (in the request body: the newest clients no longer have arguments for
  them); streaming with `run(stream=True)`. The meta info has the response id,
  finish_reason (SGLang's shape: stop / length, `matched` for a stop sequence) and the usage
  (cache reads as cached_tokens).
- What the API cannot express raises NotSupportedError naming it: select (the API returns no
  log-probabilities), tools, regex / JSON-schema / EBNF constraints, n > 1, logprobs, and the
  sampling extensions (min_tokens, penalties, stop_token_ids, stop_regex, seed, ...).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from radixlm.backend.base import (
    Backend,
    BackendError,
    NotSupportedError,
    chat_messages,
    import_client,
    refuse_unsupported,
)
from radixlm.ir import Gen, SamplingArgs

if TYPE_CHECKING:
    from radixlm.interpreter import StreamExecutor

_SUPPORTED = {"max_new_tokens", "stop", "temperature", "top_p", "top_k", "skip_special_tokens"}
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}


class Anthropic(Backend):
    sends_messages = True

    def __init__(self, model_name: str, *args: Any, **client_kwargs: Any):
        """`client_kwargs` go to `anthropic.Anthropic` (api_key, base_url, timeout, max_retries, ...)."""
        self.anthropic = import_client("anthropic", "Anthropic", "anthropic")
        self.model_name = model_name
        try:
            self.client = self.anthropic.Anthropic(*args, **client_kwargs)
        except self.anthropic.AnthropicError as e:
            raise BackendError(f"radixlm.Anthropic: {e}") from e
        self.base_url = str(self.client.base_url).rstrip("/")

    def describe(self) -> str:
        return f"the model {self.model_name!r} at {self.base_url}"

    def generate(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> tuple[str, dict[str, Any]]:
        request = self._request(s, gen, sampling)
        with self._api_errors():
            response = self.client.messages.create(**request)
        return _text(response), _meta(response)

    def generate_stream(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> Iterator[tuple[str, dict[str, Any] | None]]:
        request = self._request(s, gen, sampling)
        with self._api_errors(), self.client.messages.stream(**request) as stream:
            for piece in stream.text_stream:
                if piece:
                    yield piece, None
            final = stream.get_final_message()
        yield "", _meta(final)

    def shutdown(self) -> None:
        self.client.close()

    def _request(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> dict[str, Any]:
        refuse_unsupported(sampling, gen, "Anthropic API", _SUPPORTED)
        messages = chat_messages(s, "Anthropic API")
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        turns = [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "system"]
        if any(t["role"] not in ("user", "assistant") for t in turns):
            raise NotSupportedError("the Anthropic backend takes system, user and assistant messages only")
        request: dict[str, Any] = {"model": self.model_name, "messages": turns,
                                   "max_tokens": sampling.max_new_tokens or 1024}
        if system:
            request["system"] = system
        if sampling.stop:
            request["stop_sequences"] = [sampling.stop] if isinstance(sampling.stop, str) else list(sampling.stop)
        # sampling knobs the Messages API takes (the newest clients no longer name them: sent in the body)
        knobs = {key: getattr(sampling, key) for key in ("temperature", "top_p", "top_k") if getattr(sampling, key) is not None}
        if knobs:
            request["extra_body"] = knobs
        return request

    @contextmanager
    def _api_errors(self) -> Iterator[None]:
        try:
            yield
        except self.anthropic.APIConnectionError as e:
            raise BackendError(f"cannot reach the Anthropic API at {self.base_url}: {e.__cause__ or e}") from e
        except self.anthropic.APIStatusError as e:
            raise BackendError(f"{self.base_url} answered {e.status_code}: {e.message}") from e


def _text(message: Any) -> str:
    return "".join(block.text for block in message.content if getattr(block, "type", None) == "text")


def _meta(message: Any) -> dict[str, Any]:
    reason: dict[str, Any] | None = None
    if message.stop_reason is not None:
        reason = {"type": _FINISH.get(message.stop_reason, message.stop_reason)}
        if message.stop_reason == "stop_sequence":
            reason["matched"] = message.stop_sequence
    usage = message.usage
    cached = usage.cache_read_input_tokens or 0
    return {
        "id": message.id,
        "finish_reason": reason,
        # the API counts cache reads and writes apart from input_tokens
        "prompt_tokens": usage.input_tokens + cached + (usage.cache_creation_input_tokens or 0),
        "cached_tokens": cached,
        "completion_tokens": usage.output_tokens,
    }
