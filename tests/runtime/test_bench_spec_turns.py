"""`python -m radixlm.runtime.bench.spec_turns`: NGRAM on and off in turns on one Engine (tiny
random model). No speed is asserted: both sides ran every turn, and the drafter is restored."""

from __future__ import annotations

from pathlib import Path

from radixlm.runtime.bench.spec_turns import WORKLOADS, run_turns, runs
from radixlm.runtime.engine import Engine


def test_turns_run_both_sides_and_restore_the_drafter(tiny_model_dir: Path) -> None:
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096, speculative_algorithm="NGRAM") as engine:
        drafter = engine.scheduler.drafter
        table = runs(engine, new_tokens=8)
        assert set(table) == set(WORKLOADS)
        seen: list[object] = []

        def w1_watched(e: Engine) -> float:
            seen.append(e.scheduler.drafter)
            return table["W1"][1](e)

        forwards = engine.scheduler.num_forwards
        result = run_turns(engine, w1_watched, 2)
        assert engine.scheduler.drafter is drafter
        assert engine.scheduler.num_forwards > forwards
        # a warm-up turn and 2 measured ones, each drafting and not, in turn
        assert [d is drafter for d in seen] == [True, False] * 3
    assert set(result) == {"on", "off", "ratio", "ratio min", "ratio max"}
    assert min(result.values()) > 0 and result["ratio min"] <= result["ratio"] <= result["ratio max"]
