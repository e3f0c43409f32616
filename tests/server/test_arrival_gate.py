"""Requests prepared together reach the scheduler together (`server.arrival_gate`): the gate on a
real event loop, and through the real server a batch's prompts prefilled in one forward."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from conftest import ServerHandle

from radixlm.runtime.ipc import messages as io
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.server.arrival_gate import ArrivalGate

HANG_GUARD_S = 60  # only turns a hang into a failure; no test waits on time


def req(rid: str) -> io.TokenizedGenerateReq:
    return io.TokenizedGenerateReq(rid, (1, 2, 3), SamplingParams(max_new_tokens=1))


class Recorder:
    """The gate's `send`: what went to which rank, in order, and an event per message."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, list[str]]] = []
        self.event = asyncio.Event()

    def __call__(self, rank: int, reqs: list[io.TokenizedGenerateReq]) -> None:
        self.sent.append((rank, [r.rid for r in reqs]))
        self.event.set()

    async def next_message(self) -> None:
        await asyncio.wait_for(self.event.wait(), HANG_GUARD_S)
        self.event.clear()


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_lone_request_goes_in_the_next_turn() -> None:
    async def main() -> None:
        sent = Recorder()
        gate = ArrivalGate(sent, hold_s=HANG_GUARD_S)
        with gate.preparing(1):
            pass
        gate.submit(0, req("a"))
        assert sent.sent == []  # copies ready in this turn may still join
        await turns(1)
        assert sent.sent == [(0, ["a"])]

    asyncio.run(main())


def test_overlapping_preparations_leave_together() -> None:
    async def main() -> None:
        sent = Recorder()
        gate = ArrivalGate(sent, hold_s=HANG_GUARD_S)  # no timer may decide this test
        second = gate.preparing(1)
        with gate.preparing(1):
            second.__enter__()
        gate.submit(0, req("first"))
        await turns()
        assert sent.sent == []  # the other preparation is under way
        second.__exit__(None, None, None)
        await turns()
        assert sent.sent == []  # prepared, not yet submitted
        gate.submit(0, req("second"))
        await sent.next_message()
        assert sent.sent == [(0, ["first", "second"])]

    asyncio.run(main())


def test_a_batch_goes_as_one_message_per_rank() -> None:
    async def main() -> None:
        sent = Recorder()
        gate = ArrivalGate(sent, hold_s=HANG_GUARD_S)
        with gate.preparing(4):
            pass
        for i, rank in enumerate([0, 1, 0, 1]):
            gate.submit(rank, req(f"r{i}"))
        await sent.next_message()
        assert sent.sent == [(0, ["r0", "r2"]), (1, ["r1", "r3"])]

    asyncio.run(main())


def test_a_failed_preparation_releases_the_held() -> None:
    async def main() -> None:
        sent = Recorder()
        gate = ArrivalGate(sent, hold_s=HANG_GUARD_S)
        failing = gate.preparing(3)
        failing.__enter__()
        gate.submit(0, req("ok"))
        await turns()
        assert sent.sent == []
        failing.__exit__(ValueError, ValueError("a 400"), None)  # its requests will never come
        await sent.next_message()
        assert sent.sent == [(0, ["ok"])]

    asyncio.run(main())


def test_nothing_waits_longer_than_the_hold() -> None:
    async def main() -> None:
        sent = Recorder()
        gate = ArrivalGate(sent, hold_s=0.05)
        stuck = gate.preparing(1)
        stuck.__enter__()  # a preparation that never ends
        gate.submit(0, req("held"))
        await sent.next_message()
        assert sent.sent == [(0, ["held"])]
        with gate.preparing(2):  # two prepared; one request never comes (its client left)
            pass
        gate.submit(0, req("next"))
        await sent.next_message()
        assert sent.sent[-1] == (0, ["next"])

    asyncio.run(main())


def test_flush_sends_the_held_at_once() -> None:
    async def main() -> None:
        sent = Recorder()
        gate = ArrivalGate(sent, hold_s=HANG_GUARD_S)
        busy = gate.preparing(1)
        busy.__enter__()
        gate.submit(2, req("x"))
        gate.flush()  # an abort of x must follow x, not overtake it
        assert sent.sent == [(2, ["x"])]
        busy.__exit__(None, None, None)
        await turns()
        assert sent.sent == [(2, ["x"])]  # nothing is held twice

    asyncio.run(main())


def num_forwards(server: ServerHandle) -> int:
    return int(httpx.get(server.url + "/cache_tree", timeout=30).json()["steps"]["num_forwards"])


def test_a_batch_is_prefilled_in_one_forward(tiny_server: ServerHandle) -> None:
    """Eight distinct prompts in one /generate body reach the scheduler as one message, so they
    are prefilled in one forward (one token each: that forward finishes them all)."""
    prompts = [f"{word} number {i} is here" for i, word in enumerate(
        ["Apples", "Rivers", "Mountains", "Clocks", "Violins", "Lanterns", "Deserts", "Harbors"])]
    body: dict[str, Any] = {"text": prompts, "sampling_params": {"temperature": 0, "max_new_tokens": 1}}
    assert httpx.post(tiny_server.url + "/flush_cache", timeout=60).status_code == 200
    before = num_forwards(tiny_server)
    resp = httpx.post(tiny_server.url + "/generate", json=body, timeout=120)
    assert resp.status_code == 200 and len(resp.json()) == 8
    assert num_forwards(tiny_server) == before + 1
