"""`python -m radixlm.runtime.bench.moe_serve`: a big mixture-of-experts GGUF served as users serve
it, against llama.cpp on the same file (issue 35 point 4's demonstration).

The model: moe_model's random-weight Q4_K GGUF of `--shape` (default `qwen3-30b-a3b`: Qwen3-30B-A3B's
48 layers of 128 experts, top-8, vocab 151,936; ~17 GB, written once into the cache).

radixlm runs as `radixlm serve --model-path FILE` (no other flag: dtype, quantization and KV pool
as it picks them) in a child process; requests go over HTTP (`/generate` with token ids, greedy,
EOS ignored). llama.cpp (llama-cpp-python, `make bench-peers`) then loads the same file in this
process. A machine of 24 GiB holds one ~17 GB model at a time, not both, so the two run one
after the other (blocks, not the main bench's turns): the machine's drift between the blocks
falls on the ratio. Per system: load time (process start to ready), peak resident memory (the
server's process tree summed; llama.cpp: this process, its mapped file pages included) and the
workloads of the MoE bench (runtime/bench/moe.py): M1 (one request) and M2 (32 at once), decode
tok/s, medians of --repeats after one warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radixlm.runtime.bench import results as bench_results
from radixlm.runtime.bench.memory import tree_rss_bytes
from radixlm.runtime.bench.moe import NUM_CONCURRENT, add_run_arguments, parse_run_arguments, samplers
from radixlm.runtime.bench.moe_model import SHAPES, ensure_moe_gguf
from radixlm.runtime.bench.serving import free_port

READY_TIMEOUT_S = 3600.0  # a 17 GB load reads and repacks every block once


class PeakMemory:
    """Samples `measure()` (bytes) every `period` seconds in a thread; `peak` is the largest seen."""

    def __init__(self, measure: Callable[[], int], period: float = 0.5):
        self.measure, self.period, self.peak = measure, period, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.measure())
            self._stop.wait(self.period)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.measure())
        return self.peak


def process_rss_bytes() -> int:
    return next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmRSS:"))


class Served:
    """`radixlm serve --model-path FILE` in a child process, driven over HTTP."""

    name = "radixlm"

    def __init__(self, path: Path):
        import httpx

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        start = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "radixlm.runtime.server.serve",
                                      "--model-path", str(path), "--host", "127.0.0.1", "--port", str(port)])
        self.memory = PeakMemory(lambda: tree_rss_bytes(self.proc.pid))
        self.client = httpx.Client(timeout=None)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"radixlm serve exited with {self.proc.returncode} while loading")
            try:
                if self.client.get(self.url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.perf_counter() - start > READY_TIMEOUT_S:
                self.close()
                raise RuntimeError("radixlm serve was not ready in time")
            time.sleep(1)
        self.load_s = time.perf_counter() - start
        info = self.client.get(self.url + "/get_server_info").json()
        self.kv_tokens = info.get("max_total_num_tokens")

    def generate(self, prompts: list[list[int]], new_tokens: int) -> None:
        self.client.post(self.url + "/flush_cache").raise_for_status()
        body = {"input_ids": prompts,
                "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}}
        self.client.post(self.url + "/generate", json=body).raise_for_status()

    def close(self) -> None:
        self.peak_bytes = self.memory.stop()
        self.proc.terminate()
        self.proc.wait(timeout=120)
        self.client.close()


class Peer:
    """llama.cpp on the same file, in this process (it maps the file)."""

    name = "llama.cpp"

    def __init__(self, path: Path):
        from radixlm.runtime.bench.llamacpp_peer import LlamaCppPeer, PeerConfig

        base = process_rss_bytes()
        self.memory = PeakMemory(lambda: process_rss_bytes() - base)
        start = time.perf_counter()
        self.peer = LlamaCppPeer(PeerConfig("q4_k_m", NUM_CONCURRENT, True, 512), model_path=path)
        self.load_s = time.perf_counter() - start
        self.kv_tokens = None

    def generate(self, prompts: list[list[int]], new_tokens: int) -> None:
        self.peer.generate(prompts, new_tokens)

    def close(self) -> None:
        self.peer.close()
        self.peak_bytes = self.memory.stop()


def run_block(make: Callable[[], Any], workloads: list[str], repeats: int, vocab_size: int,
              new_tokens: int) -> dict[str, Any]:
    """One system's block: load, one warm-up then `repeats` measurements per workload, close."""
    system = make()
    chosen = samplers(vocab_size, new_tokens)
    figures: dict[str, list[float]] = {}
    try:
        for workload in workloads:
            chosen[workload](system)
            for _ in range(repeats):
                for metric, value in chosen[workload](system).items():
                    figures.setdefault(metric, []).append(value)
    finally:
        system.close()
    print(f"{system.name}: loaded in {system.load_s:.0f} s, peak resident {system.peak_bytes / 2**30:.1f} GiB, "
          + ", ".join(f"{m} {statistics.median(v):.3g}" for m, v in figures.items()), flush=True)
    return {"name": system.name, "load_s": system.load_s, "peak_bytes": system.peak_bytes,
            "kv_tokens": system.kv_tokens, "figures": figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixlm.runtime.bench.moe_serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    add_run_arguments(parser)
    args, workloads = parse_run_arguments(parser, argv)
    shape = SHAPES[args.shape]
    path = ensure_moe_gguf(shape, args.seed)
    print(f"model: {path} ({shape.num_parameters / 1e9:.1f} B parameters, {path.stat().st_size / 2**30:.1f} GiB)",
          flush=True)
    blocks = [run_block(lambda: Served(path), workloads, args.repeats, shape.vocab_size, args.new_tokens)]
    if not args.no_peer:
        blocks.append(run_block(lambda: Peer(path), workloads, args.repeats, shape.vocab_size, args.new_tokens))
    results = bench_results.ResultTables()
    rows = results.rows("paired", f"moe serve ({args.shape}): radixlm serve, then llama.cpp, in blocks",
                        turns=args.repeats)
    print(f"\n## moe serve ({args.shape}): radixlm serve, then llama.cpp on the same file (medians of "
          f"{args.repeats}; ratio of the medians, >1: radixlm is faster)")
    print("| metric | radixlm | llama.cpp | ratio |")
    print("|---|---|---|---|")
    ours = blocks[0]
    theirs = blocks[1] if len(blocks) > 1 else None
    # metric -> (ours, theirs, ratio >1 when ours is better, or None where it is not a speed)
    table: dict[str, tuple[float, float | None, float | None]] = {}
    for metric, values in ours["figures"].items():
        value = statistics.median(values)
        peer = statistics.median(theirs["figures"][metric]) if theirs else None
        table[metric] = (value, peer, value / peer if peer else None)
    load_peer = theirs["load_s"] if theirs else None
    table["load s"] = (ours["load_s"], load_peer, load_peer / ours["load_s"] if load_peer else None)
    table["load peak resident GiB"] = (ours["peak_bytes"] / 2**30, theirs and theirs["peak_bytes"] / 2**30, None)
    for metric, (value, peer, ratio) in table.items():
        print(f"| {metric} | {value:.3g} | {'-' if peer is None else f'{peer:.3g}'} | "
              f"{'-' if ratio is None else f'{ratio:.2f}x'} |", flush=True)
        systems: dict[str, tuple[float | None, str | None]] = {"radixlm": (value, None)}
        if peer is not None:
            systems["llama.cpp"] = (peer, "q4_k_m b32 fa-on ub512")
        key = metric if metric.startswith("M") else f"serve {metric}"
        rows.append(bench_results.comparison_row(key, systems, {"llama.cpp": ratio}, "q4_k_m"))
    if args.results:
        data = {**bench_results.run_header(list(sys.argv[1:] if argv is None else argv),
                                           "python -m radixlm.runtime.bench.moe_serve"),
                "tables": [{"kind": t.kind, "title": t.title, "meta": t.meta, "rows": t.rows} for t in results.tables]}
        data["notes"].append(f"radixlm KV pool: {ours['kv_tokens']} tokens (as `radixlm serve` picks it)")
        Path(args.results).write_text(bench_results.dumps(data))
        print(f"\nresults: {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
