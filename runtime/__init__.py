"""The serving runtime, one subpackage per process and concern. A request flows:

  HTTP client
    -> server/        (main process) FastAPI routes, OpenAI routes, TokenizerManager: validate at
                      the door (request_io), apply the chat template, tokenize
    -> ipc/           frozen IPC messages over zmq (messages), the sockets
    -> scheduler/     (scheduler process) Scheduler.step(): admission, schedule policy, the cache
                      bridge between requests and mem_cache/, retraction; logprob bookkeeping
    -> model/         ModelRunner.forward over a ForwardBatch: model code, attention backends
                      over the paged KV pool (mem_cache/), model files and GGUF conversion
    -> sampling/      sampler (masks from constrained/ applied here), sampling params
    -> detokenizer/   (detokenizer process) incremental text deltas back to the TokenizerManager
    -> HTTP client

`engine.py` is the same path in one process (no zmq), `bench/` the benchmarks and the soak.
`api/` is the contract both doors serve and the door they share: the typed request and response
bodies (`protocol`), `request_io` (a request in: parsing, `n` copies and seeds, validation),
`request_output` (a result out: output deltas in, /generate results and stream chunks out) and
`RequestError`. `config/` holds what every layer reads: `server_args` (settings), `envs`
(environment), `limits`; `tokenizer/` is the HF tokenizer's facade.
Imports point down this list, never up; `radixlm` (the language) imports none of it.
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
