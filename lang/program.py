"""`@function` programs: run one, stream one, run a batch; the default backend.

`run_batch` first traces each item's program up to its first model call (the text it would
send regardless of model output); when the items share a prefix, that prefix is cached with one
request before the items run, so the batch computes it once, not once per item
(global_config.enable_precache_with_tracing). `run(trace=True)` / `run_batch(trace=True)` record
each run's model calls (trace.py).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixlm.backend.base import Backend
from radixlm.global_config import global_config
from radixlm.interpreter import StreamExecutor
from radixlm.ir import Concat, Expr, RoleBegin, RoleEnd, SamplingArgs, Text, as_expr
from radixlm.state import ProgramState
from radixlm.trace import TraceLog

_RUN_KEYS = {f for f in SamplingArgs.__dataclass_fields__}


def set_default_backend(backend: Any) -> None:
    global_config.default_backend = as_backend(backend)


def get_default_backend() -> Backend | None:
    backend = global_config.default_backend
    if backend is not None and not isinstance(backend, Backend):  # e.g. an Engine set directly
        backend = global_config.default_backend = as_backend(backend)
    return backend


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
    default = get_default_backend()
    if default is None:
        raise RuntimeError("no backend: call radixlm.set_default_backend(...) or pass backend=")
    return default


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

    def run(self, *args: Any, backend: Any = None, stream: bool = False, trace: bool | None = None,
            use_thread: bool = True, **kwargs: Any) -> ProgramState:
        """Run the program. Keyword arguments named like gen's sampling arguments (max_new_tokens,
        temperature, stop, ...) are the defaults for its gens; the rest go to the program.
        `trace=True` records its model calls (`state.trace()`); `use_thread` is accepted for
        SGLang compatibility (expressions always run on the state's worker thread)."""
        defaults, program_kwargs = _split_kwargs(kwargs)
        state = self._new_state(_backend(backend), defaults, stream, trace)
        if stream:
            threading.Thread(target=self._execute, args=(state, args, program_kwargs), daemon=True).start()
            return state
        self._execute(state, args, program_kwargs)
        if state.stream_executor.error_ is not None:
            raise state.stream_executor.error_
        if global_config.verbosity >= 2:
            print(state.text())
        return state

    async def run_async(self, *args: Any, **kwargs: Any) -> ProgramState:
        """`run` without blocking the event loop."""
        return await asyncio.to_thread(self.run, *args, **kwargs)

    def run_batch(
        self,
        batch_kwargs: list[Any],
        backend: Any = None,
        num_threads: str | int = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
        trace: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run the program once per item, concurrently: an item is a dict of program arguments (or,
        as in SGLang, a tuple of positional ones). A failing item does not stop the others: its
        state's `error()` holds the exception. `generator_style=True` returns an iterator that
        yields the states in order as they finish."""
        batch_kwargs = self._batch_arguments(batch_kwargs)
        if not batch_kwargs:
            return iter([]) if generator_style else []
        be = _backend(backend)
        defaults, _ = _split_kwargs(kwargs)
        threads = _num_threads(num_threads, len(batch_kwargs))
        if len(batch_kwargs) > 1 and global_config.enable_precache_with_tracing:
            self._cache_common_prefix(be, batch_kwargs)
        states = [self._new_state(be, defaults, False, trace) for _ in batch_kwargs]
        bar = None
        if progress_bar:
            from tqdm import tqdm

            bar = tqdm(total=len(states), desc=getattr(self.func, "__name__", "program"))

        def one(i: int) -> ProgramState:
            self._execute(states[i], (), batch_kwargs[i])
            if bar is not None:
                bar.update(1)
            return states[i]

        pool = ThreadPoolExecutor(threads)
        futures = [pool.submit(one, i) for i in range(len(states))]
        pool.shutdown(wait=False)
        if generator_style:
            return _in_order(futures, bar)
        for future in futures:
            future.result()
        if bar is not None:
            bar.close()
        return states

    def cache(self, backend: Any = None) -> None:
        """Cache the text the program sends before its first model call (with the bound
        arguments), so later runs reuse it (SGLang's `cache`)."""
        prefix = trace_prefix(self.func, dict(self.bound), _backend(backend))
        if prefix:
            _backend(backend).cache_prefix(prefix)

    def _new_state(self, backend: Backend, defaults: SamplingArgs, stream: bool, trace: bool | None) -> ProgramState:
        traced = global_config.enable_tracing if trace is None else trace
        log = TraceLog(getattr(self.func, "__name__", "program")) if traced else None
        return ProgramState(StreamExecutor(backend, defaults, stream=stream, trace=log))

    def _batch_arguments(self, batch: Any) -> list[dict[str, Any]]:
        if not isinstance(batch, (list, tuple)) or not all(isinstance(b, (dict, list, tuple)) for b in batch):
            raise TypeError("run_batch takes a list of dicts (or tuples) of program arguments")
        names = [p for p in inspect.signature(self.func).parameters][1:]  # after `s`
        out = []
        for item in batch:
            if not isinstance(item, dict):
                if len(item) > len(names):
                    raise TypeError(f"run_batch: {len(item)} positional arguments for a program taking {len(names)}")
                item = dict(zip(names, item))
            out.append(item)
        return out

    def _execute(self, state: ProgramState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        executor = state.stream_executor
        try:
            state.ret_value = self.func(state, *args, **{**self.bound, **kwargs})
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


def _in_order(futures: list[Any], bar: Any) -> Iterator[ProgramState]:
    for future in futures:
        yield future.result()
    if bar is not None:
        bar.close()


def _split_kwargs(kwargs: dict[str, Any]) -> tuple[SamplingArgs, dict[str, Any]]:
    sampling = {k: v for k, v in kwargs.items() if k in _RUN_KEYS or k == "max_tokens"}
    if "max_tokens" in sampling:
        sampling["max_new_tokens"] = sampling.pop("max_tokens")
    defaults = SamplingArgs(**{"max_new_tokens": global_config.default_max_new_tokens, **sampling})
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
