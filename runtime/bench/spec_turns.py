"""Speculative decoding on and off in turns on one Engine: whether it ever loses (issue 37's "W1 no
slower than without", "32 concurrent W6 not slower", and the default-on decision).

`python -m radixlm.runtime.bench.spec_turns [--workloads W1,W2,W3,W5,W4,W6,W6x32,F4] [--turns 7]
[--new-tokens 128] [--model-path P] [--flags JSON]` loads the model once with
`--speculative-algorithm NGRAM` (--flags may override it: `{"speculative_algorithm": null}` is the
default, drafting under a grammar only), then runs each workload alternately with the
engine's drafter and with drafting off (`Drafter(None)`), the radix cache flushed before each
run, after one warm-up each. Per workload it prints each side's median rate and the median of the
per-turn ratios (on / off, >1: speculation is faster). Taking turns in one process puts a drift of
the machine's speed on both sides alike.

The workloads, as the main bench's (radixlm.runtime.bench.workloads), greedy:
  W1     one stream, 128 new tokens (EOS ignored): tok/s, prefill included
  W2     32 distinct prompts x 64 new tokens at once: output tok/s
  W3     32 questions sharing a ~1,000-token prefix x 16 new tokens at once: questions/s
  W5     a 2,000-token prefill, 1 new token: prompt tok/s
  W4/W6  the extraction task's 16 requests one after another, with its json_schema: requests/s
  W6x32  32 W6 requests at once (the 16 cases twice): requests/s
  F4     the frontend workload: W4's 16 passages as `@function` programs (a gen with W4's json_schema),
         `run_batch` through the language's EngineBackend: programs/s
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from radixlm.runtime.bench import workloads as wl
from radixlm.runtime.bench.extraction import TASKS

WORKLOADS = ("W1", "W2", "W3", "W5", "W4", "W6", "W6x32", "F4")
# one run of a workload on the engine: (units done, what the unit is); the caller times it
Run = Callable[[Any], float]


def runs(engine: Any, new_tokens: int = wl.W1_NEW_TOKENS) -> dict[str, tuple[str, Run]]:
    """Per workload: its rate's unit and one run (returns the units done)."""
    free = {"temperature": 0, "ignore_eos": True}

    def generate(prompts: Any, new: int) -> float:
        outs = engine.generate(prompts, {**free, "max_new_tokens": new})
        outs = outs if isinstance(outs, list) else [outs]
        return float(sum(o["meta_info"]["completion_tokens"] for o in outs))

    def extraction(name: str, copies: int, at_once: bool) -> Run:
        task = TASKS[name]
        params = {"max_new_tokens": task.max_tokens, "temperature": 0.0, "json_schema": json.dumps(task.schema)}
        prompts = [c["prompt"] for c in task.cases()] * copies

        def run(_: Any) -> float:
            if at_once:
                engine.generate(prompts, params)
            else:
                for p in prompts:
                    engine.generate(p, params)
            return float(len(prompts))
        return run

    def frontend(_: Any) -> float:
        from radixlm.backend.engine import EngineBackend
        from radixlm.runtime.bench.frontend_workloads import f4_workload

        f4 = f4_workload()
        f4.program.run_batch(f4.batch, backend=EngineBackend(engine), temperature=0)
        return float(len(f4.batch))

    w5_ids = engine.tokenizer.encode(wl.w5_text())[: wl.W5_TOKENS]
    return {
        "W1": ("tok/s", lambda _: generate(wl.W1_PROMPT, new_tokens)),
        "W2": ("output tok/s", lambda _: generate(wl.w2_prompts(), wl.W2_NEW_TOKENS)),
        "W3": ("questions/s", lambda _: generate(wl.w3_workload()[1], wl.W3_NEW_TOKENS) / wl.W3_NEW_TOKENS),
        "W5": ("prompt tok/s", lambda _: _prefill(engine, w5_ids)),
        "W4": ("requests/s", extraction("W4", 1, False)),
        "W6": ("requests/s", extraction("W6", 1, False)),
        "W6x32": ("requests/s", extraction("W6", 2, True)),
        "F4": ("programs/s", frontend),
    }


def _prefill(engine: Any, ids: list[int]) -> float:
    engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 1})
    return float(len(ids))


def run_turns(engine: Any, run: Run, turns: int) -> dict[str, float]:
    """Medians of `run`'s rate with the engine's drafter and without, and of their per-turn ratios."""
    from radixlm.runtime.scheduler.speculative import Drafter

    sched = engine.scheduler
    drafters = {"on": sched.drafter, "off": Drafter(None)}
    speeds: dict[str, list[float]] = {"on": [], "off": []}
    try:
        for turn in range(turns + 1):  # the first turn warms up
            for side, drafter in drafters.items():
                sched.drafter = drafter
                engine.flush_cache()
                start = time.perf_counter()
                units = run(engine)
                if turn:
                    speeds[side].append(units / (time.perf_counter() - start))
    finally:
        sched.drafter = drafters["on"]
    ratios = [on / off for on, off in zip(speeds["on"], speeds["off"], strict=True)]
    return {"on": statistics.median(speeds["on"]), "off": statistics.median(speeds["off"]),
            "ratio": statistics.median(ratios), "ratio min": min(ratios), "ratio max": max(ratios)}


def main() -> None:
    from radixlm.runtime.engine import Engine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="W1", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--turns", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=wl.W1_NEW_TOKENS, help="W1's new tokens")
    parser.add_argument("--model-path", default=None, help="default: the default model")
    parser.add_argument("--flags", default="{}", help="more Engine arguments as JSON")
    args = parser.parse_args()
    chosen = args.workloads.split(",")
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    flags = {"speculative_algorithm": "NGRAM", **json.loads(args.flags)}  # '{"speculative_algorithm": null}': the default
    with Engine(args.model_path, **flags) as engine:
        table = runs(engine, args.new_tokens)
        for name in chosen:
            unit, run = table[name]
            result = run_turns(engine, run, args.turns)
            print(json.dumps({"workload": name, "unit": unit, "turns": args.turns, **result}), flush=True)


if __name__ == "__main__":
    main()
