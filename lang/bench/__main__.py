"""`python -m radixlm.bench`: our engine against the transformers baseline, in one run.

Workloads (prompts from radixlm.bench.workloads, byte-identical to the peer measurements):
  W1  single stream: TTFT and decode tok/s (128 new tokens, EOS ignored)
  W2  32 distinct prompts x 64 new tokens, submitted together: output tok/s
  W3  32 questions sharing a ~1,000-token prefix x 16 new tokens: wall time
  W4  JSON extraction of 16 passages (4-field schema): s/request and validity, with the schema
      as a constraint and without (transformers: without; it has no grammar support)
  W5  2,000-token prefill: tok/s
With --serving: N concurrent streaming HTTP clients replay W2 and W3 against a server (request
throughput, output tok/s, TTFT and inter-token latency p50/p99); see radixlm.bench.serving.
Each figure is the median of --repeats runs after one warm-up; the table gives our/baseline ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from radixlm.bench import workloads as wl

Result = dict[str, float]


def _median_time(fn: Callable[[], Any], repeats: int, warmup: bool = True) -> float:
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Ours:
    name = "radixlm"

    def __init__(self, dtype: str):
        from radixlm.runtime.engine import Engine

        self.engine = Engine(dtype=dtype)
        self.encode = self.engine.tokenizer.encode

    def generate(self, prompts: list[str] | list[list[int]], new_tokens: int) -> None:
        params = {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}
        key = "input_ids" if isinstance(prompts[0], list) else "prompt"
        self.engine.generate(**{key: prompts}, sampling_params=params)

    def flush(self) -> None:
        self.engine.flush_cache()

    def extract(self, prompt: str, constrained: bool) -> str:
        """W4: one JSON extraction (under the W4 schema when `constrained`)."""
        params: dict[str, Any] = {"max_new_tokens": wl.W4_MAX_TOKENS, "temperature": 0.0}
        if constrained:
            params["json_schema"] = json.dumps(wl.W4_SCHEMA)
        out = self.engine.generate(prompt=prompt, sampling_params=params)
        assert isinstance(out, dict)
        return str(out["text"])


class Transformers:
    name = "transformers"

    def __init__(self, dtype: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from radixlm.runtime.model_files import resolve_model_path

        path = resolve_model_path(None)
        self.torch = torch
        torch_dtype = torch.float32 if dtype in ("auto", "float32") else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).eval()
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

    def extract(self, prompt: str, constrained: bool) -> str:
        """W4 without constraints (transformers has no grammar support of its own)."""
        batch = self.tokenizer([prompt], return_tensors="pt")
        with self.torch.inference_mode():
            out = self.model.generate(**batch, max_new_tokens=wl.W4_MAX_TOKENS, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id or 0)
        return str(self.tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True))


def run_system(system: Ours | Transformers, workloads: list[str], repeats: int) -> Result:
    """Median figures of one system. The slow batch workloads skip the warm-up run for the
    baseline (one transformers W3 run takes minutes; its first run is not slower)."""
    out: Result = {}
    heavy_warmup = isinstance(system, Ours)
    if "W1" in workloads:
        prompt = [wl.W1_PROMPT]
        ttft = _median_time(lambda: (system.flush(), system.generate(prompt, 1)), repeats)
        total = _median_time(lambda: (system.flush(), system.generate(prompt, wl.W1_NEW_TOKENS)), repeats)
        out["W1 TTFT s"] = ttft
        out["W1 decode tok/s"] = (wl.W1_NEW_TOKENS - 1) / (total - ttft)
    if "W2" in workloads:
        prompts = wl.w2_prompts()
        t = _median_time(lambda: (system.flush(), system.generate(prompts, wl.W2_NEW_TOKENS)), repeats, heavy_warmup)
        out["W2 output tok/s"] = len(prompts) * wl.W2_NEW_TOKENS / t
    if "W3" in workloads:
        _, prompts = wl.w3_workload()
        out["W3 wall s"] = _median_time(
            lambda: (system.flush(), system.generate(prompts, wl.W3_NEW_TOKENS)), repeats, heavy_warmup
        )
    if "W4" in workloads:
        modes = [True, False] if isinstance(system, Ours) else [False]
        for constrained in modes:
            out.update(_run_w4(system, constrained))
    if "W5" in workloads:
        ids = system.encode(wl.w5_text())[: wl.W5_TOKENS]
        t = _median_time(lambda: (system.flush(), system.generate([ids], 1)), repeats)
        out["W5 prefill tok/s"] = wl.W5_TOKENS / t
    return out


def _run_w4(system: Ours | Transformers, constrained: bool) -> Result:
    """W4: the 16 extractions one after another; seconds per request and how many are valid
    (strict: the whole output parses and matches the schema; unconstrained output is also
    checked leniently, from its first '{')."""
    cases = wl.w4_cases()
    system.extract(cases[0]["prompt"], constrained)  # warm-up (and, constrained, the grammar compile)
    start = time.perf_counter()
    texts = [system.extract(c["prompt"], constrained) for c in cases]
    per_request = (time.perf_counter() - start) / len(cases)
    strict = sum(wl.w4_check(t, c["truth"])[1] for t, c in zip(texts, cases))
    lenient = sum(wl.w4_check(wl.w4_first_object(t), c["truth"])[1] for t, c in zip(texts, cases))
    exact = sum(wl.w4_check(t, c["truth"])[2] for t, c in zip(texts, cases))
    tag = "W4 json_schema" if constrained else "W4 unconstrained"
    return {f"{tag} s/request": per_request, f"{tag} valid /16": float(strict),
            f"{tag} lenient valid /16": float(lenient), f"{tag} exact fields /64": float(exact)}


def _print_table(dtype: str, ours: Result, base: Result | None) -> None:
    print(f"\n## dtype {dtype}")
    print("| metric | radixlm | transformers | ratio |")
    print("|---|---|---|---|")
    for key, value in ours.items():
        if base is None or key not in base:
            print(f"| {key} | {value:.2f} | - | - |")
            continue
        lower_is_better = key.endswith(" s") or key.endswith("s/request")
        if not (lower_is_better or key.endswith("tok/s")) or min(value, base[key]) <= 0:
            print(f"| {key} | {value:.2f} | {base[key]:.2f} | - |")  # counts: no ratio
            continue
        ratio = base[key] / value if lower_is_better else value / base[key]
        print(f"| {key} | {value:.2f} | {base[key]:.2f} | {ratio:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixlm.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="W1,W5", help="comma-separated subset of W1,W2,W3,W4,W5")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes to run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline-repeats", type=int, default=None, help="repeats for transformers (default: --repeats)")
    parser.add_argument("--no-baseline", action="store_true", help="skip transformers")
    parser.add_argument("--serving", action="store_true",
                        help="serving mode: concurrent HTTP clients replay W2/W3 against a server")
    parser.add_argument("--url", default=None, help="serving mode: an already running server (default: start one)")
    parser.add_argument("--concurrency", type=int, default=32, help="serving mode: concurrent clients")
    args = parser.parse_args(argv)
    if args.serving:
        from radixlm.bench.serving import run_serving

        run_serving(args.url, args.concurrency, [])
        return 0
    import torch

    torch.set_num_threads(2)
    workloads = args.workloads.split(",")
    for dtype in args.dtypes.split(","):
        ours = run_system(Ours(dtype), workloads, args.repeats)
        base_repeats = args.baseline_repeats or args.repeats
        base = None if args.no_baseline else run_system(Transformers(dtype), workloads, base_repeats)
        _print_table(dtype, ours, base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
