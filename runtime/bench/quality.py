"""`python -m radixlm.runtime.bench.quality`: what quantization costs in quality, on the default model.

For each mode (a float dtype, or a quantization with its activation mode; see MODES):
- perplexity on a held-out text: Python's own documentation topics (`pydoc_data.topics`, in every
  Python install; none of our prompts), its first --tokens tokens (default 20,480) in windows of
  --window tokens (default 1,024), each scored from the window's start (the log-probability of
  every token but the window's first, from `input_token_logprobs`);
- greedy agreement with float32 on W1 (128 tokens) and W2 (32 prompts x 64 tokens): per request,
  the share of its tokens before the first one that differs from float32's, averaged.
`--memory` adds the resident memory of a whole server (scheduler, detokenizer, HTTP front) after
W1, per mode, at a fixed --max-total-tokens (runtime/bench/memory.py's measure).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence
from typing import Any

from radixlm.runtime.bench import workloads as wl

# mode -> Engine flags (dtype float32 for the rest, so each mode differs from float32 only by its quantization)
MODES: dict[str, dict[str, Any]] = {
    "float32": {"dtype": "float32", "quantization": "none"},
    "bfloat16": {"dtype": "bfloat16", "quantization": "none"},
    "q4_1 weight-only": {"dtype": "float32", "quantization": "gguf", "quantized_activations": "float32"},
    "q4_1 int8": {"dtype": "float32", "quantization": "gguf", "quantized_activations": "int8"},
    "q4_1 int8 bf16": {"dtype": "bfloat16", "quantization": "gguf", "quantized_activations": "int8"},
    "q8_0 int8": {"dtype": "float32", "quantization": "q8_0", "quantized_activations": "int8"},
    "q4_0 int8": {"dtype": "float32", "quantization": "q4_0", "quantized_activations": "int8"},
    "w8a8_int8": {"dtype": "float32", "quantization": "w8a8_int8"},
}


def held_out_ids(tokenizer: Any, tokens: int) -> list[int]:
    """The first `tokens` tokens of Python's documentation topics (sorted by name, joined)."""
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    ids: list[int] = []
    for name in sorted(topics):
        ids += tokenizer.encode(topics[name] + "\n\n")
        if len(ids) >= tokens:
            break
    if len(ids) < tokens:
        raise ValueError(f"the held-out text has only {len(ids)} tokens")
    return ids[:tokens]


def perplexity(engine: Any, ids: Sequence[int], window: int) -> float:
    nll, count = 0.0, 0
    for start in range(0, len(ids) - window + 1, window):
        out = engine.generate(input_ids=list(ids[start:start + window]), return_logprob=True, logprob_start_len=0,
                              sampling_params={"max_new_tokens": 1, "temperature": 0})
        logprobs = [entry[0] for entry in out["meta_info"]["input_token_logprobs"][1:]]
        nll -= sum(logprobs)
        count += len(logprobs)
    return math.exp(nll / count)


def greedy_ids(engine: Any, prompts: list[str], new_tokens: int) -> list[list[int]]:
    outs = engine.generate(prompt=prompts, sampling_params={"temperature": 0, "max_new_tokens": new_tokens,
                                                            "ignore_eos": True})
    return [list(o["output_ids"]) for o in outs]


def agreement(ours: list[list[int]], reference: list[list[int]]) -> float:
    """Mean over requests of the share of tokens before the first difference."""
    shares = []
    for a, b in zip(ours, reference, strict=True):
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        shares.append(same / len(b))
    return statistics.mean(shares)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of: {', '.join(MODES)}")
    parser.add_argument("--tokens", type=int, default=20480)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--memory", action="store_true", help="also the server's resident memory after W1, per mode")
    parser.add_argument("--max-total-tokens", type=int, default=16384, help="the KV pool of every --memory server")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown modes: {', '.join(unknown)}")
    from radixlm.runtime.engine import Engine

    rows: dict[str, dict[str, float]] = {}
    reference: dict[str, list[list[int]]] = {}
    for mode in ["float32"] + [m for m in modes if m != "float32"]:
        with Engine(**MODES[mode]) as engine:
            ids = held_out_ids(engine.tokenizer, args.tokens)
            outs = {"W1": greedy_ids(engine, [wl.W1_PROMPT], wl.W1_NEW_TOKENS),
                    "W2": greedy_ids(engine, wl.w2_prompts(), wl.W2_NEW_TOKENS)}
            if mode == "float32":
                reference = outs
            rows[mode] = {"perplexity": perplexity(engine, ids, args.window),
                          "W1 agreement": agreement(outs["W1"], reference["W1"]),
                          "W2 agreement": agreement(outs["W2"], reference["W2"])}
        if args.memory:
            from radixlm.runtime.bench.memory import server_rss_after_w1

            rows[mode]["server RSS GiB"] = server_rss_after_w1(MODES[mode], args.max_total_tokens) / 2**30
        print(mode, rows[mode], flush=True)
    base = rows["float32"]["perplexity"]
    print(f"\n## quality on the default model: perplexity on {args.tokens} tokens of Python's documentation "
          f"(windows of {args.window}), greedy agreement with float32")
    extra = " server RSS GiB |" if args.memory else ""
    print(f"| mode | perplexity | vs float32 | W1 agreement | W2 agreement |{extra}")
    print("|---|---|---|---|---|" + ("---|" if args.memory else ""))
    for mode, r in rows.items():
        memory = f" {r['server RSS GiB']:.2f} |" if args.memory else ""
        print(f"| {mode} | {r['perplexity']:.3f} | {r['perplexity'] / base - 1:+.2%} | {r['W1 agreement']:.2f} | "
              f"{r['W2 agreement']:.2f} |{memory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
