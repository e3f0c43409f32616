"""Large xgrammar grammars compiled in a child process under a memory budget.

xgrammar's `GrammarCompiler.compile_grammar` builds a token-mask cache for every position of the
grammar against the whole vocabulary, in C++, with nothing we could interrupt. Its memory grows
with the grammar (measured with the default model's 49,152-token vocabulary: a 4 MB serialized
grammar, from a 260 KB schema, needs ~120 MB more; an 18 MB one, from a 1.1 MB schema, ~500 MB and
minutes), and in a thread of the scheduler process, which holds the model and the KV pool, a few
such compiles at once could push the server into the OOM killer.

`CompileWorker.compile(form)` sends a grammar's serialized form (`Grammar.serialize_json`) to a
child (this file run as a module), which compiles it against the same vocabulary with its address
space capped at what it held after start-up plus the budget, and answers with the compiled
grammar's own serialization (`CompiledGrammar.serialize_json`), which the caller deserializes
against its `TokenizerInfo`. A compile that needs more than the budget fails in the child (its
allocation fails: an error, or the child dies), and only that compile fails: `BudgetExceeded`
with a message naming the budget; the child is replaced for the next one. A compiled grammar
whose own size exceeds the budget is refused the same way (it would live in the scheduler).

One child, one compile at a time (further callers wait), so the budget also bounds the sum over
concurrent compiles. The child starts on first use (importing xgrammar takes a few seconds) and
dies with the thread that started it. Messages are `index_worker`'s length-prefixed pickles:
first (token bytes, vocab_size, stop token ids, budget bytes), then one form per compile; each
answer is ("ok", compiled JSON), ("error", message) or ("over", message).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Sequence

from radixlm.runtime.constrained.index_worker import (
    describe_exit,
    die_with_parent,
    kill_child,
    receive_message,
    send_message,
)

MIB = 1024 * 1024


class BudgetExceeded(Exception):
    """A compile needed more memory than the budget (or its result is larger than it)."""


def default_budget_mb() -> int:
    """A quarter of the machine's memory (at least 512 MB): what one compile may take."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 4096
    return max(512, total // 4 // MIB)


class CompileWorker:
    """Compiles serialized xgrammar grammars in one child process whose memory is capped.

    Thread-safe: one compile runs at a time. `token_bytes[i]` is token i's bytes as the caller's
    `TokenizerInfo` has them (b"": never allowed), so the child's compiled grammar deserializes
    against the caller's."""

    def __init__(self, token_bytes: Sequence[bytes], vocab_size: int, stop_token_ids: list[int], budget_mb: int):
        if budget_mb < 1:
            raise ValueError(f"the compile memory budget must be >= 1 MB, got {budget_mb}")
        self.budget_mb = budget_mb
        self._setup = (list(token_bytes), vocab_size, stop_token_ids, budget_mb * MIB)
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # one compile at a time; guards _proc

    def compile(self, form: str) -> str:
        """The compiled grammar of `form` (`Grammar.serialize_json`), as `CompiledGrammar.serialize_json`.
        BudgetExceeded past the budget; ValueError with xgrammar's message if it cannot compile it."""
        with self._lock:
            proc = self._child()
            try:
                send_message(proc.stdin, form)
                status, payload = receive_message(proc.stdout, None)
            except (EOFError, OSError, pickle.UnpicklingError):
                code = self._discard()
                raise BudgetExceeded(f"schema compile exceeded the {self.budget_mb} MB budget "
                                     f"(--grammar-compile-memory-mb): its process died ({describe_exit(code)})") from None
            if status == "over":  # the child's allocator failed mid-compile: start afresh next time
                self._discard()
        if status == "ok":
            return str(payload)
        if status == "over":
            raise BudgetExceeded(f"schema compile exceeded the {self.budget_mb} MB budget "
                                 f"(--grammar-compile-memory-mb): {payload}")
        raise ValueError(str(payload))

    @property
    def pid(self) -> int | None:
        """The child's pid while it runs (for tests)."""
        with self._lock:
            return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def close(self) -> None:
        with self._lock:
            self._discard()

    def _child(self) -> subprocess.Popen[bytes]:
        """The running child, started (and sent the vocabulary) if there is none; under the lock."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._discard()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        try:
            send_message(self._proc.stdin, self._setup)
        except OSError:
            pass  # the child died: the compile reads EOF
        return self._proc

    def _discard(self) -> int | None:
        """Kills the child, if any; its exit code. Under the lock."""
        proc, self._proc = self._proc, None
        return None if proc is None else kill_child(proc)


# ---------------------------------------------------------------- the child


def _address_space_bytes() -> int:
    """This process's mapped address space now (VmSize)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def _child_main(parent_pid: int) -> None:
    import resource
    import signal

    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent decides
    # the answers get the pipe to themselves: whatever xgrammar or torch print goes to stderr
    stdout = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    import xgrammar as xgr

    stdin = sys.stdin.buffer
    token_bytes, vocab_size, stop_token_ids, budget_bytes = receive_message(stdin, None)
    info = xgr.TokenizerInfo(token_bytes, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    del token_bytes
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    # one small compile first, so that the threads and arenas a compile makes are counted in the base
    compiler.compile_grammar(xgr.Grammar.from_regex("[a-z]{1,4}"))
    limit = _address_space_bytes() + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    while True:
        try:
            form = receive_message(stdin, None)
        except EOFError:
            return
        answer: tuple[str, str]
        try:
            compiled = compiler.compile_grammar(xgr.Grammar.deserialize_json(form))
            if compiled.memory_size_bytes > budget_bytes:
                answer = ("over", f"the compiled grammar takes {compiled.memory_size_bytes // MIB} MB")
            else:
                answer = ("ok", compiled.serialize_json())
            del compiled
        except MemoryError:
            answer = ("over", "out of memory while compiling")
        except (RuntimeError, ValueError) as e:
            text = str(e)
            is_memory = "bad_alloc" in text or "memory" in text.lower()
            answer = ("over", "out of memory while compiling") if is_memory else ("error", text)
        send_message(stdout, answer)


if __name__ == "__main__":
    _child_main(int(sys.argv[1]))
