"""The `s` of a program (`ProgramState`) and the states `fork` makes (`ProgramStateGroup`).

A state queues what the program adds on its executor (`interpreter.py`) and reads results back;
its methods are SGLang's (`ProgramState` / `ProgramStateGroup` in sglang.lang.interpreter), plus
`run_tool` (tools.py) and `trace` (trace.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from radixlm.interpreter import StreamExecutor
from radixlm.ir import Concat, RoleBegin, RoleEnd, ToolResult, VarScopeBegin, VarScopeEnd, as_expr
from radixlm.tools import ToolCall
from radixlm.trace import ProgramTrace


class ProgramState:
    """The `s` of a program: extend it with `+=`, read variables with `s["name"]`. After `run`,
    `ret_value` is what the program function returned."""

    def __init__(self, executor: StreamExecutor):
        self.stream_executor = executor
        self.ret_value: Any = None

    def __iadd__(self, other: Any) -> ProgramState:
        if other is None:
            raise ValueError("tried to append None to the program state")
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

    def get_meta_info(self, name: str) -> Any:
        """The meta info of the gen/select that set `name` (a list for a gen with n > 1): token
        counts, finish_reason, logprobs, scores; `raw_text` for a typed gen."""
        self.stream_executor.get_var(name)
        return self.stream_executor.meta_info[name]

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self) -> BaseException | None:
        self.sync()
        return self.stream_executor.error_

    def trace(self) -> ProgramTrace:
        """The model calls of this run so far (see trace.py); the run must have been traced."""
        self.sync()
        log = self.stream_executor.trace
        if log is None:
            raise ValueError("this run kept no trace: run the program with trace=True "
                             "(or set radixlm.global_config.enable_tracing = True)")
        return log.snapshot()

    # ------------------------------------------------------------------ roles and scopes
    def system(self, expr: Any = None) -> Any:
        """`s.system("...")` appends a system message; `with s.system():` wraps what the block adds."""
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    def _role(self, role: str, expr: Any) -> Any:
        if expr is not None:
            message = Concat([RoleBegin(role), as_expr(expr), RoleEnd(role)])
            self.stream_executor.submit(message)
            return message
        return self._role_scope(role)

    @contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self.stream_executor.submit(RoleBegin(role))
        yield
        self.stream_executor.submit(RoleEnd(role))

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything appended inside the block becomes variable `name`."""
        self += VarScopeBegin(name)
        yield
        self += VarScopeEnd(name)

    # ------------------------------------------------------------------ forks
    def fork(self, size: int = 1, position_ids_offset: Any = None) -> ProgramStateGroup:
        """`size` copies of this state that continue independently (their shared prefix is cached
        first; see global_config.enable_parallel_encoding). `position_ids_offset` is accepted for
        SGLang compatibility and must be None."""
        if position_ids_offset is not None:
            raise ValueError("fork: position_ids_offset is not supported")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"fork: size must be a positive integer, got {size!r}")
        return ProgramStateGroup([ProgramState(e) for e in self.stream_executor.fork(size)], self)

    @contextmanager
    def copy(self, position_ids_offset: Any = None) -> Iterator[ProgramState]:
        """`with s.copy() as c:` a fork of one; its variables come back into `s` at the end."""
        group = self.fork(1, position_ids_offset)
        try:
            yield group[0]
        finally:
            group.join()

    # ------------------------------------------------------------------ tools
    def run_tool(self, name: str) -> Any:
        """Run the Python function of the tool call in variable `name` and append its result as
        a `tool` message; returns the result. Raises if `name` holds no call."""
        call = self[name]
        if not isinstance(call, ToolCall):
            raise ValueError(f"variable {name!r} holds no tool call (the model answered in text: {str(call)[:80]!r})")
        result = self.stream_executor.tool_sets[name].run(call)
        content = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
        self += ToolResult(content, call.id, call.name)
        return result

    # ------------------------------------------------------------------ streaming
    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        return self.stream_executor.text_iter(var_name)

    def text_async_iter(self, var_name: str | None = None, return_meta_data: bool = False) -> AsyncIterator[Any]:
        """The text as it is generated; with `return_meta_data` (needs `var_name`), pairs of
        (text, the variable's meta info: {} until its gen finishes, then the final one)."""
        if return_meta_data and var_name is None:
            raise ValueError("text_async_iter: return_meta_data needs a var_name")
        return self.stream_executor.text_async_iter(var_name, return_meta_data)

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ProgramStateGroup:
    """The states `fork` made: index, iterate, `+=` to all, and `join` back into the parent."""

    def __init__(self, states: list[ProgramState], parent: ProgramState):
        self.states = states
        self.parent = parent

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        # `forks[i] += expr` assigns the fork back to its own place; nothing else may be put there
        if value is not self.states[i]:
            raise ValueError("a fork group's states cannot be replaced")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> ProgramStateGroup:
        """`forks += expr` (to every fork), a list/tuple with one expression per fork, or a
        function of the fork's index (`forks += lambda i: f"Idea {i}:"`)."""
        if isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"forks += list: got {len(other)} expressions for {len(self.states)} forks")
            for state, expr in zip(self.states, other):
                state += expr
        elif callable(other):
            make: Callable[[int], Any] = other
            for i, state in enumerate(self.states):
                state += make(i)
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
