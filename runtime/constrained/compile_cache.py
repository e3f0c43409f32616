"""The compile-and-cache half shared by the grammar backends (outlines, xgrammar, llguidance):
`get(kind, spec)` returns a Future of the compiled grammar, compiled in a worker thread and kept
in an LRU of `max_cache` entries, so the scheduler never waits on a compile and equal specs
compile once."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from radixlm.runtime.constrained.errors import GrammarError

CFG_KINDS = ("regex", "json_schema", "choices", "ebnf", "structural_tag")
Compiled = TypeVar("Compiled")


class CompileCache(Generic[Compiled]):
    """Subclasses compile one normalized spec in `_compile` (run in a worker thread); `normalize`
    turns a request's spec into the cache key's text (GrammarError if malformed)."""

    def __init__(self, name: str, max_cache: int = 64, num_workers: int = 2,
                 normalize: Callable[[str, object], str] | None = None):
        self.max_cache = max_cache
        self._normalize = normalize or normalize_cfg
        self._executor = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix=f"{name}-compile")
        self._key_to_future: OrderedDict[tuple[str, str], Future[Compiled]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, kind: str, spec: object) -> Future[Compiled]:
        """The compiled grammar for (kind, spec), as a future; never blocks on compilation. A
        malformed spec gives an already-failed future (GrammarError)."""
        try:
            key = (kind, self._normalize(kind, spec))
        except GrammarError as e:
            failed: Future[Compiled] = Future()
            failed.set_exception(e)
            return failed
        with self._lock:
            future = self._key_to_future.get(key)
            if future is None:
                future = self._submit(*key)
                self._key_to_future[key] = future
                while len(self._key_to_future) > self.max_cache:
                    self._key_to_future.popitem(last=False)
            else:
                self._key_to_future.move_to_end(key)
            return future

    def _submit(self, kind: str, normalized: str) -> Future[Compiled]:
        """Starts compiling (kind, normalized); the future of the result. By default `_compile` in
        a worker thread; a subclass may schedule its compiles its own way."""
        return self._executor.submit(self._compile, kind, normalized)

    def _compile(self, kind: str, normalized: str) -> Compiled:
        raise NotImplementedError

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def normalize_cfg(kind: str, spec: object) -> str:
    """The cache key's text of a spec for the context-free backends; GrammarError if malformed."""
    if kind not in CFG_KINDS:
        raise GrammarError(f"unknown grammar kind {kind!r}; expected one of {', '.join(CFG_KINDS)}")
    if kind == "json_schema":
        try:
            schema = json.loads(spec) if isinstance(spec, str) else spec
        except json.JSONDecodeError as e:
            raise GrammarError(f"json_schema is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise GrammarError("json_schema must be a JSON object")
        return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if kind == "structural_tag":
        from radixlm.runtime.constrained.structural_tag import normalize_structural_tag

        return normalize_structural_tag(spec)
    if kind == "choices":
        if not isinstance(spec, (list, tuple)) or not spec or not all(isinstance(c, str) for c in spec):
            raise GrammarError("choices must be a non-empty list of strings")
        return json.dumps(list(spec), ensure_ascii=False)
    if not isinstance(spec, str) or not spec:
        raise GrammarError(f"{kind} must be a non-empty string")
    return spec


def unpack_bitmask(words: object, vocab_size: int, tokenizer_len: int, mask_row: object) -> None:
    """An int32 bitmask row (bit i % 32 of word i // 32 allows token i, as xgrammar and llguidance
    write it) into `mask_row` (bool [vocab_size]); ids from `tokenizer_len` on are never allowed."""
    import numpy as np
    import torch

    assert isinstance(words, torch.Tensor) and isinstance(mask_row, torch.Tensor)
    if mask_row.shape != (vocab_size,) or mask_row.dtype != torch.bool:
        raise ValueError(f"mask_row must be bool of shape ({vocab_size},), got {tuple(mask_row.shape)}")
    bits = np.unpackbits(words.numpy().view(np.uint32).astype("<u4", copy=False).view(np.uint8), bitorder="little")
    allowed = bits[:vocab_size]
    allowed[tokenizer_len:] = 0
    np.copyto(mask_row.numpy(), allowed.view(np.bool_))
