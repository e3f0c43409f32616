"""The frontend benchmark (F1-F4) in tiny configurations on the tiny random model: each
workload's program runs on radixlm (in-process Engine) and on the naive transformers baseline,
the report has its fields, the two systems give the same greedy outputs, and the reported cache
hit rate is the radix cache's own statistic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixlm.runtime.bench.frontend import TallyingEngineBackend, agreement, run_workload
from radixlm.runtime.bench.frontend_workloads import f1_workload, f2_workload, f3_workload, f4_workload
from radixlm.runtime.bench.naive import NaiveTransformersBackend, _first_stop

TINY_WORKLOADS = {
    "F1": lambda: f1_workload(num_questions=3),
    "F2": lambda: f2_workload(num_questions=2, branch_tokens=6),
    "F3": lambda: f3_workload(num_conversations=2, num_turns=3, turn_tokens=6),
    "F4": lambda: f4_workload(num_passages=2, max_tokens=24),  # W4's schema needs at least 19 (xgrammar's layout)
}


@pytest.fixture(scope="module")
def ours(tiny_model_dir: Path) -> Iterator[TallyingEngineBackend]:
    """Its own Engine: the test compares its lifetime cache statistics with the tally."""
    from radixlm.runtime.engine import Engine

    backend = TallyingEngineBackend(Engine(str(tiny_model_dir), max_total_tokens=4096, random_seed=0,
                                                    dtype="float32"))  # outputs compared across schedules
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def naive(tiny_model_dir: Path) -> Iterator[NaiveTransformersBackend]:
    backend = NaiveTransformersBackend(str(tiny_model_dir))
    yield backend
    backend.shutdown()


@pytest.mark.parametrize("name", list(TINY_WORKLOADS))
def test_workload_report_and_identical_outputs(name: str, ours: TallyingEngineBackend, naive: NaiveTransformersBackend) -> None:
    workload = TINY_WORKLOADS[name]()
    report = run_workload(workload, ours, naive, repeats=2, base_repeats=1, warmup=False)
    row = report.row()
    n = len(workload.batch)
    assert row["workload"] == name and row["programs"] == n
    for key in ("radixlm s/program", "naive s/program", "radixlm programs/s", "naive programs/s", "speedup"):
        assert row[key] > 0, key
    assert len(report.ours.seconds) == 2 and len(report.base.seconds) == 1  # type: ignore[union-attr]
    assert 0.0 <= row["cache hit rate"] <= 1.0
    assert 0 < row["radixlm cached tokens"] < row["radixlm prompt tokens"]
    assert row["naive prompt tokens"] > 0
    # fp32 on both sides, greedy: every output variable of every program agrees
    assert row["identical programs"] == (n, n), (report.ours.outputs, report.base.outputs)
    assert row["identical values"][0] == row["identical values"][1]
    for outputs in report.ours.outputs:
        assert set(outputs) == set(workload.output_names)
    if workload.check is not None:
        assert report.ours_check and report.base_check


def test_tally_matches_the_radix_cache_statistics(ours: TallyingEngineBackend, naive: NaiveTransformersBackend) -> None:
    """Every request of the engine went through the tallying backend (this module's engine), so
    the tally's cached / prompt tokens is the hit rate the engine reports."""
    run_workload(TINY_WORKLOADS["F3"](), ours, None, repeats=1, base_repeats=0, warmup=False)
    info = ours.get_server_info()["radix_cache"]
    assert ours.tally.hit_rate > 0.3
    assert info["hit_rate"] == pytest.approx(ours.tally.hit_rate)


def test_naive_backend_is_independent_full_prompt_calls(naive: NaiveTransformersBackend) -> None:
    workload = TINY_WORKLOADS["F1"]()
    before = naive.stats.num_calls
    run_workload(workload, naive, None, repeats=1, base_repeats=0, warmup=False)
    assert naive.stats.num_calls - before == len(workload.batch) * 4  # one forward per choice
    assert naive.get_server_info()["naive_calls"]["num_calls"] == naive.stats.num_calls
    assert naive.flush_cache() is False


def test_naive_backend_refuses_sampling(naive: NaiveTransformersBackend) -> None:
    workload = TINY_WORKLOADS["F3"]()
    states = workload.program.run_batch(workload.batch[:1], backend=naive, temperature=0.7)
    assert "greedily" in str(states[0].error())


def test_first_stop_cuts_like_the_engine() -> None:
    assert _first_stop("ab\ncd", ["\n"]) == 2
    assert _first_stop("abcd", ["cd", "bcd"]) == 1  # both end at 4: the longer one
    assert _first_stop("abcd", ["x"]) is None


def test_agreement_counts_programs_and_values() -> None:
    ours: list[dict[str, Any]] = [{"a": "x", "b": ["1", "2"]}, {"a": "y", "b": ["1", "3"]}]
    base: list[dict[str, Any]] = [{"a": "x", "b": ["1", "2"]}, {"a": "y", "b": ["1", "4"]}]
    assert agreement(ours, base) == (1, 2, 5, 6)
