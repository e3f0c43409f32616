"""The serving runtime: model runner, KV pool, attention backends, engine.

Flow of one request (in-process Engine):
  prompt -> tokenizer -> Engine batch loop -> ModelRunner.forward (ForwardBatch over the KV pool)
  -> sampler -> output ids -> tokenizer.decode.
"""

from __future__ import annotations

import os
from typing import Any

# OpenMP threads spin only briefly before they sleep, unless the user chose a policy. A decode
# step runs ~150 short parallel regions (kernels/csrc/decode_stack.cpp); with libgomp's default
# long spin, any competing process on the same cores stalls every region boundary for a time
# slice. Measured on the 2-core machine (bf16 decode step of the default model): quiet, 16-20 ms
# for every setting; beside one busy process, ~600 ms with the default spin, 63 ms with
# GOMP_SPINCOUNT=10000, 33 ms with OMP_WAIT_POLICY=PASSIVE. PASSIVE (sleep at once) cost ~15% on
# batched work when quiet (W2 79 vs 93-97 tok/s, W3 10.2 vs 8.2-8.6 s), the short spin nothing.
# libgomp reads these when it loads (the first `import torch`), so they take effect where
# radixlm.runtime is imported first, and in every process the runtime starts.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from radixlm.runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'radixlm.runtime' has no attribute {name!r}")
