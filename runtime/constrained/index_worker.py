"""Token indexes built in child processes, so that a build that runs too long or too big is killed.

outlines-core determinizes a regex and walks every token through the DFA in Rust, with nothing we
could interrupt: a pathological regex (`(a|b)*a(a|b){25}` has 2**25 DFA states) would otherwise
keep a core and gigabytes busy for as long as it likes, in the scheduler process. `IndexWorker.build`
sends the regex to a child (this file run as a script: it imports only outlines-core), waits at
most `timeout_s`, and kills the child when the deadline passes. Up to `max_builders` builds run at
once, each in its own child, so a slow build holds up no other: children start when first needed,
receive the vocabulary once, serve one build at a time and are reused; a killed one is replaced
by the next build that needs it. Each child's address space is capped (a build that needs more
fails instead of pushing the machine into the OOM killer), and it dies with the thread that
started it.

A build can also run in steps (`start`, `is_answering`, then `result` or `cancel`), and a running
build can move to another worker with a free slot (`hand_over`: its child, its start time and so
its deadline go along, no work is lost). The grammar backend's fast and slow lanes are two workers.

Protocol on a child's stdin / stdout: length-prefixed pickles. First the Vocabulary, then one
(regex, end-marker token id or None) per build; each answer is ("ok", (Index, distances or None))
or ("error", message), distances being `token_distances` (for output budgets). Indexes pickle compactly: the
free-form JSON index (1,600 states) is ~20 MB and ~0.4 s each way; typical ones are far smaller.

This module must stay importable without the rest of radixlm (the child runs it as a script).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import outlines_core

_HEADER = struct.Struct("<Q")


@dataclass(eq=False)
class _Builder:
    """One child process and the vocabulary it was sent (compared by identity)."""

    proc: subprocess.Popen[bytes]
    vocabulary: outlines_core.Vocabulary


@dataclass(eq=False)
class Build:
    """One build running in a child. From `IndexWorker.start` until `result`, `cancel` or
    `hand_over` it holds one of its worker's slots, and that worker owns the child."""

    builder: _Builder
    started: float  # time.monotonic() when the child was sent the build; the deadline counts from here


class IndexWorker:
    """Builds outlines-core indexes in child processes, each build with a deadline and a memory cap.

    Thread-safe: up to `max_builders` builds run at once, each in a child of its own; further
    callers wait for a free builder. The deadline counts from the moment a build starts, not from
    when it queued, and a build past it kills only its own child. Every child holds a copy of the
    vocabulary and may use up to `max_memory_bytes`, so `max_builders` bounds both.
    """

    def __init__(self, timeout_s: float, max_memory_bytes: int, max_builders: int = 1):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_builders < 1:
            raise ValueError(f"max_builders must be >= 1, got {max_builders}")
        self.timeout_s = timeout_s
        self.max_memory_bytes = max_memory_bytes
        self.max_builders = max_builders
        # one slot per Build in progress (held from `start` to `result`, `cancel` or `hand_over`)
        self._free_slots = threading.BoundedSemaphore(max_builders)
        # Each child we own is idle or busy (held by one build), never both; every build holds a
        # slot, so len(_idle) + len(_busy) <= max_builders. close() empties both.
        self._idle: list[_Builder] = []
        self._busy: set[_Builder] = set()
        self._lock = threading.Lock()  # guards _idle and _busy

    def build(self, regex: str, vocabulary: outlines_core.Vocabulary) -> outlines_core.Index:
        """`outlines_core.Index(regex, vocabulary)`, built in a child.

        Raises ValueError with outlines-core's message if it rejects the regex, or with a message
        saying so if the build ran past the deadline or the child died (out of memory, crashed).
        """
        index, _ = self.result(self.start((regex, None), vocabulary))
        return index

    def build_with_distances(
        self, regex: str, vocabulary: outlines_core.Vocabulary, end_token_id: int
    ) -> tuple[outlines_core.Index, dict[int, int]]:
        """As `build`, plus `token_distances(index, end_token_id)`, computed in the child too
        (under the same deadline and memory cap)."""
        return self.result(self.start((regex, end_token_id), vocabulary))

    def start(self, request: tuple[str, int | None], vocabulary: outlines_core.Vocabulary) -> Build:
        """Sends (regex, end-marker token id or None) to a child, once a slot is free; the caller
        must then end the build with `result`, `cancel` or `hand_over`. ValueError if no child
        could be started."""
        self._free_slots.acquire()
        try:
            builder = self._acquire(vocabulary)
        except BaseException:
            self._free_slots.release()
            raise
        build = Build(builder, time.monotonic())
        try:
            send_message(builder.proc.stdin, request)
        except OSError:
            pass  # the child died: `result` reads EOF and says so
        return build

    def is_answering(self, build: Build, until: float) -> bool:
        """Whether the child has begun to answer (or died) by `until` (time.monotonic()), waiting
        until then at most. A build that has not may go on: nothing changes."""
        fd = build.builder.proc.stdout.fileno()
        return bool(select.select([fd], [], [], max(0.0, until - time.monotonic()))[0])

    def result(self, build: Build) -> Any:
        """The answer of a `start`ed build, waited for until its deadline (`started + timeout_s`);
        frees its slot. Raises ValueError as `build` does."""
        builder = build.builder
        try:
            status, payload = receive_message(builder.proc.stdout, build.started + self.timeout_s)
        except TimeoutError:
            self.cancel(build)
            raise ValueError(
                f"building its token index took longer than {self.timeout_s:g} s, the limit "
                "(the regex is too complex: too many states)"
            ) from None
        except (EOFError, OSError, pickle.UnpicklingError):
            code = self.cancel(build)
            raise ValueError(
                f"the process building its token index died ({describe_exit(code)}); "
                "the regex is likely too large"
            ) from None
        self._release(builder)
        self._free_slots.release()
        if status != "ok":
            raise ValueError(str(payload))
        return payload

    def cancel(self, build: Build) -> int | None:
        """Kills the child of a `start`ed build and frees its slot; the child's exit code."""
        code = self._discard(build.builder)
        self._free_slots.release()
        return code

    def hand_over(self, build: Build, to: IndexWorker) -> bool:
        """Moves a running build (its child, its slot, its start time) to `to` if `to` has a free
        slot now; `to` then ends it (under `to.timeout_s`) and owns the child. False (nothing
        moved) if `to` has no free slot or this worker was closed meanwhile; this worker then still
        holds the build."""
        if not to._free_slots.acquire(blocking=False):
            return False
        builder = build.builder
        with self._lock:
            is_mine = builder in self._busy
            self._busy.discard(builder)
        if not is_mine:
            to._free_slots.release()
            return False
        with to._lock:
            to._busy.add(builder)
        self._free_slots.release()
        return True

    def close(self) -> None:
        """Kills the children (builds in progress then fail). The worker can be used again."""
        with self._lock:
            idle, busy = self._idle, list(self._busy)
            self._idle, self._busy = [], set()
        for builder in idle:
            kill_child(builder.proc)
        for builder in busy:  # its build sees EOF, then closes the pipes and reaps the child
            if builder.proc.poll() is None:
                builder.proc.kill()

    @property
    def pids(self) -> list[int]:
        """The pids of the children that run now, idle or building (for tests)."""
        with self._lock:
            builders = [*self._idle, *self._busy]
        return sorted(b.proc.pid for b in builders if b.proc.poll() is None)

    def _acquire(self, vocabulary: outlines_core.Vocabulary) -> _Builder:
        """An idle child that has `vocabulary`, else a new one (the caller holds a free slot)."""
        with self._lock:
            is_usable = [b.vocabulary is vocabulary and b.proc.poll() is None for b in self._idle]
            stale = [b for b, ok in zip(self._idle, is_usable) if not ok]
            self._idle = [b for b, ok in zip(self._idle, is_usable) if ok]
            reused = self._idle.pop() if self._idle else None
            # started under the lock, so that close() never misses a child
            builder = reused or _Builder(self._spawn(), vocabulary)
            self._busy.add(builder)
        for old in stale:
            kill_child(old.proc)
        if reused is None:
            try:
                send_message(builder.proc.stdin, vocabulary)
            except OSError:
                self._discard(builder)
                raise ValueError("could not start the process that builds token indexes") from None
        return builder

    def _release(self, builder: _Builder) -> None:
        """Back to the idle children after a build it answered, unless close() dropped it meanwhile."""
        with self._lock:
            is_kept = builder in self._busy
            if is_kept:
                self._busy.remove(builder)
                self._idle.append(builder)
        if not is_kept:
            kill_child(builder.proc)

    def _discard(self, builder: _Builder) -> int | None:
        """Kills the child of a failed build; its exit code."""
        with self._lock:
            self._busy.discard(builder)
        return kill_child(builder.proc)

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(self.max_memory_bytes), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )


def kill_child(proc: subprocess.Popen[bytes]) -> int | None:
    """Kills a child process if it still runs, closes its pipes; its exit code."""
    if proc.poll() is None:
        proc.kill()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()
    return proc.wait()


def describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def send_message(stream: Any, obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def receive_message(stream: Any, deadline: float | None) -> Any:
    """One message from a pipe, reading its fd directly; TimeoutError past `deadline`."""
    fd = stream.fileno()
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exact(fd, size, deadline))


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------- the child


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the thread that started it exits (Linux); exit now if it has."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent_pid:
        os._exit(0)


def token_distances(index: outlines_core.Index, end_token_id: int) -> dict[int, int]:
    """The fewest tokens from each state of `index` to a state where the end-marker token
    `end_token_id` leads to a final state (the regex is complete there: distance 0). States that
    can never complete are absent. A breadth-first search backwards over the distinct successor
    states: what a state's tokens spell does not matter, only where they lead."""
    predecessors: dict[int, list[int]] = {}
    complete = []
    for state, edges in index.get_transitions().items():
        end = edges.get(end_token_id)
        if end is not None and index.is_final_state(end):
            complete.append(state)
        for successor in set(edges.values()):
            predecessors.setdefault(successor, []).append(state)
    distances = dict.fromkeys(complete, 0)
    frontier, depth = complete, 0
    while frontier:
        depth += 1
        reached = []
        for state in frontier:
            for before in predecessors.get(state, ()):
                if before not in distances:
                    distances[before] = depth
                    reached.append(before)
        frontier = reached
    return distances


def _child_main(max_memory_bytes: int, parent_pid: int) -> None:
    import resource

    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent decides
    resource.setrlimit(resource.RLIMIT_AS, (max_memory_bytes, max_memory_bytes))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    vocabulary = receive_message(stdin, None)
    while True:
        try:
            regex, end_token_id = receive_message(stdin, None)
        except EOFError:
            return
        try:
            index = outlines_core.Index(regex, vocabulary)
            distances = None if end_token_id is None else token_distances(index, end_token_id)
            answer: tuple[str, object] = ("ok", (index, distances))
        except ValueError as e:
            answer = ("error", str(e))
        except MemoryError:
            answer = ("error", "out of memory while building the token index (the regex is too large)")
        send_message(stdout, answer)


if __name__ == "__main__":
    _child_main(int(sys.argv[1]), int(sys.argv[2]))
