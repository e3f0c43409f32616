"""The bench's results as data: `python -m radixlm.runtime.bench ... --results PATH.json` writes one
JSON file per run, which `python -m radixlm.runtime.bench.report` renders into the pages
(docs/bench-results.md, README.md's current figures). Each printer of the bench adds the rows it
prints to a `ResultTables` as it prints them (`table_rows`), unrounded; stdout stays as it was.

A result file (FORMAT 1), its tables in the order the bench printed them:

    {"format": 1,
     "source": "python -m radixlm.runtime.bench --results",   (or "transcribed from <where> ...": figures of a run made before --results)
     "command": "python -m radixlm.runtime.bench --workloads W1,W5 ...",   (null: not recorded)
     "env": {"RADIXLM_CPU_ISA": "avx2"},     the RADIXLM_* and OMP_* variables of the run
     "date": "2026-11-27T13:36:48Z",         UTC (a transcription: the day)
     "commit": "0340113c...", "is_dirty": false,   the code (null: not in a git checkout)
     "machine": {"cpu": "AMD EPYC", "cpu_family": 26, "cpu_model": 2, "num_cpus": 2,
                 "isa_level": "avx512", "isa_features": ["avx2", "avx512_bf16", ...]},
     "notes": ["..."],
     "tables": [{"kind": "paired", "title": "...", "meta": {"turns": 3}, "rows": [...]}, ...]}

Rows by kind (a metric is the bench's name without its workload: "W1 decode tok/s" is workload
"W1", metric "decode tok/s"; a ratio is radixlm's over the other system, >1: radixlm is better):
  engine, best, same_precision, paired (COMPARISON_KINDS):
    {"precision": "q4_1", "workload": "W1", "metric": "decode tok/s",
     "systems": {"radixlm": {"value": 285.2}, "llama.cpp": {"value": 160.1, "config": "q4_1 b32 fa-on ub512"}},
     "ratios": {"llama.cpp": 1.79}}
    (`precision` absent in `best`, whose systems carry the config of their best figure; a
    paired ratio is the median of the per-turn ratios, the others the ratio of the two medians)
  neighbour: {"precision", "workload", "metric", "systems": {"radixlm": {"quiet", "loaded", "slowdown"}}}
  serving (meta: concurrency, client, repeats, server):
    {"workload": "W2", "served": {"requests/s": ..., "output tok/s": ..., "wall s", "TTFT p50 s",
     "TTFT p99 s", "ITL p50 ms", "ITL p99 ms"}, "in-process": {"output tok/s": ...}, "served / in-process": 0.93}
  serving_cpu (meta: concurrency, repeats): {"workload", "process", "cpu s/run", "cpu us/output token"}
  frontend: frontend.WorkloadReport.row() and the workload's title
  grammar (meta: grammar.GrammarBenchConfig's fields): grammar_json.row_to_json(BackendRow)
A figure a transcription lacks is null or absent.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

FORMAT = 1
BENCH_COMMAND = "python -m radixlm.runtime.bench"
COMPARISON_KINDS = ("engine", "best", "same_precision", "paired")
KINDS = (*COMPARISON_KINDS, "neighbour", "serving", "serving_cpu", "frontend", "grammar")
ENV_PREFIXES = ("RADIXLM_", "OMP_")


@dataclass
class ResultTable:
    kind: str  # one of KINDS
    title: str  # the heading the bench printed, without its "## "
    meta: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)


class ResultTables:
    """The tables of one bench run, in the order they were first printed."""

    def __init__(self) -> None:
        self.tables: list[ResultTable] = []

    def rows(self, kind: str, title: str, **meta: Any) -> list[dict[str, Any]]:
        """The rows of the table (kind, title, meta), to append to; a table printed in parts (one
        precision at a time) is one table."""
        if kind not in KINDS:
            raise ValueError(f"unknown result table kind {kind!r}")
        for table in self.tables:
            if (table.kind, table.title, table.meta) == (kind, title, meta):
                return table.rows
        self.tables.append(ResultTable(kind, title, meta))
        return self.tables[-1].rows


def table_rows(results: ResultTables | None, kind: str, title: str, **meta: Any) -> list[dict[str, Any]]:
    """`results.rows(...)`, or a list nobody keeps when the run records nothing."""
    return [] if results is None else results.rows(kind, title, **meta)


def split_metric(key: str) -> tuple[str, str]:
    """"W1 decode tok/s" -> ("W1", "decode tok/s")."""
    workload, _, metric = key.partition(" ")
    return workload, metric


def comparison_row(key: str, systems: dict[str, tuple[float | None, str | None]],
                   ratios: dict[str, float | None], precision: str | None = None) -> dict[str, Any]:
    """A row of a COMPARISON_KINDS table: `systems` maps a system to (value, config or None);
    ratios that are None (counts) are left out."""
    workload, metric = split_metric(key)
    row: dict[str, Any] = {} if precision is None else {"precision": precision}
    row.update(workload=workload, metric=metric, systems={
        name: {"value": value} if config is None else {"value": value, "config": config}
        for name, (value, config) in systems.items()})
    row["ratios"] = {name: ratio for name, ratio in ratios.items() if ratio is not None}
    return row


# ---------------------------------------------------------------- the run's header


def machine() -> dict[str, Any]:
    """This machine: its CPU as /proc/cpuinfo names it, logical CPUs, and the ISA level and
    features radixlm's kernels run at (what the bench prints first)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if not sep:
                    break  # the first processor's block ends
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    from radixlm.runtime.model.kernel_policy import cpu_isa

    chosen = cpu_isa()
    return {
        "cpu": info.get("model name") or info.get("Model") or os.uname().machine,
        "cpu_family": int(info["cpu family"]) if info.get("cpu family", "").isdigit() else None,
        "cpu_model": int(info["model"]) if info.get("model", "").isdigit() else None,
        "num_cpus": os.cpu_count(),
        "isa_level": chosen.level if chosen else None,
        "isa_features": sorted(chosen.features) if chosen else [],
    }


def git_commit(where: Path | None = None) -> dict[str, Any]:
    """The commit the code in `where` (default: this file's folder) runs from and whether tracked
    files differ from it (None: no git checkout)."""
    where = where or Path(__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "is_dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "is_dirty": None}


def run_header(argv: list[str], command: str = BENCH_COMMAND) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "source": f"{command} --results",
        "command": " ".join([command, shlex.join(argv)]).strip(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **git_commit(),
        "machine": machine(),
        "notes": [],
    }


# ---------------------------------------------------------------- files


def write_results(path: str | Path, argv: list[str], results: ResultTables) -> None:
    """One run's result file: its header and every table it printed (a table left without rows,
    as the CPU table of a server the bench did not start, is not written)."""
    data = {**run_header(argv), "tables": [asdict(t) for t in results.tables if t.rows]}
    Path(path).write_text(dumps(data))


def _finite(value: Any) -> Any:
    """The value with NaN and infinities as null (JSON has neither), tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def dumps(data: dict[str, Any]) -> str:
    """A result file's text: indented, but each table row on one line (a diff shows a row)."""
    data = _finite(data)
    rows = [json.dumps(row, ensure_ascii=False) for table in data.get("tables", []) for row in table["rows"]]
    placeholders = iter(range(len(rows)))
    shell = {**data, "tables": [{**t, "rows": [f"\0row{next(placeholders)}\0" for _ in t["rows"]]}
                                for t in data.get("tables", [])]}
    text = json.dumps(shell, indent=1, ensure_ascii=False)
    return re.sub(r'"\\u0000row(\d+)\\u0000"', lambda m: rows[int(m.group(1))], text) + "\n"


def load(path: str | Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: result file format {data.get('format')!r}, expected {FORMAT}")
    unknown = [t["kind"] for t in data["tables"] if t["kind"] not in KINDS]
    if unknown:
        raise ValueError(f"{path}: unknown table kinds {unknown}")
    return data
