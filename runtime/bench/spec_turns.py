"""Speculative decoding on and off in turns on one Engine (issue 37's "W1 no slower than without").

`python -m radixlm.runtime.bench.spec_turns [--turns 7] [--new-tokens 128] [--model-path P]`
loads the model once with `--speculative-algorithm NGRAM`, then generates W1's prompt greedily
(`ignore_eos`), alternately with the engine's drafter and with drafting off (`Drafter(None)`),
the radix cache flushed before each run, after one warm-up each. It prints each side's median
tok/s (prefill included) and the median of the per-turn ratios (on / off, >1: speculation is
faster). Taking turns in one process puts a drift of the machine's speed on both sides alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from radixlm.runtime.bench import workloads as wl


def run_turns(engine: Any, prompt: str, new_tokens: int, turns: int) -> dict[str, float]:
    """Medians of tok/s with the engine's drafter and without, and of their per-turn ratios."""
    from radixlm.runtime.scheduler.speculative import Drafter

    sched = engine.scheduler
    drafters = {"on": sched.drafter, "off": Drafter(None)}
    params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    speeds: dict[str, list[float]] = {"on": [], "off": []}
    try:
        for turn in range(turns + 1):  # the first turn warms up
            for side, drafter in drafters.items():
                sched.drafter = drafter
                engine.flush_cache()
                start = time.perf_counter()
                out = engine.generate(prompt, params)
                if turn:
                    speeds[side].append(out["meta_info"]["completion_tokens"] / (time.perf_counter() - start))
    finally:
        sched.drafter = drafters["on"]
    ratios = [on / off for on, off in zip(speeds["on"], speeds["off"], strict=True)]
    return {"on tok/s": statistics.median(speeds["on"]), "off tok/s": statistics.median(speeds["off"]),
            "ratio": statistics.median(ratios), "ratio min": min(ratios), "ratio max": max(ratios)}


def main() -> None:
    from radixlm.runtime.engine import Engine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=wl.W1_NEW_TOKENS)
    parser.add_argument("--model-path", default=None, help="default: the default model")
    args = parser.parse_args()
    with Engine(args.model_path, speculative_algorithm="NGRAM") as engine:
        result = run_turns(engine, wl.W1_PROMPT, args.new_tokens, args.turns)
    print(json.dumps({"workload": "W1", "turns": args.turns, **result}, indent=1))


if __name__ == "__main__":
    main()
