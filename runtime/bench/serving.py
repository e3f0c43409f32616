"""Serving benchmark: N concurrent HTTP clients replay W2 / W3 against a radixlm server.

Each client streams its requests from /generate (SSE), parses every event and records the time to
first token and the gaps between later tokens. Reports request throughput, output tokens/s, TTFT
and inter-token latency p50 / p99. Starts its own server (`radixlm serve` on a free port) unless
--url is given; then it also reports the CPU time each process used during the served runs (the
server's HTTP front, scheduler and detokenizer, and this process's clients), since on a small
machine they all share the cores the forwards run on.

The clients are aiohttp's (as SGLang's `bench_serving`; `client="httpx"` for the lighter-featured,
heavier one: ~140 us of client CPU per event against aiohttp's less, which on 2 cores is taken
from the server).
`--concurrency 1,8,32` sweeps the client counts (a table each); with `--plot out.png`, a figure of
throughput and latency against concurrency.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx

from radixlm.runtime.bench import workloads as wl
from radixlm.runtime.bench.results import ResultTables, table_rows

CLIENTS = ("aiohttp", "httpx")


@dataclass
class RequestTiming:
    ttft: float = 0.0
    gaps: list[float] = field(default_factory=list)
    output_tokens: int = 0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def _generate_body(prompt: str, new_tokens: int) -> dict[str, Any]:
    return {"text": prompt, "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}}


class _Timer:
    """A request's timing from the completion_tokens of each event it receives."""

    def __init__(self) -> None:
        self.timing = RequestTiming()
        self.start = self.last = time.perf_counter()
        self.seen = 0

    def on_event(self, data: bytes | str) -> None:
        count = json.loads(data)["meta_info"]["completion_tokens"]
        if count > self.seen:
            now = time.perf_counter()
            if self.seen == 0:
                self.timing.ttft = now - self.start
            else:
                self.timing.gaps.append((now - self.last) / (count - self.seen))
            self.seen, self.last = count, now

    def done(self) -> RequestTiming:
        self.timing.output_tokens = self.seen
        return self.timing


async def _one_httpx(client: httpx.AsyncClient, url: str, prompt: str, new_tokens: int) -> RequestTiming:
    timer = _Timer()
    async with client.stream("POST", url + "/generate", json=_generate_body(prompt, new_tokens)) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                timer.on_event(line[6:])
    return timer.done()


async def _one_aiohttp(session: aiohttp.ClientSession, url: str, prompt: str, new_tokens: int) -> RequestTiming:
    timer = _Timer()
    async with session.post(url + "/generate", json=_generate_body(prompt, new_tokens)) as resp:
        resp.raise_for_status()
        async for line in resp.content:  # one SSE line at a time, b"\n" included
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                timer.on_event(line[6:])
    return timer.done()


async def replay(url: str, prompts: list[str], new_tokens: int, concurrency: int,
                 client: str = "aiohttp") -> dict[str, float]:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    timings: list[RequestTiming] = []

    async def client_loop(one: Any, session: Any) -> None:
        while not queue.empty():
            timings.append(await one(session, url, queue.get_nowait(), new_tokens))

    start = time.perf_counter()
    if client == "httpx":
        async with httpx.AsyncClient(timeout=600) as session:
            await asyncio.gather(*(client_loop(_one_httpx, session) for _ in range(concurrency)))
    else:
        timeout = aiohttp.ClientTimeout(total=600)
        # read_bufsize: an SSE line (cumulative text, logprobs) may exceed aiohttp's 64 KiB default
        async with aiohttp.ClientSession(timeout=timeout, read_bufsize=2**22,
                                         connector=aiohttp.TCPConnector(limit=0)) as session:
            await asyncio.gather(*(client_loop(_one_aiohttp, session) for _ in range(concurrency)))
    wall = time.perf_counter() - start
    gaps = [g for t in timings for g in t.gaps]
    ttfts = [t.ttft for t in timings]
    return {
        "requests/s": len(timings) / wall,
        "output tok/s": sum(t.output_tokens for t in timings) / wall,
        "wall s": wall,
        "TTFT p50 s": statistics.median(ttfts),
        "TTFT p99 s": percentile(ttfts, 99),
        "ITL p50 ms": percentile(gaps, 50) * 1e3,
        "ITL p99 ms": percentile(gaps, 99) * 1e3,
    }


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(extra: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "radixlm.runtime.server.serve", "--port", str(port), *extra])
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not start")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    """pid and every process below it (from /proc's parent links)."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent_of[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parent_of.items() if parent in frontier]
        found.extend(frontier)
    return found


def _is_spawned_child(pid: int) -> bool:
    """A multiprocessing child started with spawn (not its resource tracker, which idles)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"multiprocessing.spawn" in f.read()
    except OSError:
        return False


def server_process_groups(front_pid: int, url: str) -> dict[str, list[int]]:
    """The server's processes by role: the HTTP front (the process `radixlm serve` started), the
    scheduler(s) with what they started (tensor-parallel ranks, grammar builders), and the front's
    other spawned children with theirs (the detokenizer)."""
    info = httpx.get(url + "/get_server_info", timeout=60).json()
    schedulers = [state["scheduler_pid"] for state in info.get("internal_states") or [info]]
    scheduler_tree = [p for pid in schedulers for p in _descendants(pid)]
    others = [p for child in _descendants(front_pid)
              if child != front_pid and child not in scheduler_tree and _is_spawned_child(child)
              for p in _descendants(child)]
    return {"HTTP front": [front_pid], "scheduler": scheduler_tree, "detokenizer": others}


class CpuMeter:
    """CPU seconds each group of processes used between `start()` and `stop()`, summed over runs;
    "clients" is this process (the bench's clients; the in-process Engine idles meanwhile)."""

    def __init__(self, groups: dict[str, list[int]]):
        self.groups = {**groups, "clients": [os.getpid()]}
        self.totals = dict.fromkeys(self.groups, 0.0)
        self._at_start: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        return {name: sum(_cpu_seconds(pid) for pid in pids) for name, pids in self.groups.items()}

    def start(self) -> None:
        self._at_start = self._now()

    def stop(self) -> None:
        for name, value in self._now().items():
            self.totals[name] += value - self._at_start[name]


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run whose output tok/s is the median."""
    return sorted(runs, key=lambda r: r["output tok/s"])[len(runs) // 2]


def in_process_once(engine: Any, prompts: list[str], new_tokens: int) -> float:
    """The prompts submitted together to the in-process Engine: output tok/s."""
    params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    engine.flush_cache()
    start = time.perf_counter()
    engine.generate(prompt=prompts, sampling_params=params)
    return len(prompts) * new_tokens / (time.perf_counter() - start)


def run_serving(url: str | None, concurrency: int | Sequence[int], server_args: list[str], repeats: int = 1,
                plot: str | None = None, client: str = "aiohttp",
                results: ResultTables | None = None) -> dict[int, dict[str, dict[str, float]]]:
    """Each workload replayed `repeats` times at each concurrency (the median run by output tok/s
    is shown). With a server of its own (no `url`), the same workloads also run on an in-process
    Engine with the server's defaults, interleaved with the served runs (a repeat: the served
    levels and one in-process run, their order alternating between repeats; the idle server only
    polls its socket meanwhile), so that each served / in-process ratio compares runs made under
    the same load of the shared machine; the last column is the median of those ratios. `plot`:
    also draw throughput and latency against concurrency into that file. `client`: one of CLIENTS.
    With its own server it also prints each process's CPU seconds per served run and output token.
    Returns concurrency -> workload -> figures."""
    levels = [concurrency] if isinstance(concurrency, int) else list(concurrency)
    server = "its own server" if url is None else url
    proc = engine = None
    if url is None:
        proc, url = start_server(server_args)
    workloads = {
        "W2": (wl.w2_prompts(), wl.W2_NEW_TOKENS),
        "W3": (wl.w3_workload()[1], wl.W3_NEW_TOKENS),
    }
    served: dict[int, dict[str, dict[str, float]]] = {level: {} for level in levels}
    local: dict[str, dict[str, float]] = {}
    ratios: dict[int, dict[str, float]] = {level: {} for level in levels}
    meters: dict[tuple[int, str], CpuMeter] = {}
    try:
        if proc is not None:
            from radixlm.runtime.engine import Engine

            groups = server_process_groups(proc.pid, url)

            dtype = server_args[server_args.index("--dtype") + 1] if "--dtype" in server_args else "auto"
            engine = Engine(dtype=dtype)
        for name, (prompts, new_tokens) in workloads.items():
            httpx.post(url + "/flush_cache", timeout=60)
            asyncio.run(replay(url, prompts[:4], new_tokens, min(4, max(levels)), client))  # warm-up
            if engine is not None:
                in_process_once(engine, prompts[:4], new_tokens)  # warm-up
            runs: dict[int, list[dict[str, float]]] = {level: [] for level in levels}
            local_tps: list[float] = []
            for i in range(repeats):
                if engine is not None and i % 2 == 1:
                    local_tps.append(in_process_once(engine, prompts, new_tokens))
                for level in levels:
                    httpx.post(url + "/flush_cache", timeout=60)
                    meter = meters.get((level, name))
                    if meter is None and proc is not None:
                        meter = meters[(level, name)] = CpuMeter(groups)
                    if meter is not None:
                        meter.start()
                    runs[level].append(asyncio.run(replay(url, prompts, new_tokens, level, client)))
                    if meter is not None:
                        meter.stop()
                if engine is not None and i % 2 == 0:
                    local_tps.append(in_process_once(engine, prompts, new_tokens))
            for level in levels:
                served[level][name] = _median_run(runs[level])
                if local_tps:
                    ratios[level][name] = _median([r["output tok/s"] / t for r, t in zip(runs[level], local_tps)])
            if local_tps:
                local[name] = {"output tok/s": _median(local_tps)}
    finally:
        if engine is not None:
            engine.shutdown()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    for level in levels:
        _print_serving_table(level, url, repeats, served[level], local, ratios[level], client, table_rows(
            results, "serving", f"serving, {level} concurrent streaming clients", concurrency=level, client=client,
            repeats=repeats, server=server))
        _print_cpu_table(level, repeats, {name: meters[(level, name)] for name in workloads if (level, name) in meters},
                         {name: len(prompts) * new_tokens for name, (prompts, new_tokens) in workloads.items()},
                         table_rows(results, "serving_cpu", f"CPU per served run at {level} clients",
                                    concurrency=level, repeats=repeats))
    if plot is not None:
        from radixlm.runtime.bench.plot import plot_serving

        plot_serving(plot, served)
        print(f"\nfigure: {plot}")
    return served


def _print_serving_table(concurrency: int, url: str, repeats: int, served: dict[str, dict[str, float]],
                         local: dict[str, dict[str, float]], ratios: dict[str, float], client: str,
                         rows: list[dict[str, Any]]) -> None:
    """The table, and its rows into `rows` (results.py's serving rows)."""
    print(f"\n## serving, {concurrency} concurrent streaming clients ({client}), {url}, median of {repeats}")
    print("| workload | requests/s | output tok/s | wall s | TTFT p50 s | TTFT p99 s | ITL p50 ms | ITL p99 ms "
          "| in-process output tok/s | serving / in-process (median of paired runs) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in served.items():
        ours = local.get(name)
        extra = f"{ours['output tok/s']:.1f} | {ratios[name]:.2f}" if ours else "- | -"
        print(f"| {name} | {r['requests/s']:.2f} | {r['output tok/s']:.1f} | {r['wall s']:.2f} | "
              f"{r['TTFT p50 s']:.2f} | {r['TTFT p99 s']:.2f} | {r['ITL p50 ms']:.0f} | {r['ITL p99 ms']:.0f} | {extra} |")
        rows.append({"workload": name, "served": dict(r), **({"in-process": dict(ours), "served / in-process": ratios[name]}
                                                             if ours else {})})


def _print_cpu_table(concurrency: int, repeats: int, meters: dict[str, CpuMeter], num_tokens: dict[str, int],
                     rows: list[dict[str, Any]]) -> None:
    """The table, and its rows into `rows` (results.py's serving_cpu rows)."""
    if not meters:
        return
    names = list(next(iter(meters.values())).totals)
    print(f"\nCPU per served run at {concurrency} clients (mean of {repeats}): seconds, and us per output token")
    print("| workload | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for workload, meter in meters.items():
        cells = [f"{meter.totals[n] / repeats:.2f} s ({meter.totals[n] / repeats / num_tokens[workload] * 1e6:.0f} us)"
                 for n in names]
        print(f"| {workload} | " + " | ".join(cells) + " |")
        rows += [{"workload": workload, "process": n, "cpu s/run": meter.totals[n] / repeats,
                  "cpu us/output token": meter.totals[n] / repeats / num_tokens[workload] * 1e6} for n in names]
