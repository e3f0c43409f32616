"""`python -m radixlm.runtime.bench --neighbour`: each system runs its workloads on a quiet machine,
then again while one CPU-bound process (a Python busy loop, started SETTLE_S before) runs beside it; the table gives both
figures and each system's slowdown (how many times slower it became under the neighbour), so
radixlm's slowdown compares with transformers' in the same run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

from radixlm.runtime.bench.results import ResultTables, split_metric, table_rows
from radixlm.runtime.ipc.parent_death import set_parent_death_signal

Result = dict[str, float]


BUSY_LOOP = "print('busy', flush=True)\nwhile True: pass"


# How long the neighbour runs before the block starts: a neighbour of the kind measured here is
# long-lived, and our thread governor reads the machine every CHECK_INTERVAL_S (0.25 s), so the
# first forwards of a block that began with the neighbour measured its reaction time (two TTFT
# runs of four at two threads: 0.24 and 0.12 s against 0.11 after), not the slowdown beside it.
SETTLE_S = 1.0


@contextmanager
def busy_neighbour(settle_s: float = 0.0) -> Iterator[subprocess.Popen[bytes]]:
    """One CPU-bound process (`while True: pass`) for the duration of the block, which starts
    once the process is in its loop and has run `settle_s` seconds."""
    proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdout=subprocess.PIPE,
                            # killed with its parent: a bench or test killed mid-block leaves no loop spinning
                            preexec_fn=partial(set_parent_death_signal, signal.SIGKILL))
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"busy\n"
        time.sleep(settle_s)
        yield proc
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def quiet_and_loaded(run: Callable[[], Result]) -> tuple[Result, Result]:
    """`run()`'s figures on the quiet machine, then beside a busy neighbour."""
    quiet = run()
    with busy_neighbour(SETTLE_S):
        loaded = run()
    return quiet, loaded


def slowdown(key: str, quiet: float, loaded: float) -> float | None:
    """How many times slower under the neighbour (rates: quiet / loaded; times: loaded / quiet);
    None for counts and zeros."""
    if min(quiet, loaded) <= 0:
        return None
    if key.endswith(" s") or key.endswith("s/request"):
        return loaded / quiet
    if key.endswith("tok/s"):
        return quiet / loaded
    return None


def print_neighbour_table(dtype: str, systems: dict[str, tuple[Result, Result]],
                          results: ResultTables | None = None) -> None:
    rows = table_rows(results, "neighbour", "quiet vs beside one busy process")
    print(f"\n## dtype {dtype}: quiet vs beside one busy process")
    names = list(systems)
    print("| metric | " + " | ".join(f"{n} quiet | {n} loaded | {n} slowdown" for n in names) + " |")
    print("|---|" + "---|---|---|" * len(names))
    for key in systems[names[0]][0]:
        cells = []
        figures: dict[str, dict[str, float | None]] = {}
        for name in names:
            quiet, loaded = systems[name]
            if key not in quiet or key not in loaded:
                cells.append("- | - | -")
                continue
            factor = slowdown(key, quiet[key], loaded[key])
            cells.append(f"{quiet[key]:.2f} | {loaded[key]:.2f} | " + ("-" if factor is None else f"{factor:.2f}x"))
            figures[name] = {"quiet": quiet[key], "loaded": loaded[key], "slowdown": factor}
        print(f"| {key} | " + " | ".join(cells) + " |")
        workload, metric = split_metric(key)
        rows.append({"precision": dtype, "workload": workload, "metric": metric, "systems": figures})
