"""`python -m radixlm.runtime.bench.spec_turns`: NGRAM on and off in turns on one Engine (tiny
random model). No speed is asserted: both sides ran every turn, and the drafter is restored."""

from __future__ import annotations

from pathlib import Path

from radixlm.runtime.bench.spec_turns import run_turns
from radixlm.runtime.engine import Engine


def test_turns_run_both_sides_and_restore_the_drafter(tiny_model_dir: Path) -> None:
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=2048, speculative_algorithm="NGRAM") as engine:
        drafter = engine.scheduler.drafter
        forwards = engine.scheduler.num_forwards
        result = run_turns(engine, "one two three one two three one two", 8, 2)
        assert engine.scheduler.drafter is drafter
        assert engine.scheduler.num_forwards > forwards
    assert set(result) == {"on tok/s", "off tok/s", "ratio", "ratio min", "ratio max"}
    assert min(result.values()) > 0 and result["ratio min"] <= result["ratio"] <= result["ratio max"]
