"""`python -m radixlm.runtime.bench.moe`: mixture-of-experts decode speed, radixlm against llama.cpp
on the same GGUF, in one run (issue 35 point 4).

The model: runtime/bench/moe_model.py's Qwen3-MoE-shaped random Q4_K_M-style GGUF (2.2 B
parameters, 32 experts of width 768, top-8, hidden 2048), written from --seed into the cache once.
Workloads (fixed token-id prompts from a seeded generator, greedy, EOS ignored, the same for both):
  M1  one request: a 32-token prompt, then --new-tokens tokens: decode tok/s =
      (new tokens - 1) / (the time of the whole request - the time of a 1-token request)
  M2  32 concurrent requests, 32-token prompts each: total decode tok/s = 32 x (new tokens - 1)
      / (the time of the whole batch - the time of the batch with 1 new token)
The systems take turns, one measurement each, --repeats turns per workload after one warm-up
each (as the main bench's --paired), so a drift of the machine's speed falls on all alike. llama.cpp
runs in two configurations where its extra weight buffers work here (its blocks repacked for its
kernels, and not), and each workload is compared with the faster; the table gives the medians and
the median of the per-turn ratios (>1: radixlm is faster).
With --results PATH.json: the run as data (radixlm.runtime.bench.results; a "paired" table).
llama.cpp needs `make bench-peers` (llama-cpp-python); --no-peer runs radixlm alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from radixlm.runtime.bench import results as bench_results
from radixlm.runtime.bench.moe_model import MoeShape, ensure_moe_gguf
from radixlm.runtime.config.envs import set_process_defaults

set_process_defaults()  # before torch loads

PROMPT_LEN = 32
NUM_CONCURRENT = 32
WORKLOADS = ("M1", "M2")
Result = dict[str, float]


class System(Protocol):
    name: str

    def generate(self, prompts: list[list[int]], new_tokens: int) -> Any: ...


def prompts(vocab_size: int, count: int, seed: int = 0) -> list[list[int]]:
    """`count` fixed prompts of PROMPT_LEN token ids, clear of the specials and byte tokens."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(300, vocab_size) for _ in range(PROMPT_LEN)] for _ in range(count)]


class Ours:
    name = "radixlm"

    def __init__(self, path: Path):
        from radixlm.runtime.engine import Engine

        self.engine = Engine(model_path=str(path), quantization="gguf", dtype="auto")

    def generate(self, prompts: list[list[int]], new_tokens: int) -> None:
        self.engine.flush_cache()
        self.engine.generate(input_ids=prompts,
                             sampling_params={"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True})

    def close(self) -> None:
        self.engine.shutdown()


def decode_rate(system: System, batch: list[list[int]], new_tokens: int) -> float:
    """Decode tok/s of `batch`: its new tokens past the first over the time they added."""
    start = time.perf_counter()
    system.generate(batch, 1)
    first = time.perf_counter() - start
    start = time.perf_counter()
    system.generate(batch, new_tokens)
    total = time.perf_counter() - start
    return len(batch) * (new_tokens - 1) / max(total - first, 1e-9)


def samplers(vocab_size: int, new_tokens: int) -> dict[str, Callable[[System], Result]]:
    one, many = prompts(vocab_size, 1, seed=1), prompts(vocab_size, NUM_CONCURRENT, seed=2)
    return {
        "M1": lambda s: {"M1 decode tok/s": decode_rate(s, one, new_tokens)},
        "M2": lambda s: {f"M2 decode tok/s x{NUM_CONCURRENT}": decode_rate(s, many, new_tokens)},
    }


def run_paired(systems: list[System], workloads: list[str], repeats: int, vocab_size: int,
               new_tokens: int) -> dict[str, dict[str, list[float]]]:
    """metric -> system name -> its measurements, turn by turn (after one warm-up each)."""
    import torch

    chosen = samplers(vocab_size, new_tokens)
    out: dict[str, dict[str, list[float]]] = {}
    threads = len(os.sched_getaffinity(0))
    for workload in workloads:
        for system in systems:
            torch.set_num_threads(threads)
            chosen[workload](system)
        for _ in range(repeats):
            for system in systems:
                torch.set_num_threads(threads)
                for metric, value in chosen[workload](system).items():
                    out.setdefault(metric, {}).setdefault(system.name, []).append(value)
    return out


def llama_cpp_systems(path: Path, configs: dict[str, str]) -> list[Any]:
    """llama.cpp on `path` with its extra weight buffers (blocks repacked for its kernels) and, where
    those run here, also without them: the faster of the two at each workload is the peer (on some
    CPUs the repacked blocks are slower at 32 rows). Fills `configs`: system name -> configuration."""
    from radixlm.runtime.bench.llamacpp_peer import LlamaCppPeer, PeerConfig, extra_buffer_types_work

    config = PeerConfig("q4_k_m", NUM_CONCURRENT, True, 512)
    systems = []
    for extra in (True, False) if extra_buffer_types_work() else (False,):
        peer = LlamaCppPeer(config, extra_bufts=extra, model_path=path)
        peer.name = f"llama.cpp{'' if extra else ' plain'}"
        configs[peer.name] = f"{config.label()}{', repacked' if extra else ''}"
        systems.append(peer)
    return systems


def print_table(figures: dict[str, dict[str, list[float]]], precision: str, configs: dict[str, str],
                results: bench_results.ResultTables, notes: list[str]) -> None:
    """Each metric's radixlm median against the llama.cpp configuration with the best median."""
    rows = bench_results.table_rows(results, "paired", "moe: radixlm and llama.cpp in turns",
                                    turns=len(next(iter(next(iter(figures.values())).values()))))
    print("\n## moe: radixlm and llama.cpp in turns, one measurement each (medians; ratio: median of the per-turn "
          "ratios, >1: radixlm is faster; llama.cpp: its faster configuration)")
    for note in notes:
        print(f"- {note}")
    print("| precision | metric | radixlm | llama.cpp | llama.cpp configuration | ratio |")
    print("|---|---|---|---|---|---|")
    for metric, by_system in figures.items():
        ours = by_system["radixlm"]
        name = max(configs, key=lambda n: statistics.median(by_system[n]), default=None)
        theirs = by_system[name] if name else None
        ratio = statistics.median(a / b for a, b in zip(ours, theirs, strict=True)) if theirs else None
        peer = statistics.median(theirs) if theirs else None
        others = ", ".join(f"{configs[n]}: {statistics.median(by_system[n]):.3g}" for n in configs if n != name)
        print(f"| {precision} | {metric} | {statistics.median(ours):.3g} | "
              f"{'-' if peer is None else f'{peer:.3g}'} | {configs.get(name, '-')}{f' (else {others})' if others else ''} | "
              f"{'-' if ratio is None else f'{ratio:.2f}x'} |", flush=True)
        systems: dict[str, tuple[float | None, str | None]] = {"radixlm": (statistics.median(ours), None)}
        if name is not None:
            systems["llama.cpp"] = (peer, configs[name])
        rows.append(bench_results.comparison_row(metric, systems, {"llama.cpp": ratio}, precision))


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a MoE bench run (this one's and moe_serve's): workloads, turns, tokens, the
    model's seed, the peer, the results file."""
    parser.add_argument("--workloads", default="M1,M2", help="comma-separated subset of M1, M2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--seed", type=int, default=0, help="the random model's seed")
    parser.add_argument("--no-peer", action="store_true", help="radixlm alone (no llama.cpp)")
    parser.add_argument("--results", default=None, metavar="PATH.json", help="also write the run as data")


def parse_run_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """(the options, the workloads asked for), bad values refused as parser errors."""
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    if unknown := [w for w in workloads if w not in WORKLOADS]:
        parser.error(f"unknown workloads: {', '.join(unknown)}")
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2")
    return args, workloads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixlm.runtime.bench.moe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser)
    parser.add_argument("--layers", type=int, default=MoeShape().num_layers, help="the model's decoder layers")
    parser.add_argument("--experts", type=int, default=MoeShape().num_experts, help="the model's experts per layer")
    args, workloads = parse_run_arguments(parser, argv)
    shape = MoeShape(num_layers=args.layers, num_experts=args.experts)
    path = ensure_moe_gguf(shape, args.seed)
    print(f"model: {path} ({shape.num_parameters / 1e9:.2f} B parameters, {path.stat().st_size / 2**30:.2f} GiB)",
          flush=True)
    systems: list[Any] = [Ours(path)]
    configs: dict[str, str] = {}  # a llama.cpp system's name -> its configuration
    notes: list[str] = []
    if not args.no_peer:
        systems += llama_cpp_systems(path, configs)
        from radixlm.runtime.bench.llamacpp_peer import peer_build_note

        notes.append(peer_build_note())
    results = bench_results.ResultTables()
    try:
        figures = run_paired(systems, workloads, args.repeats, shape.vocab_size, args.new_tokens)
    finally:
        for system in systems:
            system.close()
    print_table(figures, "q4_k_m", configs, results, notes)
    if args.results:
        data = {**bench_results.run_header(list(sys.argv[1:] if argv is None else argv),
                                           "python -m radixlm.runtime.bench.moe"),
                "tables": [{"kind": t.kind, "title": t.title, "meta": t.meta, "rows": t.rows} for t in results.tables]}
        data["notes"] = [*data["notes"], *notes]
        Path(args.results).write_text(bench_results.dumps(data))
        print(f"\nresults: {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
