"""The serving runtime: model runner, KV pool, attention backends, engine.

Flow of one request (in-process Engine):
  prompt -> tokenizer -> Engine batch loop -> ModelRunner.forward (ForwardBatch over the KV pool)
  -> sampler -> output ids -> tokenizer.decode.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from radixlm.runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'radixlm.runtime' has no attribute {name!r}")
