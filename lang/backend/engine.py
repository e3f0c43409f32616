"""EngineBackend: a program's backend in this process, over a radixlm Engine (`rl.Engine(...)`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from radixlm.backend.base import BackendError, NativeBackend
from radixlm.formats.chat_template import CHATML, derive_chat_template

_ENGINE_KEYS = ("sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs",
                "require_reasoning")


class EngineBackend(NativeBackend):
    def __init__(self, engine: Any):
        self.engine = engine
        tokenizer = engine.tokenizer
        template = None
        if tokenizer.chat_template is not None:
            template = derive_chat_template(
                lambda messages: tokenizer.apply_chat_template(messages, add_generation_prompt=False), "model"
            )
        self.chat_template = template or CHATML

    def describe(self) -> str:
        model = getattr(getattr(self.engine, "server_args", None), "model_path", None)
        return f"the model {model or 'SmolLM2-135M-Instruct (the default)'} of this process's Engine"

    def call(self, payload: dict[str, Any]) -> Any:
        try:
            return self.engine.generate(payload["text"], **{k: payload[k] for k in _ENGINE_KEYS if k in payload})
        except ValueError as e:
            raise BackendError(str(e)) from e

    def call_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        kwargs = {k: payload[k] for k in _ENGINE_KEYS if k in payload}
        try:
            yield from self.engine.generate(payload["text"], stream=True, **kwargs)
        except ValueError as e:
            raise BackendError(str(e)) from e

    def flush_cache(self) -> bool:
        return bool(self.engine.flush_cache())

    def get_server_info(self) -> dict[str, Any]:
        return dict(self.engine.get_server_info())

    def shutdown(self) -> None:
        self.engine.shutdown()
