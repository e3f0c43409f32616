"""Requests that arrive together reach the scheduler together.

Why: a burst of requests (32 clients starting at once, a batch or `n` copies in one body, a
frontend program's `run_batch`) reaches the HTTP front within milliseconds, but each is validated
and tokenized on its own. Sent one by one, the first found the scheduler idle, which started a
forward on it alone (W2: 135 tokens, 92 ms on the default model) while the other 31 queued; the
prompts' shared prefix was then computed again in the next forward's rows (W2 served: forwards of
1, 17 and 15 requests, 3,950 prompt tokens, where the in-process engine, handed all 32 at once,
runs 4, 19 and 10 requests and 3,751 tokens).

So the tokenizer manager submits generate requests through this gate. A request whose
preparation finished while others' is still under way is held until none is; then every held
request goes to its scheduler rank in one message (`send(rank, requests)`). A lone request goes
in the next turn of the event loop (the turn lets copies and batch items ready in the same turn
join it). Nothing waits longer than `hold_s`: a request held that long goes, and a finished
preparation whose request has not been submitted counts for `hold_s` at most (its request may
never come: a client gone before its response started).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from radixlm.runtime.ipc import messages as io

HOLD_S = 0.01


class ArrivalGate:
    def __init__(self, send: Callable[[int, list[io.TokenizedGenerateReq]], None], hold_s: float = HOLD_S):
        self._send = send
        self.hold_s = hold_s
        self._preparing = 0  # preparations under way
        self._prepared: deque[float] = deque()  # per prepared, unsubmitted request: until when it counts
        self._held: list[tuple[int, io.TokenizedGenerateReq]] = []
        self._held_since = 0.0
        self._wake: asyncio.TimerHandle | asyncio.Handle | None = None

    @contextmanager
    def preparing(self, num_requests: int) -> Iterator[None]:
        """Around the preparation of `num_requests` requests (their submits follow if it succeeds)."""
        self._preparing += 1
        succeeded = False
        try:
            yield
            succeeded = True
        finally:
            self._preparing -= 1
            if succeeded:
                self._prepared.extend(itertools.repeat(self._now() + self.hold_s, num_requests))
            self._review()

    def submit(self, rank: int, req: io.TokenizedGenerateReq) -> None:
        """Send `req` to scheduler rank `rank`, now or with the requests arriving with it."""
        if self._prepared:
            self._prepared.popleft()
        if not self._held:
            self._held_since = self._now()
        self._held.append((rank, req))
        self._review()

    def flush(self) -> None:
        """Send every held request now (each rank's in one message, in the order submitted)."""
        self._cancel_wake()
        held, self._held = self._held, []
        by_rank: dict[int, list[io.TokenizedGenerateReq]] = {}
        for rank, req in held:
            by_rank.setdefault(rank, []).append(req)
        for rank, reqs in by_rank.items():
            self._send(rank, reqs)

    def _review(self) -> None:
        """Flush, or wake up when something expires."""
        if not self._held:
            return
        now = self._now()
        while self._prepared and self._prepared[0] <= now:
            self._prepared.popleft()
        self._cancel_wake()
        loop = asyncio.get_running_loop()
        if now >= self._held_since + self.hold_s:
            self.flush()
        elif self._preparing == 0 and not self._prepared:
            self._wake = loop.call_soon(self.flush)
        else:
            until = self._held_since + self.hold_s
            if self._prepared:
                until = min(until, self._prepared[0])
            self._wake = loop.call_at(until, self._review)

    def _cancel_wake(self) -> None:
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()
