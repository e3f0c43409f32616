"""The compile-and-cache half shared by the grammar backends (outlines, xgrammar, llguidance):
`get(kind, spec)` returns a Future of the compiled grammar, compiled in a worker thread and kept
in an LRU of `max_cache` entries, so the scheduler never waits on a compile and equal specs
compile once. `get_lowered(lowered)` is the same for a spec the front door lowered already
(`lowered.LoweredGrammar`): its form is compiled as it is, under the same cache key."""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar, Generic, TypeVar

from radixlm.runtime.config.limits import MAX_EBNF_CHARS, MAX_SCHEMA_BOUND
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.json_schema import parse_schema
from radixlm.runtime.constrained.lowered import LoweredGrammar, LoweringSettings
from radixlm.runtime.constrained.regex_syntax import check_regex_size

CFG_KINDS = ("regex", "json_schema", "choices", "ebnf", "structural_tag")
Compiled = TypeVar("Compiled")


class CompileCache(Generic[Compiled]):
    """Subclasses lower a normalized spec in `_lower` (with the function their front-door check
    lowers with) and compile a lowered grammar as it is in `_compile` (both run in a worker
    thread); `normalize` turns a request's spec into the cache key's text (GrammarError if
    malformed)."""

    backend_name: ClassVar[str]  # as --grammar-backend names it: the LoweredGrammars it compiles

    def __init__(self, name: str, max_cache: int = 64, num_workers: int = 2,
                 normalize: Callable[[str, object], str] | None = None):
        self.max_cache = max_cache
        self._normalize = normalize or normalize_cfg
        self._executor = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix=f"{name}-compile")
        self._key_to_future: OrderedDict[tuple[str, str], Future[Compiled]] = OrderedDict()
        self._lock = threading.Lock()
        # the other engines' backends, for JSON schemas the door gave them (set by `backends.create`)
        self.siblings: Siblings | None = None

    def get(self, kind: str, spec: object) -> Future[Compiled]:
        """The compiled grammar for (kind, spec), as a future; never blocks on compilation. A
        malformed spec gives an already-failed future (GrammarError)."""
        try:
            key = (kind, self._normalize(kind, spec))
        except GrammarError as e:
            failed: Future[Compiled] = Future()
            failed.set_exception(e)
            return failed
        return self._cached(key, lambda: self._submit(lambda: self._lower(*key)))

    def get_lowered(self, lowered: LoweredGrammar) -> Future[Compiled]:
        """`get` for a spec the front door lowered already (`backends.validate`): cached under the
        same key, and its form compiled as it is, not lowered again. ValueError if another backend,
        or this one with other settings, lowered it. A JSON schema the door gave another engine
        (`backends.choose_json_schema`) goes to that engine's backend in `siblings`, if set."""
        if lowered.backend != self.backend_name and lowered.kind == "json_schema" and self.siblings is not None:
            siblings = self.siblings
            return self._executor.submit(lambda: siblings.get(lowered.backend).get_lowered(lowered).result())
        if (lowered.backend, lowered.settings) != (self.backend_name, self.lowering_settings):
            raise ValueError(f"the grammar was lowered by the {lowered.backend} backend with {dict(lowered.settings)}; "
                             f"this is the {self.backend_name} backend with {dict(self.lowering_settings)}")
        return self._cached((lowered.kind, lowered.normalized), lambda: self._submit(lambda: lowered))

    @property
    def lowering_settings(self) -> LoweringSettings:
        """The settings this backend lowers with (`LoweredGrammar.settings`); none by default."""
        return ()

    def _cached(self, key: tuple[str, str], submit: Callable[[], Future[Compiled]]) -> Future[Compiled]:
        """The future cached under `key` (kind, normalized), else `submit()`'s, cached."""
        with self._lock:
            future = self._key_to_future.get(key)
            if future is None:
                future = submit()
                self._key_to_future[key] = future
                while len(self._key_to_future) > self.max_cache:
                    self._key_to_future.popitem(last=False)
            else:
                self._key_to_future.move_to_end(key)
            return future

    def _submit(self, lowering: Callable[[], LoweredGrammar]) -> Future[Compiled]:
        """Starts compiling the grammar `lowering()` gives (called in the worker thread: the door's,
        or `_lower` of the spec); the future of the result. By default `_compile` in a worker
        thread; a subclass may schedule its compiles its own way."""
        return self._executor.submit(lambda: self._compile(lowering()))

    def _lower(self, kind: str, normalized: str) -> LoweredGrammar:
        """The normalized spec lowered as the front door lowers it; GrammarError if it cannot be."""
        raise NotImplementedError

    def _compile(self, lowered: LoweredGrammar) -> Compiled:
        """The lowered grammar compiled as it is; GrammarError if it cannot be."""
        raise NotImplementedError

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self.siblings is not None:
            self.siblings.shutdown()


class Siblings:
    """The backends of other engines, each made by `make(name)` on first use (in a compile worker
    thread: making one loads its library and vocabulary) and shut down with their owner."""

    def __init__(self, make: Callable[[str], Any]):
        self._make = make
        self._name_to_backend: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Any:
        with self._lock:
            backend = self._name_to_backend.get(name)
            if backend is None:
                backend = self._name_to_backend[name] = self._make(name)
            return backend

    def shutdown(self) -> None:
        with self._lock:
            backends, self._name_to_backend = list(self._name_to_backend.values()), {}
        for backend in backends:
            backend.shutdown()


def normalize_cfg(kind: str, spec: object) -> str:
    """The cache key's text of a spec for the context-free backends; GrammarError if malformed."""
    if kind not in CFG_KINDS:
        raise GrammarError(f"unknown grammar kind {kind!r}; expected one of {', '.join(CFG_KINDS)}")
    if kind == "json_schema":
        if isinstance(spec, bool) or spec in ("true", "false"):
            return json.dumps(spec if isinstance(spec, bool) else spec == "true")
        schema = parse_schema(spec)
        check_cfg_schema(schema)
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
    if kind == "regex":
        check_regex_size(spec)
    elif len(spec) > MAX_EBNF_CHARS:
        raise GrammarError(f"ebnf is too long: {len(spec)} characters, the limit is {MAX_EBNF_CHARS}")
    return spec


# keys whose value maps names to subschemas, and keys whose value is data, not a schema
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
DATA_KEYS = ("enum", "const", "default", "examples", "required")
_BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def check_cfg_schema(schema: dict[str, Any]) -> None:
    """GrammarError for what the context-free backends must not be handed: a `$ref` outside the
    document (never fetched: a file or URL), or a numeric bound that is not finite or beyond
    +-MAX_SCHEMA_BOUND (xgrammar's parser fails on it without a reason). Iterative (the depth is
    bounded by `parse_schema` already, but no recursion is needed)."""
    for node, path in walk_subschemas(schema):
        ref = node.get("$ref")
        if ref is not None and (not isinstance(ref, str) or not ref.startswith("#")):
            raise GrammarError(f"'$ref' at {path} must point inside the schema (start with '#'); "
                               f"references to files or URLs are not followed, got {str(ref)[:80]!r}")
        for key in _BOUND_KEYS:
            value = node.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and (
                    isinstance(value, float) and not math.isfinite(value) or abs(value) > MAX_SCHEMA_BOUND):
                raise GrammarError(f"{key!r} at {path} must be a finite number within +-1e30")


def walk_subschemas(schema: object, path: str = "#") -> Iterator[tuple[dict[str, Any], str]]:
    """Every subschema (dict) of `schema` and its JSON-pointer path, by keyword (a map keyword's
    values are subschemas, a data keyword's value is not); iterative."""
    stack: list[tuple[object, str]] = [(schema, path)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, list):
            stack.extend((item, f"{at}/{i}") for i, item in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        yield node, at
        for key, value in node.items():
            if key in DATA_KEYS:
                continue
            if key in SCHEMA_MAPS and isinstance(value, dict):
                stack.extend((sub, f"{at}/{key}/{name}") for name, sub in value.items())
            elif isinstance(value, (dict, list)):
                stack.append((value, f"{at}/{key}"))


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
