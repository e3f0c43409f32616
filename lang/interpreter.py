"""The interpreter: the executor that runs a program state's expressions (state.py is the state).

`s += expr` queues `expr` on the state's executor, a worker thread that runs expressions in
order against the backend, so the program's Python code runs ahead until it reads a result
(`s["x"]`, `s.text()`), and forked states (`s.fork(n)`) run their branches in parallel. An
expression that fails stops its state: later expressions are skipped, reading an unset variable
raises the error, and `run` raises it (`run_batch` keeps it on that item's state). Expressions
are dispatched by their type (`_HANDLERS`); each model call is timed and, when the run is traced,
recorded (trace.py).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

from radixlm.backend.base import Backend
from radixlm.formats.reasoning import separate_reasoning
from radixlm.global_config import global_config
from radixlm.ir import (
    Concat,
    Expr,
    Gen,
    Media,
    RoleBegin,
    RoleEnd,
    SamplingArgs,
    Select,
    SeparateReasoning,
    Text,
    ToolResult,
    VarScopeBegin,
    VarScopeEnd,
    generated_names,
)
from radixlm.tools import ToolSet
from radixlm.trace import TraceLog

_END = object()


class StreamExecutor:
    def __init__(self, backend: Backend, defaults: SamplingArgs, stream: bool = False,
                 trace: TraceLog | None = None, branch: str = ""):
        self.backend = backend
        self.defaults = defaults
        self.stream = stream
        self.trace = trace  # where this run's model calls are recorded (None: not traced)
        self.branch = branch  # "" for the program, "0", "1", "0.1", ... for forks
        self.text_ = ""
        self.messages_: list[dict[str, Any]] = []
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.tool_sets: dict[str, ToolSet] = {}
        # fields a backend attaches to the current role's message (e.g. OpenAI `tool_calls`)
        self.message_extra: dict[str, Any] = {}
        self.cur_role: str | None = None
        self.cur_role_begin = 0
        self.var_scope_begin: dict[str, int] = {}
        self.error_: BaseException | None = None
        self._events: dict[str, threading.Event] = {}
        self._queue: queue.Queue[Any] = queue.Queue()
        # (variable or None, text, the variable's meta info if known by then) as appended
        self._chunks: list[tuple[str | None, str, Any]] = []
        self._finished = False
        self._ended = False
        self._children: list[StreamExecutor] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._work, daemon=True, name="radixlm-program")
        self._thread.start()

    # ------------------------------------------------------------------ from the program
    def submit(self, expr: Expr) -> None:
        if self._ended:
            raise RuntimeError("this program state has ended (a run finished, or its forks were joined)")
        self._queue.put(expr)

    def sync(self) -> None:
        self._queue.join()

    def end(self) -> None:
        """No more expressions: finish them, then close the stream and the worker (and those of
        forks never joined). Idempotent."""
        if self._ended:
            return
        self._ended = True
        self._queue.put(_END)
        self._queue.join()
        for child in self._children:
            child.end()

    def get_var(self, name: str) -> Any:
        event = self._event(name)
        while not event.wait(0.02):
            # nothing left to run that could set it (expressions run in order)
            if self.error_ is not None or self._finished or self._queue.unfinished_tasks == 0:
                break
        if name in self.variables:
            return self.variables[name]
        if self.error_ is not None:
            raise self.error_
        raise KeyError(f"the program set no variable {name!r}")

    def set_var(self, name: str, value: Any) -> None:
        self.variables[name] = value
        self._event(name).set()

    def fork(self, n: int) -> list[StreamExecutor]:
        self.sync()
        if self.error_ is not None:
            raise self.error_
        if n > 1 and global_config.enable_parallel_encoding:
            self.backend.cache_prefix(self.text_)  # the shared prefix is computed once, before the branches
        forks = []
        for i in range(n):
            branch = f"{self.branch}.{i}" if self.branch else str(i)
            child = StreamExecutor(self.backend, self.defaults, self.stream, self.trace, branch)
            child.text_ = self.text_
            child.messages_ = [dict(m) for m in self.messages_]
            child.variables = dict(self.variables)
            child.meta_info = dict(self.meta_info)
            child.tool_sets = dict(self.tool_sets)
            child.message_extra = dict(self.message_extra)
            child.cur_role, child.cur_role_begin = self.cur_role, self.cur_role_begin
            for name in child.variables:
                child._event(name).set()
            forks.append(child)
        self._children.extend(forks)
        return forks

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        for text, _ in self._chunk_iter(var_name):
            if text:
                yield text

    def _chunk_iter(self, var_name: str | None) -> Iterator[tuple[str, Any]]:
        """(text, meta info or None) as appended, until the state ends (then its error, if any)."""
        index = 0
        while True:
            with self._cond:
                while index >= len(self._chunks) and not self._finished:
                    self._cond.wait()
                pending, index = self._chunks[index:], len(self._chunks)
                finished = self._finished
            for var, text, meta in pending:
                if var_name is None or var == var_name:
                    yield text, meta
            if finished and index >= len(self._chunks):
                if self.error_ is not None:
                    raise self.error_
                return

    async def text_async_iter(self, var_name: str | None = None, return_meta_data: bool = False) -> AsyncIterator[Any]:
        """Text chunks; with `return_meta_data`, (text, meta) pairs: {} until the gen's meta info
        arrives with its last chunk (whose text may be empty)."""
        iterator = self._chunk_iter(var_name)
        done = object()
        while (item := await asyncio.to_thread(next, iterator, done)) is not done:
            text, meta = item  # type: ignore[misc]
            if return_meta_data and (text or meta is not None):
                yield text, meta if meta is not None else {}
            elif text:
                yield text

    # ------------------------------------------------------------------ the worker
    def _event(self, name: str) -> threading.Event:
        return self._events.setdefault(name, threading.Event())

    def _work(self) -> None:
        while True:
            expr = self._queue.get()
            try:
                if expr is _END:
                    with self._cond:
                        self._finished = True
                        self._cond.notify_all()
                    return
                if self.error_ is None:
                    self._run(expr)
            except BaseException as e:  # the program's error: kept, reported where it is read
                self.error_ = e
                for event in list(self._events.values()):
                    event.set()
            finally:
                self._queue.task_done()

    def _run(self, expr: Expr) -> None:
        handler = _HANDLERS.get(type(expr))
        if handler is None:
            raise TypeError(f"unknown expression {expr!r}")
        handler(self, expr)

    def _concat(self, expr: Concat) -> None:
        for part in expr.parts:
            self._run(part)

    def _var_scope_end(self, expr: VarScopeEnd) -> None:
        begin = self.var_scope_begin.pop(expr.name, None)
        if begin is None:
            raise ValueError(f"var_scope {expr.name!r} ended without beginning")
        self.set_var(expr.name, self.text_[begin:])

    def _separate_reasoning(self, expr: SeparateReasoning) -> None:
        """As SGLang: each variable's answer stays in it, its reasoning goes to
        `{name}_reasoning_content`, and the state's text keeps the answer only (the variable's text
        is replaced where it ends the text; text, lists for n > 1). A reasoning the server already
        split off (an OpenAI-compatible server's `reasoning_content`, in the meta info) is taken as
        is. Other values (typed outputs, tool calls) are left as they are."""
        self._run(expr.expr)
        for name in generated_names(expr.expr):
            value, meta = self.variables.get(name), self.meta_info.get(name)
            if isinstance(value, str):
                reasoning, answer = _split(value, meta, expr.model_type)
                shown = value
            elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                metas = meta if isinstance(meta, list) else [None] * len(value)
                pairs = [_split(v, m, expr.model_type) for v, m in zip(value, metas)]
                reasoning, answer = [r for r, _ in pairs], [a for _, a in pairs]  # type: ignore[assignment]
                shown = value[0] if value else ""  # the text continues with the first
            else:
                continue
            if shown and self.text_.endswith(shown):
                self.text_ = self.text_[: len(self.text_) - len(shown)] + (answer[0] if isinstance(answer, list) else answer)
            self.set_var(f"{name}_reasoning_content", reasoning)
            self.set_var(name, answer)

    def _tool_result(self, expr: ToolResult) -> None:
        self._role_begin("tool")
        self._append(expr.content)
        self._role_end("tool", {"tool_call_id": expr.call_id, "name": expr.name})

    def _select(self, sel: Select) -> None:
        method = sel.choices_method if isinstance(sel.choices_method, str) else repr(sel.choices_method)
        sent = {"choices": list(sel.choices), "choices_method": method, "temperature": sel.temperature}
        index, meta = self._call("select", sel.name, sent, lambda: self.backend.select(self, sel),
                                 lambda r: ({"choice": sel.choices[r[0]]}, r[1]))
        choice = sel.choices[index]
        self._append(choice, sel.name, meta)
        self._finish_var(sel.name, choice, meta)

    def _gen(self, gen: Gen) -> None:
        sampling = self._sampling(gen)
        sent = {"sampling_params": sampling.to_native()}
        if gen.tools is not None:
            tools = ToolSet(gen.tools)
            sent["tools"] = sorted(tools.names)
            text, value, meta = self._call("tool_call", gen.name, sent,
                                           lambda: self.backend.tool_call(self, gen, sampling, tools),
                                           lambda r: ({"tool_call": r[0], "finish_reason": _finish(r[2])}, r[2]))
            if gen.name is not None:
                self.tool_sets[gen.name] = tools
            self._append(text, gen.name, meta)
            self._finish_var(gen.name, value, meta)
            return
        if self.stream and (sampling.n or 1) == 1:
            text, meta = self._call("gen", gen.name, sent, lambda: self._gen_streamed(gen, sampling), _received_text)
        else:
            text, meta = self._call("gen", gen.name, sent, lambda: self.backend.generate(self, gen, sampling), _received_text)
            self._append(text[0] if isinstance(text, list) else text, gen.name, meta)
        value: Any = text
        if gen.output_type is not None:  # typed output: the variable is the parsed instance
            if isinstance(text, list):
                value = [gen.output_type.parse(t, m.get("finish_reason")) for t, m in zip(text, meta)]
                meta = [{**m, "raw_text": t} for t, m in zip(text, meta)]
            else:
                value = gen.output_type.parse(text, meta.get("finish_reason"))
                meta = {**meta, "raw_text": text}
        self._finish_var(gen.name, value, meta)

    def _gen_streamed(self, gen: Gen, sampling: SamplingArgs) -> tuple[str, dict[str, Any]]:
        parts = []
        final: dict[str, Any] = {}
        for piece, chunk_meta in self.backend.generate_stream(self, gen, sampling):
            parts.append(piece)
            if piece or chunk_meta is not None:
                self._append(piece, gen.name, chunk_meta)
            final = chunk_meta or final
        return "".join(parts), final

    def _sampling(self, gen: Gen) -> SamplingArgs:
        """The gen's sampling arguments over the run's defaults and global_config's switches."""
        sampling = gen.sampling.merged(self.defaults)
        if sampling.skip_special_tokens is None and not global_config.skip_special_tokens_in_output:
            sampling = replace(sampling, skip_special_tokens=False)
        if sampling.spaces_between_special_tokens is None and not global_config.spaces_between_special_tokens_in_out:
            sampling = replace(sampling, spaces_between_special_tokens=False)
        return sampling

    def _call(self, primitive: str, name: str | None, sent: dict[str, Any], call: Callable[[], Any],
              received: Callable[[Any], tuple[dict[str, Any], Any]]) -> Any:
        """`call()`, timed and recorded in the run's trace (with `received(result)`: what came
        back and the meta info) when the run is traced."""
        if self.trace is None:
            return call()
        if self.backend.sends_messages:
            sent = {"messages": [dict(m) for m in self.messages_], **sent}
        else:
            sent = {"prompt": self.text_, **sent}
        started_at, t0 = time.time(), time.perf_counter()
        try:
            result = call()
        except BaseException as e:
            self.trace.record(self.branch, primitive, name, sent, {}, None, started_at, time.perf_counter() - t0, e)
            raise
        latency_s = time.perf_counter() - t0
        got, meta = received(result)
        self.trace.record(self.branch, primitive, name, sent, got, meta, started_at, latency_s)
        return result

    def _finish_var(self, name: str | None, value: Any, meta: dict[str, Any]) -> None:
        if name is not None:
            self.meta_info[name] = meta
            self.set_var(name, value)

    def _append(self, text: str, var: str | None = None, meta: Any = None) -> None:
        self.text_ += text
        with self._cond:
            self._chunks.append((var, text, meta))
            self._cond.notify_all()

    def _role_begin(self, role: str) -> None:
        if self.cur_role is not None:
            raise ValueError(f"role {role!r} begins inside role {self.cur_role!r}; end that first")
        first = not self.messages_ and not self.text_
        self._append(self.backend.chat_template.prefix(role, first))
        self.cur_role, self.cur_role_begin = role, len(self.text_)

    def _role_end(self, role: str, extra: dict[str, Any] | None = None) -> None:
        if self.cur_role != role:
            raise ValueError(f"role {role!r} ends but the current role is {self.cur_role!r}")
        message: dict[str, Any] = {"role": role, "content": self.text_[self.cur_role_begin :]}
        extra = {**self.message_extra, **(extra or {})}
        self.message_extra = {}
        message.update({k: v for k, v in extra.items() if v is not None})
        self.messages_.append(message)
        self._append(self.backend.chat_template.suffix(role))
        self.cur_role = None


def _split(text: str, meta: Any, model_type: str) -> tuple[str, str]:
    """(reasoning, answer) of one generated text."""
    if isinstance(meta, dict) and isinstance(meta.get("reasoning_content"), str):
        return meta["reasoning_content"], text
    return separate_reasoning(text, model_type)


def _finish(meta: Any) -> Any:
    return [m.get("finish_reason") for m in meta] if isinstance(meta, list) else (meta or {}).get("finish_reason")


def _received_text(result: tuple[Any, Any]) -> tuple[dict[str, Any], Any]:
    text, meta = result
    return {"text": text, "finish_reason": _finish(meta)}, meta


_HANDLERS: dict[type, Callable[[StreamExecutor, Any], None]] = {
    Text: lambda s, e: s._append(e.text),
    Concat: StreamExecutor._concat,
    Gen: StreamExecutor._gen,
    Select: StreamExecutor._select,
    RoleBegin: lambda s, e: s._role_begin(e.role),
    RoleEnd: lambda s, e: s._role_end(e.role),
    VarScopeBegin: lambda s, e: s.var_scope_begin.__setitem__(e.name, len(s.text_)),
    VarScopeEnd: StreamExecutor._var_scope_end,
    ToolResult: StreamExecutor._tool_result,
    SeparateReasoning: StreamExecutor._separate_reasoning,
    Media: lambda s, e: s.backend.add_media(s, e),
}
