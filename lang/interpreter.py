"""The interpreter: a program state and the executor that runs its expressions.

`s += expr` queues `expr` on the state's executor, a worker thread that runs expressions in
order against the backend, so the program's Python code runs ahead until it reads a result
(`s["x"]`, `s.text()`), and forked states (`s.fork(n)`) run their branches in parallel. An
expression that fails stops its state: later expressions are skipped, reading an unset variable
raises the error, and `run` raises it (`run_batch` keeps it on that item's state).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from radixlm.backend.base import Backend
from radixlm.ir import (
    Concat,
    Expr,
    Gen,
    RoleBegin,
    RoleEnd,
    SamplingArgs,
    Select,
    Text,
    ToolResult,
    VarScopeBegin,
    VarScopeEnd,
    as_expr,
)
from radixlm.tools import ToolCall, ToolSet

_END = object()


class StreamExecutor:
    def __init__(self, backend: Backend, defaults: SamplingArgs, stream: bool = False):
        self.backend = backend
        self.defaults = defaults
        self.stream = stream
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
        self._chunks: list[tuple[str | None, str]] = []  # (variable or None, text) as appended
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
        if n > 1:
            self.backend.cache_prefix(self.text_)  # the shared prefix is computed once, before the branches
        forks = []
        for _ in range(n):
            child = StreamExecutor(self.backend, self.defaults, self.stream)
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
        index = 0
        while True:
            with self._cond:
                while index >= len(self._chunks) and not self._finished:
                    self._cond.wait()
                pending, index = self._chunks[index:], len(self._chunks)
                finished = self._finished
            for var, text in pending:
                if var_name is None or var == var_name:
                    yield text
            if finished and index >= len(self._chunks):
                if self.error_ is not None:
                    raise self.error_
                return

    async def text_async_iter(self, var_name: str | None = None) -> AsyncIterator[str]:
        iterator = self.text_iter(var_name)
        done = object()
        while (chunk := await asyncio.to_thread(next, iterator, done)) is not done:
            yield chunk  # type: ignore[misc]

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
        if isinstance(expr, Text):
            self._append(expr.text)
        elif isinstance(expr, Concat):
            for part in expr.parts:
                self._run(part)
        elif isinstance(expr, Gen):
            self._gen(expr)
        elif isinstance(expr, Select):
            index, meta = self.backend.select(self, expr)
            choice = expr.choices[index]
            self._append(choice, expr.name)
            self._finish_var(expr.name, choice, meta)
        elif isinstance(expr, RoleBegin):
            self._role_begin(expr.role)
        elif isinstance(expr, RoleEnd):
            self._role_end(expr.role)
        elif isinstance(expr, VarScopeBegin):
            self.var_scope_begin[expr.name] = len(self.text_)
        elif isinstance(expr, VarScopeEnd):
            begin = self.var_scope_begin.pop(expr.name, None)
            if begin is None:
                raise ValueError(f"var_scope {expr.name!r} ended without beginning")
            self.set_var(expr.name, self.text_[begin:])
        elif isinstance(expr, ToolResult):
            self._role_begin("tool")
            self._append(expr.content)
            self._role_end("tool", {"tool_call_id": expr.call_id, "name": expr.name})
        else:
            raise TypeError(f"unknown expression {expr!r}")

    def _gen(self, gen: Gen) -> None:
        sampling = gen.sampling.merged(self.defaults)
        if gen.tools is not None:
            tools = ToolSet(gen.tools)
            text, value, meta = self.backend.tool_call(self, gen, sampling, tools)
            if gen.name is not None:
                self.tool_sets[gen.name] = tools
            self._append(text, gen.name)
            self._finish_var(gen.name, value, meta)
            return
        if self.stream:
            parts = []
            final: dict[str, Any] = {}
            for piece, chunk_meta in self.backend.generate_stream(self, gen, sampling):
                if piece:
                    parts.append(piece)
                    self._append(piece, gen.name)
                final = chunk_meta or final
            self._finish_var(gen.name, "".join(parts), final)
            return
        text, meta = self.backend.generate(self, gen, sampling)
        self._append(text, gen.name)
        self._finish_var(gen.name, text, meta)

    def _finish_var(self, name: str | None, value: Any, meta: dict[str, Any]) -> None:
        if name is not None:
            self.meta_info[name] = meta
            self.set_var(name, value)

    def _append(self, text: str, var: str | None = None) -> None:
        self.text_ += text
        with self._cond:
            self._chunks.append((var, text))
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


class ProgramState:
    """The `s` of a program: extend it with `+=`, read variables with `s["name"]`."""

    def __init__(self, executor: StreamExecutor):
        self.stream_executor = executor

    def __iadd__(self, other: Any) -> ProgramState:
        self.stream_executor.submit(as_expr(other))
        return self

    def __getitem__(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self.stream_executor.variables

    def get_var(self, name: str) -> Any:
        return self[name]

    def set_var(self, name: str, value: Any) -> None:
        self[name] = value

    def text(self) -> str:
        self.sync()
        return self.stream_executor.text_

    def messages(self) -> list[dict[str, Any]]:
        self.sync()
        return [dict(m) for m in self.stream_executor.messages_]

    def get_meta_info(self, name: str) -> dict[str, Any]:
        self.stream_executor.get_var(name)
        return self.stream_executor.meta_info[name]

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self) -> BaseException | None:
        self.sync()
        return self.stream_executor.error_

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything appended inside the block becomes variable `name`."""
        self += VarScopeBegin(name)
        yield
        self += VarScopeEnd(name)

    def fork(self, n: int = 1) -> ProgramStateGroup:
        """n copies of this state that continue independently (their shared prefix is cached first)."""
        if n < 1:
            raise ValueError("fork: n must be >= 1")
        return ProgramStateGroup([ProgramState(e) for e in self.stream_executor.fork(n)], self)

    def run_tool(self, name: str) -> Any:
        """Run the Python function of the tool call in variable `name` and append its result as
        a `tool` message; returns the result. Raises if `name` holds no call."""
        call = self[name]
        if not isinstance(call, ToolCall):
            raise ValueError(f"variable {name!r} holds no tool call (the model answered in text: {str(call)[:80]!r})")
        result = self.stream_executor.tool_sets[name].run(call)
        self += ToolResult(result if isinstance(result, str) else _to_json(result), call.id, call.name)
        return result

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        return self.stream_executor.text_iter(var_name)

    def text_async_iter(self, var_name: str | None = None) -> AsyncIterator[str]:
        return self.stream_executor.text_async_iter(var_name)

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ProgramStateGroup:
    """The states `fork` made: index, iterate, `+=` to all, and `join` back into the parent."""

    def __init__(self, states: list[ProgramState], parent: ProgramState):
        self.states = states
        self.parent = parent

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> ProgramStateGroup:
        """`forks += expr` (to every fork), or a list with one expression per fork."""
        if isinstance(other, list):
            if len(other) != len(self.states):
                raise ValueError(f"forks += list: got {len(other)} expressions for {len(self.states)} forks")
            for state, expr in zip(self.states, other):
                state += expr
        else:
            for state in self.states:
                state += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """gather_variable: each variable the forks set becomes, in the parent, the list of their
        values; concate_and_append: also append each fork's new text to the parent, in order."""
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError("join: mode must be 'gather_variable' or 'concate_and_append'")
        for state in self.states:
            state.sync()
        parent = self.parent.stream_executor
        parent.sync()
        base_vars, base_len = parent.variables, len(parent.text_)
        names: list[str] = []
        for state in self.states:
            for name, value in state.stream_executor.variables.items():
                if name not in names and (name not in base_vars or base_vars[name] is not value):
                    names.append(name)
        for name in names:
            self.parent[name] = [s.stream_executor.variables.get(name) for s in self.states]
        if mode == "concate_and_append":
            self.parent += "".join(s.stream_executor.text_[base_len:] for s in self.states)
        for state in self.states:
            state.stream_executor.end()


def _to_json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, default=str)
