"""What a decode step of B rows costs (issue 37: a verify row should cost a small part of a step).

`python -m radixlm.runtime.bench.step_costs [--rows 1 2 3 5 9 16] [--context 400] [--threads 1] [--flags JSON]`
loads an in-process Engine (the default model as shipped unless --flags say otherwise), takes
request slots and KV slots from its pools, and times the model runner's forward of a decode
batch of B rows in two layouts:
  - "verify": B rows of ONE request at consecutive positions after `context` tokens (a
    speculative verify step: its decode row, then its drafts);
  - "separate": B requests of `context` tokens, one row each (a plain batched decode step).
Each figure is the minimum over `repeats` runs of the calling thread's CPU time
(time.thread_time), so with --threads 1 (the default) a loaded machine's other processes do not
count; with more threads only the calling thread's share would be seen, so the wall clock is
used then. The KV written at those slots is garbage: the pools are handed back afterwards, and the
Engine should be thrown away. Per B: the whole forward (DecodeStack + lm_head + Python), the
DecodeStack call alone where the model has one, and the forward's cost over the 1-row step's.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from radixlm.runtime.model.forward_batch import ForwardBatch


@dataclass(frozen=True)
class StepCost:
    layout: str  # "verify" or "separate"
    rows: int
    forward_ms: float
    stack_ms: float | None  # the DecodeStack call alone (None: the model has none)
    vs_one_row: float  # forward_ms over the same layout's 1-row forward_ms


def _min_ms(fn: Callable[[], object], repeats: int, clock: Callable[[], float]) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best * 1e3


def measure(engine: Any, rows_list: Sequence[int], context: int, repeats: int = 20,
            clock: Callable[[], float] = time.thread_time) -> list[StepCost]:
    """StepCosts of `engine`'s runner for each B in rows_list, both layouts (B <= 64)."""
    runner = engine.runner
    model = runner.model
    max_rows = max(rows_list)
    taken = [runner.req_to_token_pool.alloc() for _ in range(max_rows)]
    reqs = [r for r in taken if r is not None]
    slots = runner.kv_pool.alloc(max_rows * (context + max_rows))
    try:
        if len(reqs) < max_rows or slots is None:
            raise ValueError(f"the pools hold fewer than {max_rows} requests of {context + max_rows} tokens")
        span = context + max_rows
        for i, row in enumerate(reqs):
            runner.req_to_token_pool.write(row, 0, slots[i * span:(i + 1) * span])
        req_to_token = runner.req_to_token_pool.req_to_token
        out: list[StepCost] = []
        for layout in ("verify", "separate"):
            base = None
            for B in rows_list:
                if layout == "verify":
                    rows, seq_lens = [reqs[0]] * B, [context + 1 + i for i in range(B)]
                else:
                    rows, seq_lens = reqs[:B], [context + 1] * B
                locs = torch.tensor([int(req_to_token[r, s - 1]) for r, s in zip(rows, seq_lens, strict=True)])
                ids = torch.randint(100, model.cfg.vocab_size, (B,), generator=torch.Generator().manual_seed(B)).tolist()
                batch = ForwardBatch.decode(rows, seq_lens, ids, locs)
                forward_ms = _min_ms(lambda batch=batch: runner.forward(batch), repeats, clock)
                stack_ms = None
                if getattr(model, "decode_stack", None) is not None and model.runs_in_decode_stack(batch):
                    with torch.inference_mode():
                        hidden = model._embed(batch.input_ids).float()
                        rope = torch.view_as_real(model._rope_factors(batch)[0])
                    stack_ms = _min_ms(lambda b=batch, h=hidden, r=rope: model.decode_stack.forward(
                        h, r, b.out_cache_loc, req_to_token, b.req_pool_indices, b.seq_lens), repeats, clock)
                base = base or forward_ms
                out.append(StepCost(layout, B, forward_ms, stack_ms, forward_ms / base))
        return out
    finally:
        if slots is not None:
            runner.kv_pool.free(slots)
        for row in reqs:
            runner.req_to_token_pool.free(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 5, 9, 16])
    parser.add_argument("--context", type=int, default=400, help="tokens before the new rows")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--flags", default="{}", help="Engine arguments as JSON")
    args = parser.parse_args()
    from radixlm.runtime.engine import Engine

    with Engine(**json.loads(args.flags)) as engine:
        torch.set_num_threads(args.threads)
        clock = time.thread_time if args.threads == 1 else time.perf_counter
        for c in measure(engine, args.rows, args.context, args.repeats, clock):
            stack = "" if c.stack_ms is None else f"  stack {c.stack_ms:7.2f} ms"
            print(f"{c.layout:8s} B={c.rows:3d}  forward {c.forward_ms:7.2f} ms{stack}  {c.vs_one_row:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
