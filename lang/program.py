"""`@function` programs: run one, stream one, run a batch; the default backend.

`run_batch` first traces each item's program up to its first model call (the text it would
send regardless of model output); when the items share a prefix, that prefix is cached with one
request before the items run, so the batch computes it once, not once per item.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixlm.backend.base import Backend
from radixlm.interpreter import ProgramState, StreamExecutor
from radixlm.ir import Concat, Expr, RoleBegin, RoleEnd, SamplingArgs, Text, as_expr

_default_backend: Backend | None = None
_RUN_KEYS = {f for f in SamplingArgs.__dataclass_fields__}


def set_default_backend(backend: Any) -> None:
    global _default_backend
    _default_backend = as_backend(backend)


def get_default_backend() -> Backend | None:
    return _default_backend


def as_backend(backend: Any) -> Backend:
    """A Backend, or a radixlm Engine (wrapped in an EngineBackend)."""
    if isinstance(backend, Backend):
        return backend
    if type(backend).__name__ == "Engine" and hasattr(backend, "scheduler"):
        from radixlm.backend.engine import EngineBackend

        return EngineBackend(backend)
    raise TypeError(f"not a backend: {backend!r} (use RuntimeEndpoint, OpenAI, or an Engine)")


def _backend(backend: Any) -> Backend:
    if backend is not None:
        return as_backend(backend)
    if _default_backend is None:
        raise RuntimeError("no backend: call radixlm.set_default_backend(...) or pass backend=")
    return _default_backend


def flush_cache(backend: Any = None) -> bool:
    return _backend(backend).flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any]:
    return _backend(backend).get_server_info()


def function(func: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Decorate `def prog(s, ...)` as a program (also `@function(...)` with options ignored
    for SGLang compatibility, e.g. num_api_spec_tokens)."""
    if func is None:
        return lambda f: SglFunction(f)
    return SglFunction(func)


class SglFunction:
    def __init__(self, func: Callable[..., Any], bound: dict[str, Any] | None = None):
        self.func = func
        self.bound = dict(bound or {})
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: Any) -> SglFunction:
        """A copy with some arguments fixed."""
        return SglFunction(self.func, {**self.bound, **kwargs})

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)

    def run(self, *args: Any, backend: Any = None, stream: bool = False, **kwargs: Any) -> ProgramState:
        """Run the program. Keyword arguments named like gen's sampling arguments (max_new_tokens,
        temperature, stop, ...) are the defaults for its gens; the rest go to the program."""
        defaults, program_kwargs = _split_kwargs(kwargs)
        executor = StreamExecutor(_backend(backend), defaults, stream=stream)
        state = ProgramState(executor)
        if stream:
            threading.Thread(target=self._execute, args=(state, args, program_kwargs), daemon=True).start()
            return state
        self._execute(state, args, program_kwargs)
        if executor.error_ is not None:
            raise executor.error_
        return state

    async def run_async(self, *args: Any, **kwargs: Any) -> ProgramState:
        """`run` without blocking the event loop."""
        return await asyncio.to_thread(self.run, *args, **kwargs)

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]],
        backend: Any = None,
        num_threads: str | int = "auto",
        progress_bar: bool = False,
        **kwargs: Any,
    ) -> list[ProgramState]:
        """Run the program once per dict of arguments, concurrently. A failing item does not stop
        the others: its state's `error()` holds the exception."""
        if not isinstance(batch_kwargs, list) or not all(isinstance(b, dict) for b in batch_kwargs):
            raise TypeError("run_batch takes a list of dicts of program arguments")
        if not batch_kwargs:
            return []
        be = _backend(backend)
        defaults, _ = _split_kwargs(kwargs)
        threads = _num_threads(num_threads, len(batch_kwargs))
        if len(batch_kwargs) > 1:
            self._cache_common_prefix(be, batch_kwargs)
        states = [ProgramState(StreamExecutor(be, defaults)) for _ in batch_kwargs]
        bar = None
        if progress_bar:
            from tqdm import tqdm

            bar = tqdm(total=len(states), desc=getattr(self.func, "__name__", "program"))

        def one(i: int) -> None:
            self._execute(states[i], (), batch_kwargs[i])
            if bar is not None:
                bar.update(1)

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(len(states))))
        if bar is not None:
            bar.close()
        return states

    def _execute(self, state: ProgramState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        executor = state.stream_executor
        try:
            self.func(state, *args, **{**self.bound, **kwargs})
        except BaseException as e:  # the program's own error counts as the state's error
            if executor.error_ is None:
                executor.error_ = e
        finally:
            executor.end()

    def _cache_common_prefix(self, backend: Backend, batch_kwargs: list[dict[str, Any]]) -> None:
        traced = [trace_prefix(self.func, {**self.bound, **kw}, backend) for kw in batch_kwargs]
        prefixes = [p for p in traced if p is not None]  # an item whose trace fails is left out
        common = os.path.commonprefix(prefixes) if len(prefixes) > 1 else ""
        if common:
            backend.cache_prefix(common)


def _split_kwargs(kwargs: dict[str, Any]) -> tuple[SamplingArgs, dict[str, Any]]:
    sampling = {k: v for k, v in kwargs.items() if k in _RUN_KEYS or k == "max_tokens"}
    if "max_tokens" in sampling:
        sampling["max_new_tokens"] = sampling.pop("max_tokens")
    defaults = SamplingArgs(**{"max_new_tokens": 128, **sampling})
    return defaults, {k: v for k, v in kwargs.items() if k not in _RUN_KEYS and k != "max_tokens"}


def _num_threads(num_threads: str | int, n: int) -> int:
    if num_threads == "auto":
        return max(1, min(n, 64, 4 * (os.cpu_count() or 1) + 8))
    if isinstance(num_threads, int) and num_threads >= 1:
        return num_threads
    raise ValueError(f"num_threads must be 'auto' or a positive int, got {num_threads!r}")


class _StopTrace(Exception):
    pass


class _TracingState:
    """Collects the text a program appends before its first model call or variable read."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.text = ""
        self.first = True

    def __iadd__(self, other: Any) -> _TracingState:
        self._add(as_expr(other))
        return self

    def _add(self, expr: Expr) -> None:
        if isinstance(expr, Text):
            self.text += expr.text
        elif isinstance(expr, Concat):
            for part in expr.parts:
                self._add(part)
        elif isinstance(expr, RoleBegin):
            self.text += self.backend.chat_template.prefix(expr.role, self.first and not self.text)
            self.first = False
        elif isinstance(expr, RoleEnd):
            self.text += self.backend.chat_template.suffix(expr.role)
        else:
            raise _StopTrace

    def __getattr__(self, name: str) -> Any:
        raise _StopTrace

    def __getitem__(self, name: str) -> Any:
        raise _StopTrace


def trace_prefix(func: Callable[..., Any], kwargs: dict[str, Any], backend: Backend) -> str | None:
    """The text `func` appends before its first gen/select/read, or None if tracing failed."""
    tracer = _TracingState(backend)
    try:
        func(tracer, **kwargs)
    except _StopTrace:
        pass
    except Exception:
        return None
    return tracer.text
