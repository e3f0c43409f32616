"""`python -m radixlm.runtime.bench --neighbour`: the busy neighbour runs for exactly the block it
wraps, slowdowns read the right way for rates and times, and a real run (the default model, W5)
prints each system's quiet and loaded figures and its slowdown. No timing is asserted."""

from __future__ import annotations

import os

import pytest

from radixlm.runtime.bench import neighbour
from radixlm.runtime.bench.__main__ import main


def test_the_neighbour_runs_during_the_block_only() -> None:
    with neighbour.busy_neighbour() as proc:
        assert proc.poll() is None
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert b"while True: pass" in f.read()
    assert proc.poll() is not None


def test_slowdown_reads_rates_and_times_the_right_way() -> None:
    assert neighbour.slowdown("W2 output tok/s", 400.0, 200.0) == 2.0
    assert neighbour.slowdown("W3 wall s", 2.0, 3.0) == 1.5
    assert neighbour.slowdown("W4 schema s/request", 1.0, 1.25) == 1.25
    assert neighbour.slowdown("W4 schema valid", 15.0, 16.0) is None  # a count
    assert neighbour.slowdown("W2 output tok/s", 0.0, 1.0) is None


def test_quiet_then_loaded() -> None:
    alive_during: list[bool] = []

    def run() -> dict[str, float]:
        alive_during.append(_neighbour_alive())
        return {"W1 decode tok/s": 1.0}

    quiet, loaded = neighbour.quiet_and_loaded(run)
    assert alive_during == [False, True] and quiet == loaded == {"W1 decode tok/s": 1.0}


def _neighbour_alive() -> bool:
    """Whether a `while True: pass` child of this process is running."""

    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if b"while True: pass" in cmd and int(fields[1]) == os.getpid() and fields[0] != "Z":
            return True
    return False


def test_bench_prints_quiet_loaded_and_slowdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workloads", "W5", "--dtypes", "float32", "--repeats", "1", "--no-baseline", "--neighbour"]) == 0
    out = capsys.readouterr().out
    assert "## dtype float32: quiet vs beside one busy process" in out
    assert "| metric | radixlm quiet | radixlm loaded | radixlm slowdown |" in out
    rows = [line for line in out.splitlines() if line.startswith("| W5 prefill tok/s |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    quiet, loaded, factor = float(cells[1]), float(cells[2]), cells[3]
    assert quiet > 0 and loaded > 0 and factor.endswith("x")
    assert abs(float(factor[:-1]) - quiet / loaded) < 0.02  # the cells are rounded to 2 decimals
