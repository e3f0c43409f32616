"""Frontend benchmark: the programs of F1-F4 on radixlm and on the naive baseline, in one run.

Each workload's program runs with `run_batch` (temperature 0) on
  radixlm  the in-process Engine (`EngineBackend`), or a server via `RuntimeEndpoint` (--url);
  naive    the same program on `NaiveTransformersBackend`: every gen / select an independent
           full-prompt transformers call, one at a time (see radixlm.runtime.bench.naive).
Per system: one warm-up program (first forward, grammar compile), then `repeats` timed runs of
the whole batch, each from an empty prefix cache; the figure is the median wall time.

Cache hit rate: over every request the program sent to radixlm in the timed runs (gens, select
scoring, the prefix-caching requests of fork / run_batch / select), the sum of each request's
`cached_tokens` (prompt tokens whose KV came from the radix cache) over the sum of its
`prompt_tokens`. Without retractions this is exactly what the radix cache counts into
`get_server_info()["radix_cache"]["hit_rate"]` (which accumulates over the engine's life).
Agreement: per program, whether all its output variables equal the naive run's, and per value.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from radixlm.backend.base import Backend, NativeBackend
from radixlm.backend.engine import EngineBackend
from radixlm.backend.runtime_endpoint import RuntimeEndpoint
from radixlm.runtime.bench.frontend_workloads import FRONTEND_WORKLOADS, FrontendWorkload
from radixlm.runtime.bench.naive import NaiveTransformersBackend
from radixlm.runtime.bench.results import ResultTables, table_rows


@dataclass
class TokenTally:
    """Token counts of the requests a native backend sent (from their results' meta_info)."""

    num_requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def add(self, result: Any) -> None:
        for r in result if isinstance(result, list) else [result]:
            self.num_requests += 1
            self.prompt_tokens += int(r["meta_info"]["prompt_tokens"])
            self.cached_tokens += int(r["meta_info"].get("cached_tokens", 0))

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class _Tallying(NativeBackend):
    """Mixin for a native backend: tallies the tokens of every /generate-shaped call it makes."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tally = TokenTally()
        self._tally_lock = threading.Lock()

    def call(self, payload: dict[str, Any]) -> Any:
        result = super().call(payload)
        with self._tally_lock:
            self.tally.add(result)
        return result


class TallyingEngineBackend(_Tallying, EngineBackend):
    pass


class TallyingRuntimeEndpoint(_Tallying, RuntimeEndpoint):
    pass


def _token_counts(backend: Backend) -> tuple[int, int]:
    """(prompt tokens, cached prompt tokens) a backend has sent so far (0, 0 if it keeps no count)."""
    if isinstance(backend, _Tallying):
        return backend.tally.prompt_tokens, backend.tally.cached_tokens
    if isinstance(backend, NaiveTransformersBackend):
        return backend.stats.prompt_tokens, 0
    return 0, 0


@dataclass
class SystemRun:
    """One system's runs of one workload."""

    seconds: list[float] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)  # of the last run, per program
    prompt_tokens: int = 0  # summed over the timed runs
    cached_tokens: int = 0

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def run_programs(workload: FrontendWorkload, backend: Backend, batch: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Run the workload's program over `batch` (default: all of it); its outputs, per program."""
    states = workload.program.run_batch(batch if batch is not None else workload.batch, backend=backend, temperature=0)
    outputs = []
    for state in states:
        error = state.error()
        if error is not None:
            raise RuntimeError(f"{workload.name}: a program failed on {type(backend).__name__}: {error!r}") from error
        outputs.append({name: state[name] for name in workload.output_names})
    return outputs


def measure(workload: FrontendWorkload, backend: Backend, repeats: int, warmup: bool = True) -> SystemRun:
    """`repeats` timed runs of the whole batch, each after flushing the prefix cache."""
    if warmup:
        run_programs(workload, backend, workload.batch[:1])
    run = SystemRun()
    for _ in range(repeats):
        if backend.flush_cache() is False and isinstance(backend, _Tallying):
            raise RuntimeError("flush_cache refused: requests are still running")
        prompt_before, cached_before = _token_counts(backend)
        start = time.perf_counter()
        run.outputs = run_programs(workload, backend)
        run.seconds.append(time.perf_counter() - start)
        prompt_after, cached_after = _token_counts(backend)
        run.prompt_tokens += prompt_after - prompt_before
        run.cached_tokens += cached_after - cached_before
    return run


def agreement(ours: list[dict[str, Any]], base: list[dict[str, Any]]) -> tuple[int, int, int, int]:
    """(programs with identical outputs, programs, identical values, values); a list-valued
    variable (a fork's gathered values) counts one value per element."""
    same_programs = sum(a == b for a, b in zip(ours, base))
    same_values = num_values = 0
    for a, b in zip(ours, base):
        for name in a:
            xs, ys = (a[name], b.get(name)) if isinstance(a[name], list) else ([a[name]], [b.get(name)])
            ys = ys if isinstance(ys, list) else [ys]
            num_values += len(xs)
            same_values += sum(x == y for x, y in zip(xs, ys))
    return same_programs, len(ours), same_values, num_values


@dataclass
class WorkloadReport:
    name: str
    title: str
    num_programs: int
    ours: SystemRun
    base: SystemRun | None
    ours_check: str = ""
    base_check: str = ""

    def row(self) -> dict[str, Any]:
        """The report as plain values (what the table prints; what tests check)."""
        out: dict[str, Any] = {
            "workload": self.name, "programs": self.num_programs,
            "radixlm s/program": self.ours.median_s / self.num_programs,
            "radixlm programs/s": self.num_programs / self.ours.median_s,
            "cache hit rate": self.ours.hit_rate,
            "radixlm prompt tokens": self.ours.prompt_tokens // max(len(self.ours.seconds), 1),
            "radixlm cached tokens": self.ours.cached_tokens // max(len(self.ours.seconds), 1),
            "radixlm check": self.ours_check,
        }
        if self.base is not None:
            programs_same, programs, values_same, values = agreement(self.ours.outputs, self.base.outputs)
            out.update({
                "naive s/program": self.base.median_s / self.num_programs,
                "naive programs/s": self.num_programs / self.base.median_s,
                "speedup": self.base.median_s / self.ours.median_s,
                "naive prompt tokens": self.base.prompt_tokens // max(len(self.base.seconds), 1),
                "identical programs": (programs_same, programs),
                "identical values": (values_same, values),
                "naive check": self.base_check,
            })
        return out


def run_workload(workload: FrontendWorkload, ours: Backend, base: Backend | None, repeats: int,
                 base_repeats: int, warmup: bool = True) -> WorkloadReport:
    ours_run = measure(workload, ours, repeats, warmup)
    base_run = measure(workload, base, base_repeats, warmup) if base is not None else None
    check = workload.check
    return WorkloadReport(
        workload.name, workload.title, len(workload.batch), ours_run, base_run,
        check(ours_run.outputs) if check else "", check(base_run.outputs) if check and base_run else "",
    )


def print_reports(reports: list[WorkloadReport], header: str, results: ResultTables | None = None) -> None:
    rows = table_rows(results, "frontend", f"frontend workloads, {header}")
    print(f"\n## frontend workloads, {header}")
    print("| workload | programs | radixlm s/program | naive s/program | speedup | radixlm programs/s | "
          "cache hit (cached / prompt tokens) | prompt tokens computed, radixlm / naive | identical programs | identical values |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for report in reports:
        r = report.row()
        rows.append({**r, "title": report.title})
        hit = f"{r['cache hit rate']:.1%} ({r['radixlm cached tokens']} / {r['radixlm prompt tokens']})"
        computed = r["radixlm prompt tokens"] - r["radixlm cached tokens"]
        if "speedup" in r:
            (ps, pn), (vs, vn) = r["identical programs"], r["identical values"]
            print(f"| {r['workload']} | {r['programs']} | {r['radixlm s/program']:.3f} | {r['naive s/program']:.3f} | "
                  f"{r['speedup']:.1f}x | {r['radixlm programs/s']:.2f} | {hit} | {computed} / {r['naive prompt tokens']} | "
                  f"{ps}/{pn} | {vs}/{vn} |")
        else:
            print(f"| {r['workload']} | {r['programs']} | {r['radixlm s/program']:.3f} | - | - | "
                  f"{r['radixlm programs/s']:.2f} | {hit} | {computed} / - | - | - |")
    for report in reports:
        print(f"- {report.name}: {report.title}" + (f"; radixlm {report.ours_check}" if report.ours_check else "")
              + (f"; naive {report.base_check}" if report.base_check else ""))


def run_frontend(names: list[str], dtype: str, repeats: int, base_repeats: int, no_baseline: bool,
                 url: str | None = None, results: ResultTables | None = None) -> list[WorkloadReport]:
    """`python -m radixlm.runtime.bench --workloads F1,...`: build both systems, run, print the table."""
    ours: _Tallying
    if url is not None:
        ours = TallyingRuntimeEndpoint(url)
        where = f"radixlm server {url}"
    else:
        from radixlm.runtime.engine import Engine

        ours = TallyingEngineBackend(Engine(dtype=dtype))
        where = "radixlm in-process Engine"
    base = None if no_baseline else NaiveTransformersBackend(dtype=dtype)
    reports = []
    for name in names:
        report = run_workload(FRONTEND_WORKLOADS[name](), ours, base, repeats, base_repeats)
        reports.append(report)
        base_s = f", naive {report.base.median_s:.1f} s" if report.base is not None else ""
        print(f"{name}: radixlm {report.ours.median_s:.1f} s{base_s}", file=sys.stderr, flush=True)
    print_reports(reports, f"dtype {dtype}, {where}, medians of {repeats} (radixlm) / {base_repeats} (naive) runs",
                  results)
    ours.shutdown()
    if base is not None:
        base.shutdown()
    return reports
