"""How many threads a CPU forward uses: the cores other processes leave free.

Why: a forward is ~150 OpenMP parallel regions, each ending at a barrier. With one CPU-bound
neighbour on a 2-core machine, two threads of ours plus the neighbour share two cores, and every
region waits for whichever of our threads the OS has just descheduled: single-stream decode ran
3.85x slower beside a busy loop (transformers: 2.99x). One thread then has a core to itself and
never waits at a barrier. So before a forward, at most every `interval` seconds, the governor reads
the machine's CPU time (/proc/stat) and this process's (/proc/self/stat), and sets torch's thread
count to the cores left once other processes' use over the last interval is taken off, rounded,
at least 1. The machine is sampled by a daemon thread every interval, not only before forwards:
a forward after an idle spell must see the last interval, not an average over the spell (a busy
neighbour that started a moment ago would vanish in it, and the first forwards beside it ran two
threads: W1's time to first token took 2.90x longer beside a neighbour instead of ~1.8x). Our own
threads never count against us; the server's other processes (HTTP, tokenizer, detokenizer) do,
as they compete for the same cores. Large forwards (prefills) take every core whatever the
window says (LARGE_FORWARD_TOKENS).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

CHECK_INTERVAL_S = 0.25
# A forward this large (a prefill) runs long parallel regions, where two threads beside a
# neighbour each get ~2/3 of a core (1.33 cores against one thread's 1); the barrier waits that
# make one thread better are those of small forwards' ~150 short regions. A served burst of
# requests also made the window before the prefill that follows it look busy (2,048 tokens took
# 1.43 s on one thread against 0.78 on two).
LARGE_FORWARD_TOKENS = 256


@dataclass(frozen=True)
class CpuSample:
    busy: int  # ticks all CPUs spent busy
    total: int  # ticks all CPUs spent busy or idle
    ours: int  # ticks this process (all its threads) spent on a CPU


def read_sample() -> CpuSample | None:
    """The machine's and this process's CPU ticks now; None where /proc cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq + steal
    return CpuSample(busy=busy, total=busy + idle + iowait, ours=int(own[11]) + int(own[12]))


def free_cores(before: CpuSample, after: CpuSample, num_cpus: int) -> float:
    """Cores not used by other processes between the two samples."""
    elapsed = after.total - before.total
    if elapsed <= 0:
        return float(num_cpus)
    others = max(0, (after.busy - before.busy) - (after.ours - before.ours))
    return num_cpus - others * num_cpus / elapsed


def threads_for(free: float, max_threads: int) -> int:
    return max(1, min(max_threads, round(free)))


class ThreadGovernor:
    """Sets torch's intra-op thread count (our C++ kernels' too) to the cores others leave free."""

    def __init__(self, max_threads: int | None = None, interval: float = CHECK_INTERVAL_S,
                 sample_in_background: bool = True, read: Callable[[], CpuSample | None] = read_sample):
        """`sample_in_background` (with interval > 0): a daemon thread samples every `interval`
        (stopped by `close`); else `update` samples when `interval` has passed since the last.
        `read`: where samples come from (tests give their own; each governor reads only its own)."""
        self._read = read
        self.num_cpus = len(os.sched_getaffinity(0))
        self.max_threads = max_threads or torch.get_num_threads()
        self.interval = interval
        self.threads = self.max_threads  # the count torch has now
        self.wanted = self.max_threads  # the count for small forwards, from the last window
        self._last = read()
        self._last_time = time.monotonic()
        self.num_changes = 0
        self.num_samples = 0
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        if sample_in_background and interval > 0:
            self._sampler = threading.Thread(target=self._sample_every_interval, name="radixlm-thread-governor",
                                             daemon=True)
            self._sampler.start()

    def _sample(self) -> None:
        sample = self._read()
        if sample is not None and self._last is not None:
            self.wanted = threads_for(free_cores(self._last, sample, self.num_cpus), self.max_threads)
        self._last, self._last_time = sample, time.monotonic()
        self.num_samples += 1

    def _sample_every_interval(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def close(self) -> None:
        """Stop the background sampling (idempotent)."""
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=5)

    def update(self, num_tokens: int = 1) -> int:
        """The thread count for the next forward of `num_tokens` new tokens (a read of the last
        window's verdict; without the background thread, a sample when `interval` has passed).
        A forward of LARGE_FORWARD_TOKENS or more takes every thread."""
        if self._sampler is None and time.monotonic() - self._last_time >= self.interval:
            self._sample()
        threads = self.max_threads if num_tokens >= LARGE_FORWARD_TOKENS else self.wanted
        if threads != self.threads:
            torch.set_num_threads(threads)
            self.threads = threads
            self.num_changes += 1
        return self.threads
