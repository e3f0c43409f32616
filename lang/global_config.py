"""`radixlm.global_config`: the process-wide switches of the language (SGLang's `global_config`).

SGLang's knobs, with the meaning each has here:
- `verbosity`: 0 prints nothing; 2 (or more) prints each program's text after `run`.
- `default_backend`: what `set_default_backend` sets (an Engine set here directly works too).
- `skip_special_tokens_in_output`, `spaces_between_special_tokens_in_out`: how generated special
  tokens become text, for gens that do not say (sent only where they differ from the server's
  default, True, so servers that lack these extensions are unaffected until they are changed).
- `enable_precache_with_tracing`: `run_batch` traces each item's program up to its first model
  call and caches the common prefix before the items run.
- `enable_parallel_encoding`: `fork(n > 1)` prefills the shared prefix once, before the
  branches start, so they all reuse it (SGLang also uses it to concatenate forks' KV on join;
  we join by text).
Ours:
- `enable_tracing`: the default of `run(trace=...)` / `run_batch(trace=...)` (see trace.py).
- `default_max_new_tokens`: the max_new_tokens of gens that set none (run's default).
"""

from __future__ import annotations

from typing import Any


class GlobalConfig:
    def __init__(self) -> None:
        self.verbosity = 0
        self.default_backend: Any = None
        self.skip_special_tokens_in_output = True
        self.spaces_between_special_tokens_in_out = True
        self.enable_precache_with_tracing = True
        self.enable_parallel_encoding = True
        self.enable_tracing = False
        self.default_max_new_tokens = 128

    def __repr__(self) -> str:
        return f"GlobalConfig({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


global_config = GlobalConfig()

__all__ = ["GlobalConfig", "global_config"]
