"""The thread governor (runtime/model/cpu_threads.py): the cores other processes leave free,
from synthetic CPU samples and from the real /proc beside a real busy process; it sets torch's
thread count; the runner takes it unless --disable-adaptive-threads. No timing is asserted: the
real test waits for the governor to see the neighbour, however long the machine takes."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest
import torch

from radixlm.runtime.bench.neighbour import busy_neighbour
from radixlm.runtime.model import cpu_threads
from radixlm.runtime.model.cpu_threads import CpuSample, ThreadGovernor

HANG_GUARD_S = 120  # a bound on waiting for the sampler, never an assertion on speed


def test_free_cores_leave_out_our_own_time() -> None:
    before = CpuSample(busy=1000, total=4000, ours=500)
    # 2 CPUs, 200 ticks elapsed on each: 400 ticks; 300 busy, 100 of them ours -> others 1 core
    after = CpuSample(busy=1300, total=4400, ours=600)
    assert cpu_threads.free_cores(before, after, 2) == pytest.approx(1.0)
    # all the busy time was ours: both cores are ours to use
    assert cpu_threads.free_cores(before, CpuSample(busy=1300, total=4400, ours=800), 2) == pytest.approx(2.0)
    assert cpu_threads.free_cores(before, before, 2) == 2.0  # no time passed


@pytest.mark.parametrize(("free", "threads"), [(2.0, 2), (1.6, 2), (1.4, 1), (1.0, 1), (0.1, 1), (8.0, 2)])
def test_threads_are_the_free_cores_rounded_at_least_one(free: float, threads: int) -> None:
    assert cpu_threads.threads_for(free, max_threads=2) == threads


def _wait_for(governor: ThreadGovernor, condition: Callable[[int], bool], limit_s: float = 120.0) -> int:
    """Poll the governor until `condition(threads)`; the limit only stops a broken governor."""
    deadline = time.monotonic() + limit_s
    threads = governor.update()
    while not condition(threads) and time.monotonic() < deadline:
        time.sleep(governor.interval)
        threads = governor.update()
    return threads


@pytest.mark.alone  # the suite's other worker would be a neighbour that never goes quiet
def test_a_busy_neighbour_takes_a_thread_and_gives_it_back() -> None:
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("one CPU: there is no thread to give up")
    original = torch.get_num_threads()
    governor = ThreadGovernor(max_threads=cpus, interval=0.2)
    try:
        assert governor.threads == cpus
        with busy_neighbour():
            assert _wait_for(governor, lambda n: n < cpus) == cpus - 1
            assert torch.get_num_threads() == cpus - 1
        assert _wait_for(governor, lambda n: n == cpus) == cpus
        assert torch.get_num_threads() == cpus
        assert governor.num_changes >= 2
    finally:
        governor.close()
        torch.set_num_threads(original)


def test_the_runner_takes_the_governor_unless_disabled(tiny_model_dir: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from radixlm.runtime.engine import Engine

    monkeypatch.setenv("RADIXLM_ADAPTIVE_THREADS", "1")  # the suite turns it off (tests/conftest.py)
    original = torch.get_num_threads()
    try:
        for disable in (False, True):
            with Engine(str(tiny_model_dir), max_total_tokens=512, disable_adaptive_threads=disable) as engine:
                assert (engine.runner.threads is None) == disable
                engine.generate(prompt="hello", sampling_params={"max_new_tokens": 2})
        monkeypatch.setenv("RADIXLM_ADAPTIVE_THREADS", "0")
        with Engine(str(tiny_model_dir), max_total_tokens=512) as engine:
            assert engine.runner.threads is None
    finally:
        torch.set_num_threads(original)


def test_small_forwards_follow_the_window_large_ones_take_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window in which other processes kept a core busy leaves one thread to a small forward
    (decode, a short prompt) and all of them to one of LARGE_FORWARD_TOKENS or more; a quiet
    window gives small forwards every core again."""
    ticks = {"busy": 0, "total": 0}

    def window(others_busy: bool) -> None:  # 2 CPUs, 100 ticks each; others use one core or none
        ticks["total"] += 200
        ticks["busy"] += 100 if others_busy else 0

    applied: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", applied.append)
    governor = ThreadGovernor(max_threads=2, interval=0.0,
                              read=lambda: CpuSample(busy=ticks["busy"], total=ticks["total"], ours=0))
    governor.num_cpus = 2
    seen = []
    for others_busy, tokens in [(True, 1), (True, cpu_threads.LARGE_FORWARD_TOKENS), (True, 40), (False, 1),
                                (True, 2048)]:
        window(others_busy)
        seen.append(governor.update(tokens))
    assert seen == [1, 2, 1, 2, 2]
    assert applied == [1, 2, 1, 2] and governor.num_changes == 4


def test_a_forward_after_an_idle_spell_sees_the_last_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """The background sampler keeps the window fresh while no forward runs: a neighbour that
    started near the end of a long idle spell takes a thread from the first forward after it
    (a window over the whole spell would have averaged it away). Waits on sample counts, never
    on time."""
    ticks = {"busy": 0, "total": 0, "reads": 0, "neighbour": 0}
    read = threading.Condition()

    def fake_sample() -> CpuSample:  # each read: 2 CPUs x 100 ticks; others busy on one core or none
        with read:
            ticks["total"] += 200
            ticks["busy"] += 100 * ticks["neighbour"]
            ticks["reads"] += 1
            read.notify_all()
            return CpuSample(busy=ticks["busy"], total=ticks["total"], ours=0)

    def reads_reach(count: int) -> None:
        """Block until the sampler has read /proc `count` times (read k + 1 starts only after
        sample k's verdict is stored); the timeout only stops a broken sampler."""
        with read:
            assert read.wait_for(lambda: ticks["reads"] >= count, timeout=HANG_GUARD_S)

    applied: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", applied.append)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    governor = ThreadGovernor(max_threads=2, interval=0.01, read=fake_sample)  # never another governor's reads
    try:
        reads_reach(21)  # a quiet idle spell of 20 windows
        assert governor.update() == 2
        with read:
            ticks["neighbour"] = 1
            first_busy = ticks["reads"] + 1
        reads_reach(first_busy + 1)  # the neighbour's first whole window, and its verdict stored
        assert governor.update() == 1 and applied == [1]
    finally:
        governor.close()
    assert governor._sampler is not None and not governor._sampler.is_alive()
    count = governor.num_samples
    assert governor.update() == 1 and governor.num_samples == count  # closed: update reads, never samples
