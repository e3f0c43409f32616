"""Serving benchmark: N concurrent HTTP clients replay W2 / W3 against a radixlm server.

Each client streams its requests from /generate (SSE) and records the time to first token and
the gaps between later tokens. Reports request throughput, output tokens/s, TTFT and inter-token
latency p50 / p99. Starts its own server (`radixlm serve` on a free port) unless --url is given.
`--concurrency 1,8,32` sweeps the client counts (a table each); with `--plot out.png`, a figure of
throughput and latency against concurrency.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from radixlm.runtime.bench import workloads as wl


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


async def _one(client: httpx.AsyncClient, url: str, prompt: str, new_tokens: int) -> RequestTiming:
    body = {"text": prompt, "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}}
    timing = RequestTiming()
    start = last = time.perf_counter()
    seen = 0
    async with client.stream("POST", url + "/generate", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            count = json.loads(line[6:])["meta_info"]["completion_tokens"]
            if count > seen:
                now = time.perf_counter()
                if seen == 0:
                    timing.ttft = now - start
                else:
                    timing.gaps.append((now - last) / (count - seen))
                seen, last = count, now
    timing.output_tokens = seen
    return timing


async def replay(url: str, prompts: list[str], new_tokens: int, concurrency: int) -> dict[str, float]:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    timings: list[RequestTiming] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            timings.append(await _one(client, url, queue.get_nowait(), new_tokens))

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(extra: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
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
                plot: str | None = None) -> dict[int, dict[str, dict[str, float]]]:
    """Each workload replayed `repeats` times at each concurrency (the median run by output tok/s
    is shown). With a server of its own (no `url`), the same workloads also run on an in-process
    Engine with the server's defaults, interleaved with the served runs (a repeat: the served
    levels and one in-process run, their order alternating between repeats; the idle server only
    polls its socket meanwhile), so that each served / in-process ratio compares runs made under
    the same load of the shared machine; the last column is the median of those ratios. `plot`:
    also draw throughput and latency against concurrency into that file.
    Returns concurrency -> workload -> figures."""
    levels = [concurrency] if isinstance(concurrency, int) else list(concurrency)
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
    try:
        if proc is not None:
            from radixlm.runtime.engine import Engine

            dtype = server_args[server_args.index("--dtype") + 1] if "--dtype" in server_args else "auto"
            engine = Engine(dtype=dtype)
        for name, (prompts, new_tokens) in workloads.items():
            httpx.post(url + "/flush_cache", timeout=60)
            asyncio.run(replay(url, prompts[:4], new_tokens, min(4, max(levels))))  # warm-up
            if engine is not None:
                in_process_once(engine, prompts[:4], new_tokens)  # warm-up
            runs: dict[int, list[dict[str, float]]] = {level: [] for level in levels}
            local_tps: list[float] = []
            for i in range(repeats):
                if engine is not None and i % 2 == 1:
                    local_tps.append(in_process_once(engine, prompts, new_tokens))
                for level in levels:
                    httpx.post(url + "/flush_cache", timeout=60)
                    runs[level].append(asyncio.run(replay(url, prompts, new_tokens, level)))
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
        _print_serving_table(level, url, repeats, served[level], local, ratios[level])
    if plot is not None:
        from radixlm.runtime.bench.plot import plot_serving

        plot_serving(plot, served)
        print(f"\nfigure: {plot}")
    return served


def _print_serving_table(concurrency: int, url: str, repeats: int, served: dict[str, dict[str, float]],
                         local: dict[str, dict[str, float]], ratios: dict[str, float]) -> None:
    print(f"\n## serving, {concurrency} concurrent streaming clients, {url}, median of {repeats}")
    print("| workload | requests/s | output tok/s | wall s | TTFT p50 s | TTFT p99 s | ITL p50 ms | ITL p99 ms "
          "| in-process output tok/s | serving / in-process (median of paired runs) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in served.items():
        ours = local.get(name)
        extra = f"{ours['output tok/s']:.1f} | {ratios[name]:.2f}" if ours else "- | -"
        print(f"| {name} | {r['requests/s']:.2f} | {r['output tok/s']:.1f} | {r['wall s']:.2f} | "
              f"{r['TTFT p50 s']:.2f} | {r['TTFT p99 s']:.2f} | {r['ITL p50 ms']:.0f} | {r['ITL p99 ms']:.0f} | {extra} |")
