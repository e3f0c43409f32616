"""The serving runtime, one room (subpackage) per process and concern. A request flows:

  HTTP client
    -> server/        (main process) the app and its route modules, the TokenizerManager
    -> api/           the door shared with the Engine: validate, `n` copies and seeds, tokenize
    -> ipc/           frozen IPC messages over zmq (messages), the sockets
    -> scheduler/     (scheduler process) Scheduler.step(): admission, schedule policy, the cache
                      bridge between requests and mem_cache/, retraction; logprob bookkeeping
    -> model/         ModelRunner.forward over a ForwardBatch: model code, attention backends
                      over the paged KV pool (mem_cache/), model files and GGUF conversion
    -> sampling/      sampler (masks from constrained/ applied here), sampling params
    -> detokenizer/   (detokenizer process) incremental text deltas back to the TokenizerManager
    -> api/           result shaping shared with the Engine: deltas -> /generate results, chunks
    -> HTTP client

`engine.py` is the same path in one process (no zmq): `Engine`, which this package hands out.
`api/` is the contract both doors serve (typed bodies, `request_io`, `request_output`,
`RequestError`); `config/` holds what every room reads (`server_args`, `envs`, `limits`) and
imports nothing of the runtime; `tokenizer/` is the HF tokenizer's facade; `bench/` the
benchmarks and the soak, their fixed data in `bench/data/`. The rooms' import order is
tests/test_imports.py's LAYERS (docs/architecture.md); `radixlm` (the language) imports none of
it but the Engine, lazily.
Importing this package changes nothing in the process (see `radixlm.runtime.config.envs.set_process_defaults`,
called by each process entry point).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from radixlm.runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'radixlm.runtime' has no attribute {name!r}")
