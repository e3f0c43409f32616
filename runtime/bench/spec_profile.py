"""Where an extraction's time goes, with and without speculative decoding (issue 37).

`python -m radixlm.runtime.bench.spec_profile [--task W6] [--concurrency N] [--flags '{"speculative_algorithm": "NGRAM"}']`
runs the task's requests one after another on an in-process Engine (as `extraction.run_extraction`
does) and splits each request's wall time by the scheduler's step records: prefill steps, plain
decode steps (one row per request), verify steps (rows with drafts: forced and speculative) and
the rest (tokenization, grammar compile wait, detokenizing, the Engine's loop: the fixed part).

The fixed part and prefill bound what any drafting can win: with every decode step gone but one,
a request costs at least fixed + prefill + one step, so the best ratio over the run without
speculation is `wall / (fixed + prefill + one decode step)` (printed as "bound"). Figures are
per request; on a shared machine only their ratios mean anything.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.bench.extraction import TASKS, ExtractionTask
from radixlm.runtime.scheduler.scheduler import StepRecord


@dataclass
class Profile:
    """Sums over the measured requests (divide by `num_requests` for per-request figures)."""

    num_requests: int = 0
    wall: float = 0.0
    prefill_secs: float = 0.0
    num_prefill_steps: int = 0
    decode_secs: float = 0.0  # steps without draft rows
    num_decode_steps: int = 0
    verify_secs: float = 0.0  # steps with draft rows
    num_verify_steps: int = 0
    num_verify_rows: int = 0  # query rows of the verify steps (one per request + drafts)
    num_verify_new_tokens: int = 0  # output tokens the verify steps took
    num_output_tokens: int = 0
    rows_histogram: dict[int, int] = field(default_factory=dict)

    def add_steps(self, steps: list[StepRecord]) -> None:
        for s in steps:
            if s.num_extends:
                self.prefill_secs += s.secs
                self.num_prefill_steps += 1
            elif s.num_draft_tokens:
                self.verify_secs += s.secs
                self.num_verify_steps += 1
                rows = s.num_decodes + s.num_draft_tokens
                self.num_verify_rows += rows
                self.rows_histogram[rows] = self.rows_histogram.get(rows, 0) + 1
                self.num_verify_new_tokens += s.num_new_tokens
            else:
                self.decode_secs += s.secs
                self.num_decode_steps += 1
            self.num_output_tokens += s.num_new_tokens

    def summary(self) -> dict[str, Any]:
        n = max(1, self.num_requests)
        fixed = self.wall - self.prefill_secs - self.decode_secs - self.verify_secs
        one_step = self.decode_secs / max(1, self.num_decode_steps)
        return {
            "s/request": self.wall / n, "prefill s": self.prefill_secs / n, "decode s": self.decode_secs / n,
            "verify s": self.verify_secs / n, "fixed s": fixed / n,
            "decode steps": self.num_decode_steps / n, "verify steps": self.num_verify_steps / n,
            "s/decode step": one_step, "s/verify step": self.verify_secs / max(1, self.num_verify_steps),
            "rows/verify step": self.num_verify_rows / max(1, self.num_verify_steps),
            "tokens/verify step": self.num_verify_new_tokens / max(1, self.num_verify_steps),
            "output tokens": self.num_output_tokens / n,
            "output tok/s": self.num_output_tokens / max(1e-9, self.wall),
            "bound": self.wall / max(1e-9, fixed + self.prefill_secs + one_step * n),
            "rows histogram": dict(sorted(self.rows_histogram.items())),
        }


def profile(task: ExtractionTask, engine_flags: dict[str, Any], concurrency: int = 1) -> Profile:
    """Run the task's requests (after one warm-up) on a new Engine with `engine_flags`: one after
    another, or with `concurrency` > 1 that many at once (the cases repeated), in one batch
    whose steps are shared (then "s/request" is the batch's wall time / its requests)."""
    from radixlm.runtime.engine import Engine

    engine = Engine(**engine_flags)
    try:
        params = {"max_new_tokens": task.max_tokens, "temperature": 0.0, "json_schema": json.dumps(task.schema)}
        cases = task.cases()
        engine.generate(prompt=cases[0]["prompt"], sampling_params=params)
        engine.scheduler.drafter.flush()  # measured again: it must not draft from its warm-up output
        out = Profile()
        if concurrency > 1:
            prompts = [cases[i % len(cases)]["prompt"] for i in range(concurrency)]
            engine.scheduler.recent_steps.clear()
            start = time.perf_counter()
            engine.generate(prompt=prompts, sampling_params=params)
            out.wall = time.perf_counter() - start
            out.add_steps(list(engine.scheduler.recent_steps))
            out.num_requests = concurrency
            return out
        for case in cases:
            engine.scheduler.recent_steps.clear()
            start = time.perf_counter()
            engine.generate(prompt=case["prompt"], sampling_params=params)
            out.wall += time.perf_counter() - start
            out.add_steps(list(engine.scheduler.recent_steps))
            out.num_requests += 1
        return out
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="W6", choices=sorted(TASKS))
    parser.add_argument("--flags", default="{}", help="Engine arguments as JSON, e.g. "
                        '\'{"speculative_algorithm": "NGRAM"}\'')
    parser.add_argument("--concurrency", type=int, default=1, help="requests at once (default: one after another)")
    args = parser.parse_args()
    result = profile(TASKS[args.task], json.loads(args.flags), args.concurrency).summary()
    print(json.dumps({"task": args.task, "flags": json.loads(args.flags), **result}, indent=1))


if __name__ == "__main__":
    main()
