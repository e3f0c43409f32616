"""Token indexes built in a child process, so that a build that runs too long or too big is killed.

outlines-core determinizes a regex and walks every token through the DFA in Rust, with nothing we
could interrupt: a pathological regex (`(a|b)*a(a|b){25}` has 2**25 DFA states) would otherwise
keep a core and gigabytes busy for as long as it likes, in the scheduler process. `IndexWorker.build`
sends the regex to a long-lived child (this file run as a script: it imports only outlines-core),
waits at most `timeout_s`, and kills the child when the deadline passes; the next build starts a
fresh one. The child's address space is capped (a build that needs more fails instead of pushing
the machine into the OOM killer), and it dies with the thread that started it.

Protocol on the child's stdin / stdout: length-prefixed pickles. First the Vocabulary, then one
regex per build; each answer is ("ok", Index) or ("error", message). Indexes pickle compactly: the
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
from typing import Any

import outlines_core

_HEADER = struct.Struct("<Q")


class IndexWorker:
    """Builds outlines-core indexes in a child process with a deadline and a memory cap.

    Thread-safe: builds are serialized (one child, one build at a time); the deadline counts from
    the moment a build starts, not from when it queued.
    """

    def __init__(self, timeout_s: float, max_memory_bytes: int):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.max_memory_bytes = max_memory_bytes
        self._proc: subprocess.Popen[bytes] | None = None
        self._vocabulary: outlines_core.Vocabulary | None = None
        self._lock = threading.Lock()

    def build(self, regex: str, vocabulary: outlines_core.Vocabulary) -> outlines_core.Index:
        """`outlines_core.Index(regex, vocabulary)`, built in the child.

        Raises ValueError with outlines-core's message if it rejects the regex, or with a message
        saying so if the build ran past the deadline or the child died (out of memory, crashed).
        """
        with self._lock:
            proc = self._ensure_started(vocabulary)
            deadline = time.monotonic() + self.timeout_s
            try:
                _send(proc.stdin, regex)
                status, payload = _receive(proc.stdout, deadline)
            except TimeoutError:
                self._stop()
                raise ValueError(
                    f"building its token index took longer than {self.timeout_s:g} s, the limit "
                    "(the regex is too complex: too many states)"
                ) from None
            except (EOFError, OSError, pickle.UnpicklingError):
                code = self._stop()
                raise ValueError(
                    f"the process building its token index died ({_describe_exit(code)}); "
                    "the regex is likely too large"
                ) from None
        if status != "ok":
            raise ValueError(str(payload))
        return payload

    def close(self) -> None:
        """Kills the child (a build in progress then fails). The worker can be used again."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _kill(proc)

    @property
    def pid(self) -> int | None:
        """The child's pid while one runs (for tests)."""
        return None if self._proc is None or self._proc.poll() is not None else self._proc.pid

    def _ensure_started(self, vocabulary: outlines_core.Vocabulary) -> subprocess.Popen[bytes]:
        proc = self._proc
        if proc is not None and proc.poll() is None and self._vocabulary is vocabulary:
            return proc
        self._stop()
        proc = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(self.max_memory_bytes), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        try:
            _send(proc.stdin, vocabulary)
        except OSError:
            _kill(proc)
            raise ValueError("could not start the process that builds token indexes") from None
        self._proc, self._vocabulary = proc, vocabulary
        return proc

    def _stop(self) -> int | None:
        proc, self._proc = self._proc, None
        return None if proc is None else _kill(proc)


def _kill(proc: subprocess.Popen[bytes]) -> int | None:
    if proc.poll() is None:
        proc.kill()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()
    return proc.wait()


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def _send(stream: Any, obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: Any, deadline: float | None) -> Any:
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


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the thread that started it exits (Linux); exit now if it has."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent_pid:
        os._exit(0)


def _child_main(max_memory_bytes: int, parent_pid: int) -> None:
    import resource

    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent decides
    resource.setrlimit(resource.RLIMIT_AS, (max_memory_bytes, max_memory_bytes))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    vocabulary = _receive(stdin, None)
    while True:
        try:
            regex = _receive(stdin, None)
        except EOFError:
            return
        try:
            answer: tuple[str, object] = ("ok", outlines_core.Index(regex, vocabulary))
        except ValueError as e:
            answer = ("error", str(e))
        except MemoryError:
            answer = ("error", "out of memory while building the token index (the regex is too large)")
        _send(stdout, answer)


if __name__ == "__main__":
    _child_main(int(sys.argv[1]), int(sys.argv[2]))
