"""The serving runtime: model runner, KV pool, attention backends, engine.

Flow of one request (in-process Engine):
  prompt -> tokenizer -> Engine batch loop -> ModelRunner.forward (ForwardBatch over the KV pool)
  -> sampler -> output ids -> tokenizer.decode.
"""

from __future__ import annotations

import os
from typing import Any

# OpenMP threads sleep between parallel regions instead of spinning, unless the user chose a
# policy. A decode step runs ~150 short regions (kernels/csrc/decode_stack.cpp); with spinning
# waiters any competing process on the same cores stalls every region boundary. Measured on the
# 2-core machine, a bfloat16 decode step of the default model: 20 ms either way when the machine
# is quiet; beside one busy process, 33 ms passive vs ~600 ms spinning. libgomp reads this when it
# loads (the first `import torch`), so it takes effect where radixlm.runtime is imported first,
# and in every process the runtime starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from radixlm.runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'radixlm.runtime' has no attribute {name!r}")
