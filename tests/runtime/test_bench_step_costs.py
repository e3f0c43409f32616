"""`python -m radixlm.runtime.bench.step_costs`: decode steps of B rows (one request's verify rows,
or B requests) timed on the tiny random model. No speed is asserted: every layout and row count
ran through the runner, and the pools got their slots back."""

from __future__ import annotations

from pathlib import Path

from radixlm.runtime.bench.step_costs import measure
from radixlm.runtime.engine import Engine


def test_step_costs_cover_both_layouts_and_return_the_slots(tiny_model_dir: Path) -> None:
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=2048) as engine:
        free_slots, free_rows = engine.runner.kv_pool.num_free, engine.runner.req_to_token_pool.num_free
        costs = measure(engine, [1, 3], context=40, repeats=2)
        assert engine.runner.kv_pool.num_free == free_slots
        assert engine.runner.req_to_token_pool.num_free == free_rows
    assert [(c.layout, c.rows) for c in costs] == [("verify", 1), ("verify", 3), ("separate", 1), ("separate", 3)]
    assert all(c.forward_ms > 0 and c.vs_one_row > 0 for c in costs)
    assert costs[0].vs_one_row == 1.0 and costs[2].vs_one_row == 1.0
