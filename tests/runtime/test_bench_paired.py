"""`python -m radixlm.runtime.bench --paired`: run_paired lets two real systems take turns, one
measurement each (two of our engines on the default model stand in for ours and the peer:
llama.cpp is an optional extra), and paired_figures ratios the turns. No speed is asserted, so W1
decodes 8 tokens here instead of its 128."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from radixlm.runtime.bench import __main__ as bench
from radixlm.runtime.bench import workloads as wl


def _watched(system: bench.Ours, name: str, calls: list[str]) -> bench.Ours:
    """`system`, each generate call recorded in `calls` under `name` before it runs."""
    generate = system.generate

    def recorded(prompts: Any, new_tokens: int) -> None:
        calls.append(name)
        generate(prompts, new_tokens)

    system.generate = recorded  # type: ignore[method-assign]
    return system


@pytest.mark.slow
def test_paired_runs_take_turns(default_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wl, "W1_NEW_TOKENS", 8)
    calls: list[str] = []
    ours, other = _watched(bench.Ours("q4_1"), "ours", calls), _watched(bench.Ours("q4_1"), "other", calls)
    try:
        ours_turns, other_turns = bench.run_paired(ours, other, ["W1"], repeats=2)
    finally:
        ours.shutdown()
        other.shutdown()
    # a W1 measurement is two generates (its TTFT, then the whole); a warm-up each, then the turns
    assert calls == ["ours"] * 2 + ["other"] * 2 + (["ours"] * 2 + ["other"] * 2) * 2
    for turns in (ours_turns, other_turns):
        assert list(turns) == ["W1"] and len(turns["W1"]) == 2
        # decode tok/s is 7 tokens over the difference of two timed runs: on a loaded machine the
        # 8-token run can take less than the 1-token run, so only its being a number is asserted here
        assert all(set(t) == {"W1 TTFT s", "W1 decode tok/s"} and t["W1 TTFT s"] > 0
                   and math.isfinite(t["W1 decode tok/s"]) for t in turns["W1"])


def test_paired_figures_are_medians_and_the_median_of_the_turns_ratios() -> None:
    ours = {"W1": [{"W1 TTFT s": 1.0, "W1 decode tok/s": 100.0}, {"W1 TTFT s": 2.0, "W1 decode tok/s": 50.0},
                   {"W1 TTFT s": 4.0, "W1 decode tok/s": 40.0}]}
    peer = {"W1": [{"W1 TTFT s": 2.0, "W1 decode tok/s": 50.0}, {"W1 TTFT s": 2.0, "W1 decode tok/s": 100.0},
                   {"W1 TTFT s": 1.0, "W1 decode tok/s": 20.0}]}
    mine, theirs, ratios = bench.paired_figures(ours, peer)
    assert mine == {"W1 TTFT s": 2.0, "W1 decode tok/s": 50.0}
    assert theirs == {"W1 TTFT s": 2.0, "W1 decode tok/s": 50.0}
    # per turn: TTFT 2.0, 1.0, 0.25 (lower is better); decode 2.0, 0.5, 2.0; the ratio of the
    # medians would say 1.0 for both
    assert ratios == {"W1 TTFT s": 1.0, "W1 decode tok/s": 2.0}
