"""Program traces: what each model call of a run sent and got back, its tokens and its latency.

`prog.run(..., trace=True)` (or `run_batch(..., trace=True)`, or `global_config.enable_tracing`)
records one `TraceEntry` per primitive the program ran (gen, select, tool call), forks included
(`branch` "0", "1", "0.1" ... tells them apart; "" is the program itself), in the order they
finished. `state.trace()` returns them as a `ProgramTrace`, whose `write_jsonl` writes one JSON
object per line (a run's entries carry its program name and `run_id`, so the traces of many runs,
e.g. a whole `run_batch` via `write_traces`, can share one file).

Fields: `sent` is the request as the program made it (`prompt`: the state's text, roles rendered
by the chat template; `messages` instead where the backend's API takes chat messages;
`sampling_params` in the native API's names; for select `choices` and `choices_method`);
`received` is what came back (`text`, a list for n > 1; for select the `choice`; for a tool call
`tool_call`) and the `finish_reason`; `prompt_tokens`, `cached_tokens`, `completion_tokens` are
the server's counts (None where the API reports none; summed over the requests of an n > 1 gen);
`latency_s` is the wall time of the call as the program waited for it, `started_at` its Unix
time; `error` the error's text if the call failed (the run then raises it).

`RuntimeEndpoint.send_trace(state.trace())` sends a run's calls to the server (`POST /traces`,
without the texts), whose dashboard draws them as a timeline.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any


@dataclass(frozen=True)
class TraceEntry:
    program: str
    run_id: str
    branch: str
    index: int  # 0, 1, ... in the order the calls finished, across the run's forks
    primitive: str  # "gen" | "select" | "tool_call"
    name: str | None
    sent: dict[str, Any]
    received: dict[str, Any]
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    started_at: float
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TraceLog:
    """The entries of one run, shared by the program's state and its forks (appended under a lock)."""

    program: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    entries: list[TraceEntry] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, branch: str, primitive: str, name: str | None, sent: dict[str, Any], received: dict[str, Any],
               meta: Any, started_at: float, latency_s: float, error: BaseException | None = None) -> None:
        counts = _token_counts(meta)
        with self._lock:
            self.entries.append(TraceEntry(
                self.program, self.run_id, branch, len(self.entries), primitive, name, sent, received, *counts,
                latency_s=latency_s, started_at=started_at, error=None if error is None else f"{type(error).__name__}: {error}",
            ))

    def snapshot(self) -> ProgramTrace:
        with self._lock:
            return ProgramTrace(tuple(self.entries))


@dataclass(frozen=True)
class ProgramTrace:
    """A run's trace entries (a sequence), with totals and JSON-lines output."""

    entries: tuple[TraceEntry, ...]

    def __iter__(self) -> Iterator[TraceEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i: int) -> TraceEntry:
        return self.entries[i]

    def totals(self) -> dict[str, Any]:
        """Calls, tokens (None counted as 0) and latency summed over the entries."""
        return {
            "calls": len(self.entries),
            "prompt_tokens": sum(e.prompt_tokens or 0 for e in self.entries),
            "cached_tokens": sum(e.cached_tokens or 0 for e in self.entries),
            "completion_tokens": sum(e.completion_tokens or 0 for e in self.entries),
            "latency_s": sum(e.latency_s for e in self.entries),
        }

    def to_calls(self) -> list[dict[str, Any]]:
        """The entries as a server's `POST /traces` takes them (`RuntimeEndpoint.send_trace`):
        counts and times, without the text sent and received."""
        return [{k: v for k, v in e.to_dict().items() if k not in ("sent", "received")} for e in self.entries]

    def to_jsonl(self) -> str:
        return "".join(json.dumps(e.to_dict(), ensure_ascii=False, default=str) + "\n" for e in self.entries)

    def write_jsonl(self, file: str | Path | IO[str], append: bool = True) -> None:
        """Write the entries, one JSON object per line, to a path (appended to by default) or an
        open text file."""
        _write(self.to_jsonl(), file, append)


def write_traces(states: Iterable[Any], file: str | Path | IO[str], append: bool = True) -> int:
    """Write the traces of several runs (e.g. the states `run_batch` returned) as JSON lines;
    returns the number of entries written."""
    traces = [state.trace() for state in states]
    _write("".join(t.to_jsonl() for t in traces), file, append)
    return sum(len(t) for t in traces)


def _write(text: str, file: str | Path | IO[str], append: bool) -> None:
    if isinstance(file, (str, Path)):
        with open(file, "a" if append else "w", encoding="utf-8") as f:
            f.write(text)
    else:
        file.write(text)


def _token_counts(meta: Any) -> tuple[int | None, int | None, int | None]:
    """(prompt, cached, completion) tokens of a call's meta info (a list of metas for n > 1: summed)."""
    metas = meta if isinstance(meta, list) else [meta]
    counts: list[int | None] = []
    for key in ("prompt_tokens", "cached_tokens", "completion_tokens"):
        values = [m.get(key) for m in metas if isinstance(m, dict) and m.get(key) is not None]
        counts.append(sum(values) if values else None)
    return counts[0], counts[1], counts[2]
