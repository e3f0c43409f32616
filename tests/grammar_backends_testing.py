"""Test helpers for running the constrained-decoding tests on every grammar backend
(`--grammar-backend`, runtime/constrained/backends.py): what each backend is documented to do
differently, and a backend or an Engine per backend."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from radixlm.runtime.config.server_args import DEFAULT_GRAMMAR_BACKEND, GRAMMAR_BACKENDS
from radixlm.runtime.constrained.grammar import GrammarBackend
from radixlm.runtime.constrained.llguidance_backend import LLGuidanceBackend
from radixlm.runtime.constrained.xgrammar_backend import XGrammarBackend

__all__ = ["ENDS_BEFORE_EOS", "GRAMMAR_BACKENDS", "Backend", "backend_engine",
           "grammar_backend"]

Backend = GrammarBackend | XGrammarBackend | LLGuidanceBackend
BACKEND_CLASSES: dict[str, type[Backend]] = {
    "outlines": GrammarBackend, "xgrammar": XGrammarBackend, "llguidance": LLGuidanceBackend,
}
# Backends whose `is_terminated()` is already True when nothing but EOS can follow (xgrammar's is
# True once EOS was accepted: the request then samples EOS, one step more).
ENDS_BEFORE_EOS = ("outlines", "llguidance")


@contextmanager
def grammar_backend(name: str, tokenizer: Any, vocab_size: int, **kwargs: Any) -> Iterator[Backend]:
    """Backend `name` (its class's keyword arguments: max_cache, num_workers,
    enable_jump_forward), shut down afterwards."""
    backend = BACKEND_CLASSES[name](tokenizer, vocab_size, **kwargs)
    try:
        yield backend
    finally:
        backend.shutdown()


@contextmanager
def backend_engine(name: str, tiny_engine: Any, tiny_model_dir: Path, **kwargs: Any) -> Iterator[Any]:
    """The suite's tiny engine for the default backend without `kwargs`, else an Engine on the
    same tiny model with `--grammar-backend name` and `kwargs`, shut down afterwards."""
    if name == DEFAULT_GRAMMAR_BACKEND and not kwargs:
        assert tiny_engine.server_args.grammar_backend == name
        yield tiny_engine
        return
    from radixlm.runtime.engine import Engine

    with Engine(str(tiny_model_dir), **{"max_total_tokens": 4096, "random_seed": 0, "dtype": "float32", **kwargs},
                grammar_backend=name) as engine:
        yield engine
