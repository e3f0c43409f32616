"""The serving bench's clients and CPU meter against the real server (tiny model): both client
libraries count every streamed token, and the server's processes are told apart by role."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest
from conftest import ServerHandle

from radixlm.runtime.bench import serving


@pytest.mark.parametrize("client", serving.CLIENTS)
def test_replay_counts_every_streamed_token(tiny_server: ServerHandle, client: str) -> None:
    prompts = ["The weather today", "A list of colours:", "Once upon a time", "1, 2, 3,", "Hello"]
    figures = asyncio.run(serving.replay(tiny_server.url, prompts, 12, 3, client))
    assert round(figures["output tok/s"] * figures["wall s"]) == len(prompts) * 12
    assert figures["requests/s"] * figures["wall s"] == pytest.approx(len(prompts))
    assert figures["TTFT p50 s"] > 0 and figures["ITL p50 ms"] > 0


def test_the_cpu_meter_tells_the_server_processes_apart(tiny_server: ServerHandle) -> None:
    groups = serving.server_process_groups(tiny_server.proc.pid, tiny_server.url)
    info = httpx.get(tiny_server.url + "/get_server_info", timeout=60).json()
    assert groups["HTTP front"] == [tiny_server.proc.pid]
    assert groups["scheduler"][0] == info["scheduler_pid"]
    assert len(groups["detokenizer"]) == 1  # the front's other child
    pids = [pid for members in groups.values() for pid in members]
    assert len(pids) == len(set(pids)) and os.getpid() not in pids
    meter = serving.CpuMeter(groups)
    meter.start()
    asyncio.run(serving.replay(tiny_server.url, ["The weather today"] * 4, 8, 4))
    meter.stop()
    assert set(meter.totals) == {"HTTP front", "scheduler", "detokenizer", "clients"}
    assert all(seconds >= 0 for seconds in meter.totals.values())
    assert serving._cpu_seconds(tiny_server.proc.pid) > 0  # the front has run: its /proc entry is read
    assert serving._cpu_seconds(2**22 + 1) == 0.0  # no such process
