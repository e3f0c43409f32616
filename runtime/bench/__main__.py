"""`python -m radixlm.runtime.bench`: our engine against the transformers baseline, in one run.

Workloads (prompts from radixlm.runtime.bench.workloads, byte-identical to the peer measurements):
  W1  single stream: TTFT and decode tok/s (128 new tokens, EOS ignored)
  W2  32 distinct prompts x 64 new tokens, submitted together: output tok/s
  W3  32 questions sharing a ~1,000-token prefix x 16 new tokens: wall time
  W4  JSON extraction of 16 passages (4-field schema): s/request and validity, with the schema
      as a constraint (jump-forward on, and off on a second engine) and without (transformers:
      without; it has no grammar support); with it on, also the tokens that jump-forward
      appended without a decode step of their own, per request
  W5  2,000-token prefill: tok/s
  W6  JSON extraction of 16 business documents (8-field schema; every value copies a span of the
      document, a quote a long one: radixlm.runtime.bench.copy_extraction), as W4 with the schema,
      without and with n-gram speculative decoding (--speculative-algorithm NGRAM: its tokens kept
      and tokens per verify step); llama.cpp without and with prompt-lookup decoding
Frontend workloads (@function programs from radixlm.runtime.bench.frontend_workloads, greedy), each run
with run_batch on radixlm and on a naive baseline that sends every gen / select to transformers
as an independent full-prompt call, one at a time (radixlm.runtime.bench.naive); the table gives
s/program, the speedup, radixlm's cache hit rate and how many outputs are identical:
  F1  few-shot multiple choice (HellaSwag-style): 5 solved examples, 16 questions, select of 4
  F2  tree of thought: 4 questions, fork 3 ideas x 24 tokens, join, select the best
  F3  multi-turn chat: 8 conversations x 4 turns x 24 tokens, one shared system prompt
  F4  JSON extraction: W4's 16 passages, gen with W4's json_schema
  (e.g. --workloads F1,F2,F3,F4 --dtypes float32 --repeats 3 --baseline-repeats 1; with --url
  radixlm runs behind that server through RuntimeEndpoint instead of in-process)
With --peers llama.cpp (after `make bench-peers`): the W workloads also run on llama.cpp through
llama-cpp-python, over a sweep of its configurations (--peer-configs; see
radixlm.runtime.bench.llamacpp_peer), and a last table gives, per metric, the best of radixlm,
transformers and llama.cpp with radixlm's ratios.
With --neighbour: every system runs the W workloads quiet, then beside one CPU-bound process (a
Python busy loop); the table gives both figures and each system's slowdown.
With --serving: N concurrent streaming HTTP clients replay W2 and W3 against a server (request
throughput, output tok/s, TTFT and inter-token latency p50/p99); --server-args "--dp-size 2" passes
flags to the server it starts; see radixlm.runtime.bench.serving.
With --grammar: after the other tables, the grammar table of radixlm.runtime.bench.grammar (per
grammar backend: compile times, mask time, W4 on the first of --dtypes with --repeats, and schema
coverage; --grammar-quick for a smoke run; --workloads '' for that table alone).
Each figure is the median of --repeats runs after one warm-up; the table gives our/baseline ratios.
With --results PATH.json: also the run as data, one JSON file (the command, date, commit, machine and
every table's rows; radixlm.runtime.bench.results), which radixlm.runtime.bench.report renders.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from radixlm.runtime.bench import grammar as grammar_bench
from radixlm.runtime.bench import results as bench_results
from radixlm.runtime.bench import workloads as wl
from radixlm.runtime.bench.extraction import (
    MODE_ENGINE_FLAGS,
    OURS_MODES,
    TASKS,
    ExtractionTask,
    run_extraction,
)
from radixlm.runtime.bench.llamacpp_peer import (
    LlamaCppPeer,
    PeerConfig,
    best_of,
    configs_for,
    llamacpp_configs,
    peer_dtype,
    print_peer_summary,
    print_same_precision,
    run_llamacpp,
)
from radixlm.runtime.bench.plot import plot_ratios, speed_ratio
from radixlm.runtime.config.envs import set_process_defaults

set_process_defaults()  # before torch loads, for our engine and the baseline alike
ALL_THREADS = len(os.sched_getaffinity(0))

if TYPE_CHECKING:
    from radixlm.runtime.engine import Engine

Result = dict[str, float]


# Quantized precisions of --dtypes (radixlm only): GGUF block formats, run from the default model's
# GGUF in that format (its own Q4_1 file, or the one llama.cpp's quantizer makes for the peer: the
# same file llama.cpp runs), or w8a8_int8 (the float weights quantized at load). `PREC/DTYPE`
# sets the float dtype of the rest (activations, KV cache; default: --dtype auto's).
QUANTIZED_PRECISIONS = ("q4_1", "q8_0", "q4_0", "w8a8_int8")


def engine_flags_for(precision: str) -> dict[str, Any]:
    """Engine arguments of a --dtypes entry: a dtype, or a quantized precision [/dtype]."""
    name, _, dtype = precision.partition("/")
    if name not in QUANTIZED_PRECISIONS:
        return {"dtype": precision}
    if name == "w8a8_int8":
        return {"quantization": name, "dtype": dtype or "auto"}
    from radixlm.runtime.bench.llamacpp_peer import ensure_gguf

    return {"model_path": str(ensure_gguf(name)), "quantization": "gguf", "dtype": dtype or "auto"}


def is_quantized(precision: str) -> bool:
    return precision.partition("/")[0] in QUANTIZED_PRECISIONS


class Ours:
    name = "radixlm"

    def __init__(self, dtype: str, **engine_flags: Any):
        """`dtype`: a dtype or a quantized precision (QUANTIZED_PRECISIONS); `engine_flags`: more
        Engine arguments (e.g. grammar_backend) for every engine of this system."""
        from radixlm.runtime.engine import Engine

        self.dtype = dtype
        self.engine_flags: dict[str, Any] = {**engine_flags_for(dtype), **engine_flags}
        self.engine = Engine(**self.engine_flags)
        self.encode = self.engine.tokenizer.encode
        self._mode_engines: dict[str, Engine] = {}  # extraction modes with flags of their own (made when needed)

    def generate(self, prompts: list[str] | list[list[int]], new_tokens: int) -> None:
        params = {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}
        key = "input_ids" if isinstance(prompts[0], list) else "prompt"
        self.engine.generate(**{key: prompts}, sampling_params=params)

    def flush(self) -> None:
        self.engine.flush_cache()

    def extract(self, prompt: str, mode: str, task: ExtractionTask) -> str:
        """One JSON extraction of `task` in one of its OURS_MODES."""
        params: dict[str, Any] = {"max_new_tokens": task.max_tokens, "temperature": 0.0}
        if mode != "unconstrained":
            params["json_schema"] = json.dumps(task.schema)
        out = self._engine_for(mode).generate(prompt=prompt, sampling_params=params)
        assert isinstance(out, dict)
        return str(out["text"])

    def forget_outputs(self, mode: str) -> None:
        self._engine_for(mode).scheduler.drafter.flush()

    def _engine_for(self, mode: str) -> Engine:
        if mode not in MODE_ENGINE_FLAGS:
            return self.engine
        if mode not in self._mode_engines:
            from radixlm.runtime.engine import Engine

            self._mode_engines[mode] = Engine(**{**self.engine_flags, **MODE_ENGINE_FLAGS[mode]})
        return self._mode_engines[mode]

    def counters(self, mode: str) -> dict[str, int]:
        """Running counts of `mode`'s engine: draft tokens kept (forced and n-gram: each skipped a
        decode step of its own), n-gram tokens kept, verify steps and the tokens they took."""
        scheduler = self._engine_for(mode).scheduler
        drafter = scheduler.drafter
        return {"draft tokens kept": scheduler.num_jump_forward_tokens, "n-gram tokens kept": drafter.num_correct_drafts,
                "verify steps": drafter.num_verify, "verified tokens": drafter.num_verified_tokens}

    def close_extra_engines(self) -> None:
        for engine in self._mode_engines.values():
            engine.shutdown()
        self._mode_engines.clear()

    def shutdown(self) -> None:
        self.close_extra_engines()
        self.engine.shutdown()


class Transformers:
    name = "transformers"

    def __init__(self, dtype: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from radixlm.runtime.model.model_files import float_checkpoint_dir, resolve_model_path

        path = resolve_model_path(None)
        self.torch = torch
        torch_dtype = torch.float32 if dtype in ("auto", "float32") else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(float_checkpoint_dir(path), dtype=torch_dtype).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        self.encode = self.tokenizer.encode

    def generate(self, prompts: list[str] | list[list[int]], new_tokens: int) -> None:
        if isinstance(prompts[0], list):
            batch = {"input_ids": self.torch.tensor(prompts)}
        else:
            batch = self.tokenizer(prompts, return_tensors="pt", padding=True)
        with self.torch.inference_mode():
            self.model.generate(
                **batch, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id or 0,
            )

    def flush(self) -> None:
        pass

    def forget_outputs(self, mode: str) -> None:
        pass  # nothing drafts from earlier outputs

    def extract(self, prompt: str, mode: str, task: ExtractionTask) -> str:
        """An extraction without constraints (transformers has no grammar support of its own)."""
        batch = self.tokenizer([prompt], return_tensors="pt")
        with self.torch.inference_mode():
            out = self.model.generate(**batch, max_new_tokens=task.max_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id or 0)
        return str(self.tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True))


Sampler = tuple[bool, Callable[[], Result]]  # (whether a warm-up run precedes, one measurement)


def samplers(system: Ours | Transformers | LlamaCppPeer, workloads: list[str]) -> dict[str, Sampler]:
    """Per W workload but the extractions (whose modes need engines of their own: run_extraction), what one
    measurement of `system` takes. The slow batch workloads skip the warm-up run for the
    baseline (one transformers W3 run takes minutes; its first run is not slower)."""
    heavy_warmup = not isinstance(system, Transformers)

    def timed(fn: Callable[[], Any]) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def w1() -> Result:
        prompt = [wl.W1_PROMPT]
        ttft = timed(lambda: (system.flush(), system.generate(prompt, 1)))
        total = timed(lambda: (system.flush(), system.generate(prompt, wl.W1_NEW_TOKENS)))
        return {"W1 TTFT s": ttft, "W1 decode tok/s": (wl.W1_NEW_TOKENS - 1) / (total - ttft)}

    def w2() -> Result:
        prompts = wl.w2_prompts()
        return {"W2 output tok/s": len(prompts) * wl.W2_NEW_TOKENS / timed(
            lambda: (system.flush(), system.generate(prompts, wl.W2_NEW_TOKENS)))}

    def w3() -> Result:
        prompts = wl.w3_workload()[1]
        return {"W3 wall s": timed(lambda: (system.flush(), system.generate(prompts, wl.W3_NEW_TOKENS)))}

    def w5() -> Result:
        ids = system.encode(wl.w5_text())[: wl.W5_TOKENS]
        return {"W5 prefill tok/s": wl.W5_TOKENS / timed(lambda: (system.flush(), system.generate([ids], 1)))}

    every = {"W1": (True, w1), "W2": (heavy_warmup, w2), "W3": (heavy_warmup, w3), "W5": (True, w5)}
    return {w: every[w] for w in workloads if w in every}


def _medians(samples: list[Result]) -> Result:
    return {metric: statistics.median(s[metric] for s in samples) for metric in samples[0]}


def run_system(system: Ours | Transformers | LlamaCppPeer, workloads: list[str], repeats: int) -> Result:
    """Median figures of one system, each workload's --repeats measurements after its warm-up."""
    import torch

    # torch's thread count is per process, and our engine's thread governor may have lowered it
    # (beside a busy neighbour): every system starts from all the cores (ours re-adjusts)
    torch.set_num_threads(ALL_THREADS)
    out: Result = {}
    chosen = samplers(system, workloads)
    for workload in workloads:
        if workload in chosen:
            warmup, sample = chosen[workload]
            if warmup:
                sample()
            out.update(_medians([sample() for _ in range(repeats)]))
        elif workload in TASKS:
            modes = OURS_MODES[workload] if isinstance(system, Ours) else system.extraction_modes if isinstance(
                system, LlamaCppPeer) else ("unconstrained",)
            counters = system.counters if isinstance(system, Ours) else None
            for mode in modes:
                out.update(run_extraction(system, TASKS[workload], mode, counters))
            if isinstance(system, Ours):
                system.close_extra_engines()
    return out


Turns = dict[str, list[Result]]  # workload -> one system's measurements, turn by turn


def run_paired(ours: Ours, peer: Ours | LlamaCppPeer, workloads: list[str], repeats: int) -> tuple[Turns, Turns]:
    """Both systems take turns, one measurement each, --repeats turns per workload (after one
    warm-up each), so that a drift of the machine's speed falls on both alike. Returns each one's
    measurements (paired_figures makes the table's figures of them)."""
    import torch

    ours_turns: Turns = {}
    peer_turns: Turns = {}
    ours_samplers, peer_samplers = samplers(ours, workloads), samplers(peer, workloads)
    for workload in [w for w in workloads if w in ours_samplers and w in peer_samplers]:
        for chosen in (ours_samplers, peer_samplers):
            torch.set_num_threads(ALL_THREADS)
            chosen[workload][1]()
        for _ in range(repeats):
            for chosen, into in ((ours_samplers, ours_turns), (peer_samplers, peer_turns)):
                torch.set_num_threads(ALL_THREADS)
                into.setdefault(workload, []).append(chosen[workload][1]())
    return ours_turns, peer_turns


def paired_figures(ours: Turns, peer: Turns) -> tuple[Result, Result, Result]:
    """Each system's medians and, per metric, the median of the per-turn ratios (>1: radixlm is
    better; speed_ratio's direction)."""
    mine: Result = {}
    theirs: Result = {}
    ratios: Result = {}
    for workload, turns in ours.items():
        mine.update(_medians(turns))
        theirs.update(_medians(peer[workload]))
        for metric in turns[0]:
            ratios[metric] = statistics.median(
                speed_ratio(metric, a[metric], b[metric]) or 0.0 for a, b in zip(turns, peer[workload], strict=True))
    return mine, theirs, ratios


def run_paired_table(precisions: list[str], workloads: list[str], configs: list[PeerConfig], repeats: int,
                     results: bench_results.ResultTables | None = None) -> None:
    """--paired: per precision, radixlm against each llama.cpp configuration of its GGUF type, in turns."""
    rows = bench_results.table_rows(results, "paired", "paired: radixlm and llama.cpp in turns", turns=repeats)
    print("\n## paired: radixlm and llama.cpp in turns, one measurement each (medians; ratio: median of the "
          "per-turn ratios, >1: radixlm is better)")
    print("| precision | metric | radixlm | llama.cpp | configuration | ratio |")
    print("|---|---|---|---|---|---|")
    for precision in precisions:
        matching = [c for c in configs if c.dtype == peer_dtype(precision)]
        if not matching:
            print(f"| {precision} | - | - | - | no llama.cpp configuration of this type | - |", flush=True)
            continue
        ours = Ours(precision)
        try:
            for config in matching:
                todo = [w for w in workloads if config in configs_for(w, matching)]
                if not todo:
                    continue
                peer = LlamaCppPeer(config)
                try:
                    mine, theirs, ratios = paired_figures(*run_paired(ours, peer, todo, repeats))
                finally:
                    peer.close()
                for metric, ratio in ratios.items():
                    print(f"| {precision} | {metric} | {mine[metric]:.3g} | {theirs[metric]:.3g} | {config.label()} "
                          f"| {ratio:.2f}x |", flush=True)
                    rows.append(bench_results.comparison_row(metric, {"radixlm": (mine[metric], None), "llama.cpp": (
                        theirs[metric], config.label())}, {"llama.cpp": ratio}, precision))
        finally:
            ours.shutdown()


def _print_table(dtype: str, ours: Result, base: Result | None, results: bench_results.ResultTables | None = None) -> None:
    rows = bench_results.table_rows(results, "engine", "radixlm and transformers per precision")
    print(f"\n## dtype {dtype}")
    print("| metric | radixlm | transformers | ratio |")
    print("|---|---|---|---|")
    for key, value in ours.items():
        if base is None or key not in base:
            print(f"| {key} | {value:.2f} | - | - |")
            rows.append(bench_results.comparison_row(key, {"radixlm": (value, None)}, {}, dtype))
            continue
        ratio = speed_ratio(key, value, base[key])
        rows.append(bench_results.comparison_row(key, {"radixlm": (value, None), "transformers": (base[key], None)},
                                   {"transformers": ratio}, dtype))
        shown = "-" if ratio is None else f"{ratio:.2f}x"  # counts: no ratio
        print(f"| {key} | {value:.2f} | {base[key]:.2f} | {shown} |")


def _int_list(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixlm.runtime.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="W1,W5", help="comma-separated subset of W1-W6 and F1-F4")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes to run; radixlm also "
                        "runs quantized precisions (q4_1, q8_0, q4_0: the default model's GGUF in that format, the "
                        "file llama.cpp runs; w8a8_int8), optionally /DTYPE for the rest (e.g. q4_1/float32)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline-repeats", type=int, default=None, help="repeats for transformers (default: --repeats)")
    parser.add_argument("--no-baseline", action="store_true", help="skip transformers")
    parser.add_argument("--serving", action="store_true",
                        help="serving mode: concurrent HTTP clients replay W2/W3 against a server")
    parser.add_argument("--url", default=None, help="serving mode: an already running server (default: start "
                        "one); F workloads: run radixlm through this server instead of in-process")
    parser.add_argument("--concurrency", type=_int_list, default=[32],
                        help="serving mode: concurrent clients, or a comma-separated sweep (1,8,32)")
    parser.add_argument("--client", default="aiohttp", choices=("aiohttp", "httpx"),
                        help="serving mode: the clients' HTTP library (aiohttp, as SGLang's bench_serving; httpx "
                        "costs more CPU per streamed event, on the same cores as the server)")
    parser.add_argument("--server-args", default="", help="serving mode: flags for the server it starts, as one "
                        "string (e.g. \"--dp-size 2\")")
    parser.add_argument("--neighbour", action="store_true", help="run every system quiet, then beside one "
                        "CPU-bound process, and print both and each system's slowdown")
    parser.add_argument("--grammar", action="store_true", help="after the other tables, the grammar table "
                        "(radixlm.runtime.bench.grammar; its flags below as --grammar-*)")
    grammar_bench.add_cli_args(parser.add_argument_group("grammar table"), prefix="grammar-")
    parser.add_argument("--peers", default="", help="comma-separated peers beside transformers: llama.cpp "
                        "(needs `make bench-peers`)")
    parser.add_argument("--peer-configs", default="full", help="llama.cpp configurations: full (dtype bf16/q8_0/q4_1 "
                        "x batch 16/32 x flash attention on/off x n_ubatch 512/2048), quick (bf16, q8_0, q4_1 at "
                        "32:on:512) or DTYPE:BATCH:FA:UBATCH,... with * for all (dtypes also f32, f16)")
    parser.add_argument("--paired", action="store_true", help="with --peers llama.cpp: per precision both run, "
                        "radixlm and each llama.cpp configuration of that GGUF type take turns, one measurement "
                        "each (W1, W2, W3, W5), so a drift of the machine's speed falls on both; the table gives "
                        "both medians and the median of the per-turn ratios")
    parser.add_argument("--results", default=None, metavar="PATH.json", help="also write the run as data: "
                        "the command, date, commit, machine and every table's rows (radixlm.runtime.bench.results; "
                        "rendered by radixlm.runtime.bench.report)")
    parser.add_argument("--plot", default=None, metavar="OUT.png", help="also draw the table's ratios against "
                        "transformers per workload (serving mode: throughput and latency against concurrency) "
                        "into this file (needs matplotlib: the `plot` extra)")
    args = parser.parse_args(argv)
    if args.results and not os.path.isdir(os.path.dirname(os.path.abspath(args.results))):
        parser.error(f"--results {args.results}: no such directory")  # now, not after the run
    results = bench_results.ResultTables()

    def finish() -> int:
        if args.results:
            bench_results.write_results(args.results, list(sys.argv[1:] if argv is None else argv), results)
            print(f"\nresults: {args.results}")
        return 0

    try:
        grammar_config = grammar_bench.config_from_args(args, prefix="grammar-", repeats=args.repeats,
                                                        dtype=args.dtypes.split(",")[0])
    except ValueError as e:
        parser.error(str(e))
    if args.serving:
        from radixlm.runtime.bench.serving import run_serving

        if args.server_args and args.url is not None:
            parser.error("--server-args applies to the server the bench starts; it cannot change --url's")
        run_serving(args.url, args.concurrency, shlex.split(args.server_args), args.repeats, plot=args.plot,
                    client=args.client, results=results)
        return finish()
    import torch

    from radixlm.runtime.model.kernel_policy import cpu_isa

    torch.set_num_threads(2)
    chosen = cpu_isa()
    print(f"radixlm's C++ CPU kernels: ISA level {chosen.level if chosen else 'none (torch ops)'}"
          + (f" ({', '.join(sorted(chosen.features))})" if chosen and chosen.features else "")
          + " (RADIXLM_CPU_ISA caps it)")
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in ("W1", "W2", "W3", "W4", "W5", "W6", "F1", "F2", "F3", "F4")]
    if unknown:
        parser.error(f"unknown workloads: {', '.join(unknown)}")
    engine_workloads = [w for w in workloads if w.startswith("W")]
    frontend_workloads = [w for w in workloads if w.startswith("F")]
    base_repeats = args.baseline_repeats or args.repeats
    try:
        peer_configs = llamacpp_configs(args.peers, args.peer_configs)
    except ValueError as e:
        parser.error(str(e))
    if args.paired:
        if not peer_configs:
            parser.error("--paired needs --peers llama.cpp")
        run_paired_table(args.dtypes.split(","), [w for w in engine_workloads if w not in TASKS], peer_configs,
                         args.repeats, results)
        return finish()
    ours_by_dtype: dict[str, Result] = {}
    base_by_dtype: dict[str, Result] = {}
    for dtype in args.dtypes.split(","):
        if engine_workloads and args.neighbour:
            from radixlm.runtime.bench.neighbour import print_neighbour_table, quiet_and_loaded

            systems = {"radixlm": quiet_and_loaded(partial(run_system, Ours(dtype), engine_workloads, args.repeats))}
            if not args.no_baseline and not is_quantized(dtype):
                systems["transformers"] = quiet_and_loaded(
                    partial(run_system, Transformers(dtype), engine_workloads, base_repeats))
            print_neighbour_table(dtype, systems, results)
        elif engine_workloads:
            system = Ours(dtype)
            try:
                ours = ours_by_dtype[dtype] = run_system(system, engine_workloads, args.repeats)
            finally:
                system.shutdown()
            base = None if args.no_baseline or is_quantized(dtype) else run_system(
                Transformers(dtype), engine_workloads, base_repeats)
            if base is not None:
                base_by_dtype[dtype] = base
            _print_table(dtype, ours, base, results)
        if frontend_workloads:
            from radixlm.runtime.bench.frontend import run_frontend

            run_frontend(frontend_workloads, dtype, args.repeats, base_repeats, args.no_baseline, args.url,
                         results)
    peer_best: dict[str, Result] = {}
    if peer_configs and engine_workloads:
        peer = run_llamacpp(engine_workloads, peer_configs, args.repeats, run_system)
        print_peer_summary(ours_by_dtype, base_by_dtype, peer, results)
        print_same_precision(ours_by_dtype, peer, results)
        best = best_of({config.label(): result for config, result in peer.items()})
        peer_best["llama.cpp"] = {metric: value for metric, (value, _) in best.items()}
    if args.grammar:
        grammar_bench.print_table(grammar_config, results=results)
    if args.plot:
        plot_ratios(args.plot, ours_by_dtype, base_by_dtype, peer_best)
        print(f"\nfigure: {args.plot}")
    return finish()


if __name__ == "__main__":
    raise SystemExit(main())
