"""Per-step work is incremental (STYLE point 16), checked by counters on a real Scheduler over the
tiny random model, stepped by hand:
  - a waiting request is prefix-matched against the radix cache at most once per step, whatever
    the schedule policy, while requests wait several steps (few running slots, a small KV pool
    that retracts requests back to the waiting queue);
  - each request's penalty counts equal a recount of its output after every step, through
    retraction and resumption and through jump-forward drafts, and are counted from the output
    only once per request (then kept up to date as tokens are accepted);
  - outputs are those of the plain path: penalized requests give the same tokens in a tiny pool
    (retracting) as in a large one, and with jump-forward on as with it off.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from radixlm_testing import assert_engine_clean

import radixlm.runtime.scheduler.scheduler as scheduler_module
from radixlm.runtime.engine import Engine
from radixlm.runtime.sampling.sampler import SamplingBatch, count_tokens, has_penalties
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.req import LogprobOptions, Req
from radixlm.runtime.scheduler.scheduler import Scheduler, sampling_batch

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Once upon a time",
    "In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole.",
    "1 2 3 4 5 6 7 8 9 10 11 12",
    "The quick brown fox naps",  # shares a prefix with the first
    "Tea, spices and trade routes",
]
PENALIZED = [
    {"temperature": 0.0, "frequency_penalty": 0.8},
    {"temperature": 0.0, "presence_penalty": 1.5, "repetition_penalty": 1.4},
    {"temperature": 0.9, "seed": 7, "repetition_penalty": 1.8, "frequency_penalty": -0.5},
    {"temperature": 1.0, "seed": 3, "top_k": 20},  # no penalty: keeps no counts
    {"temperature": 0.7, "seed": 11, "presence_penalty": -1.0},
    {"temperature": 0.0, "repetition_penalty": 0.7},
]
REGEX = r"(item [0-9]: (alpha|beta|gamma)-value; ){5}"


@contextmanager
def engine_on(model_dir: Path, **kwargs: Any) -> Iterator[Engine]:
    # float32 by name, as tiny_engine: the tests compare outputs across batches (with --dtype auto a
    # CPU with AMX takes bfloat16, whose batch-dependent rounding can flip a greedy choice)
    engine = Engine(str(model_dir), random_seed=0, **{"dtype": "float32", **kwargs})
    try:
        yield engine
        assert_engine_clean(engine)
    finally:
        engine.shutdown()


def make_reqs(engine: Engine, prompts: Sequence[str], params: Sequence[dict[str, Any]], tag: str = "") -> list[Req]:
    return [
        engine.stack.make_req(f"{tag}{i}", engine.tokenizer.encode(p), SamplingParams.from_dict(sp), LogprobOptions())
        for i, (p, sp) in enumerate(zip(prompts, params))
    ]


def run(engine: Engine, reqs: Sequence[Req]) -> int:
    """Add the requests and step until all are done, checking the KV slots and every request's
    penalty counts after each step; the number of steps."""
    sched = engine.scheduler
    for req in reqs:
        sched.add_request(req)
    num_steps = 0
    while sched.has_work:
        sched.step()
        sched.check_integrity()
        check_counts(reqs, engine.model_config.vocab_size)
        num_steps += 1
    assert all(r.is_finished for r in reqs)
    return num_steps


def check_counts(reqs: Sequence[Req], vocab_size: int) -> None:
    """Every penalized request's counts equal a recount of its output; others keep none."""
    for req in reqs:
        counts = req.output_token_counts
        if not has_penalties(req.params):
            assert counts is None, req.rid
        elif counts is not None or req.output_ids:
            assert counts is not None, req.rid
            assert torch.equal(counts, count_tokens(req.output_ids, vocab_size, counts.device)), req.rid


# ---------------------------------------------------------------- prefix matches


class MatchSpy:
    """Wraps the scheduler's cache.match_prefix and its runner's forward: per step, the keys
    matched before the forward (the schedule policy's and admission's work on waiting requests;
    the cache bridge re-reads running requests' prefixes only after the forward)."""

    def __init__(self, sched: Scheduler):
        self.events: list[tuple[int, ...] | None] = []  # a matched key, or None for a forward
        cache, runner = sched.cache, sched.runner
        match_prefix, forward = cache.match_prefix, runner.forward

        def spy_match(token_ids: Sequence[int], **kw: Any) -> Any:
            self.events.append(tuple(token_ids))
            return match_prefix(token_ids, **kw)

        def spy_forward(batch: Any) -> torch.Tensor:
            self.events.append(None)
            return forward(batch)

        cache.match_prefix = spy_match  # type: ignore[method-assign]
        runner.forward = spy_forward  # type: ignore[method-assign]

    def take_admission_keys(self) -> list[tuple[int, ...]]:
        """The keys matched before this step's forward (all of them if there was none)."""
        events, self.events = self.events, []
        end = events.index(None) if None in events else len(events)
        return [key for key in events[:end] if key is not None]


@pytest.mark.parametrize(
    "options",
    [
        {"schedule_policy": "lpm", "max_running_requests": 2},
        {"schedule_policy": "dfs-weight", "max_running_requests": 2},
        {"schedule_policy": "fcfs", "max_running_requests": 2},
        {"schedule_policy": "lof", "max_running_requests": 3},
        {"schedule_policy": "lpm", "max_total_tokens": 160, "chunked_prefill_size": 32},  # retracts
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_waiting_request_matched_at_most_once_per_step(tiny_model_dir: Path, options: dict[str, Any]) -> None:
    options = {"max_total_tokens": 4096, **options}
    with engine_on(tiny_model_dir, **options) as engine:
        sched = engine.scheduler
        params = [{"temperature": 0.0, "max_new_tokens": 40 + 4 * i, "ignore_eos": True} for i in range(len(PROMPTS))]
        reqs = make_reqs(engine, PROMPTS, params)
        spy = MatchSpy(sched)
        for req in reqs:
            sched.add_request(req)
        steps_waited: Counter[str] = Counter()
        num_matches = 0
        while sched.has_work:
            # the key a request is matched by while waiting (some join the queue during the step,
            # retracted); no output token is added before the step's forward
            key_to_rid = {tuple(r.all_ids[:-1]): r.rid for r in reqs if not r.is_finished}
            steps_waited.update(r.rid for r in sched.waiting)
            sched.step()
            keys = spy.take_admission_keys()
            assert all(k in key_to_rid for k in keys)
            per_req = Counter(key_to_rid[k] for k in keys)
            assert all(n <= 1 for n in per_req.values()), per_req
            num_matches += len(keys)
        assert max(steps_waited.values()) >= 3  # requests did wait several steps
        assert num_matches >= len(reqs)  # every request was matched before its admission
        if options.get("max_total_tokens") == 160:
            assert sched.num_retractions > 0


# ---------------------------------------------------------------- penalty counts


class CountSpy:
    """Counts the scheduler's from-scratch penalty counts (`count_tokens` over a whole output),
    and checks every SamplingBatch it builds: the counts row of a request's j-th row (j > 0: a
    jump-forward draft row) equals a recount of its output plus the first j draft tokens."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.num_calls = 0
        self.num_draft_rows_checked = 0

        def spy_count(token_ids: Sequence[int], vocab_size: int, device: Any = "cpu") -> torch.Tensor:
            self.num_calls += 1
            return count_tokens(token_ids, vocab_size, device)

        def spy_batch(reqs: list[Req], vocab_size: int, device: torch.device) -> SamplingBatch:
            batch = sampling_batch(reqs, vocab_size, device)
            rows = [(r, r.jump_forward_ids[:j]) for r in reqs for j in range(len(r.jump_forward_ids) + 1)]
            for i, (req, draft) in enumerate(rows):
                if has_penalties(req.params):
                    assert batch.output_token_counts is not None
                    want = count_tokens(req.output_ids + draft, vocab_size, device)
                    assert torch.equal(batch.output_token_counts[i], want), (req.rid, draft)
                    self.num_draft_rows_checked += bool(draft)
            return batch

        monkeypatch.setattr(scheduler_module, "count_tokens", spy_count)
        monkeypatch.setattr(scheduler_module, "sampling_batch", spy_batch)


def test_penalty_counts_follow_outputs_through_retraction(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = [{**p, "max_new_tokens": 60, "ignore_eos": True} for p in PENALIZED]
    with engine_on(tiny_model_dir, max_total_tokens=4096) as engine:
        want = make_reqs(engine, PROMPTS, params)
        run(engine, want)
    with engine_on(tiny_model_dir, max_total_tokens=160, chunked_prefill_size=32) as engine:
        spy = CountSpy(monkeypatch)
        reqs = make_reqs(engine, PROMPTS, params)
        num_steps = run(engine, reqs)
        assert engine.scheduler.num_retractions > 0
        # counted from the output once per penalized request, not once per step
        num_penalized = sum(has_penalties(r.params) for r in reqs)
        assert spy.num_calls == num_penalized
        assert num_steps > 60
    assert [r.output_ids for r in reqs] == [r.output_ids for r in want]


def test_penalty_counts_with_jump_forward_under_retraction(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drafts are sampled with their earlier draft tokens counted on top of the request's counts;
    kept draft tokens are counted as accepted; the outputs equal those without jump-forward."""
    grammar = [{**p, "max_new_tokens": 80, "regex": REGEX} for p in PENALIZED]
    prompts = [f"list {i}" for i in range(len(grammar))]
    outputs, kept = {}, {}
    for disable in (False, True):
        # no n-gram drafts (by default constrained requests draft): the draft rows are forced tokens
        with engine_on(tiny_model_dir, max_total_tokens=128, chunked_prefill_size=32,
                       disable_jump_forward=disable, speculative_algorithm="NONE") as engine:
            spy = CountSpy(monkeypatch)
            # the first run compiles the grammar and lowers admission's new-token ratio, so the
            # second admits too many requests at once and must retract some
            first = make_reqs(engine, prompts, grammar, "first")
            run(engine, first)
            assert engine.flush_cache()
            second = make_reqs(engine, prompts, grammar, "second")
            run(engine, second)
            assert engine.scheduler.num_retractions > 0
            assert [r.output_ids for r in first] == [r.output_ids for r in second]
            assert spy.num_calls == sum(has_penalties(r.params) for r in first + second)
            outputs[disable], kept[disable] = [r.output_ids for r in second], engine.scheduler.num_jump_forward_tokens
            assert (spy.num_draft_rows_checked > 0) != disable
    assert kept[False] > 0 and kept[True] == 0
    assert outputs[False] == outputs[True]
