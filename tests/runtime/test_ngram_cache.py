"""The shared n-gram cache of earlier requests' outputs (`--speculative-ngram-capacity`): its
proposals against a brute-force search over what it holds, its token bound (oldest dropped first)
with the index kept equal to a rebuilt one after every change, and the drafter's use of it (only
when the request's own text has no match; fed by finished requests, not retracted ones; emptied
by flush)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixlm.runtime.config.speculative_config import SpeculativeConfig
from radixlm.runtime.scheduler.ngram_cache import NgramCache
from radixlm.runtime.scheduler.ngram_draft import TokenSeq
from radixlm.runtime.scheduler.req import FinishReason, Req
from radixlm.runtime.scheduler.speculative import Drafter


def _brute_force(stored: list[list[int]], context: list[int], min_window: int, max_window: int,
                 min_agreement: int, max_tokens: int) -> list[int]:
    """The continuation of the place, over every stored sequence, whose tokens before it agree
    with the context's end the longest (>= min_agreement, counted up to max_window); the most
    recent among equals (the later sequence, then the later place); none unless at least half
    of the places that agree that far go on with its first token."""
    best, best_len, firsts = [], 0, []
    for tokens in stored:  # oldest first: a later equal candidate wins
        for nxt in range(min_window, len(tokens)):
            length = 0
            while length < min(max_window, len(context)) and nxt - length - 1 >= 0 \
                    and tokens[nxt - length - 1] == context[-length - 1]:
                length += 1
            if length >= max(min_agreement, min_window):
                firsts.append(tokens[nxt])
                if length >= best_len:
                    best, best_len = tokens[nxt : nxt + max_tokens], length
    return best if best and 2 * firsts.count(best[0]) >= len(firsts) else []


sequences = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=25), min_size=1, max_size=8)


@given(sequences, st.lists(st.integers(0, 3), min_size=0, max_size=15), st.integers(1, 3), st.integers(0, 3),
       st.integers(0, 5), st.integers(5, 60))
def test_proposals_match_a_brute_force_search_within_the_bound(outputs: list[list[int]], context: list[int],
                                                               min_window: int, extra: int, agreement: int,
                                                               capacity: int) -> None:
    """After every add: at most `capacity` tokens held, the newest sequences kept (whole, but an
    over-long one's tail), the index equal to a rebuilt one, and every proposal equal to a full
    search over the sequences held. Sequences store the prompt's last max_window tokens too."""
    max_window = min_window + extra
    cache = NgramCache(capacity, min_window, max_window, min_window + agreement)
    prompt = [7, 8, 9, 7, 8, 9, 7, 8, 9, 7, 8, 9, 7, 8, 9][: max_window + 1]
    kept: list[list[int]] = []
    for output in outputs:
        cache.add(prompt, output)
        stored = [*prompt[-max_window:], *output][-capacity:]
        if len(stored) > min_window:
            kept.append(stored)
        while sum(map(len, kept)) > capacity:
            kept.pop(0)
        cache.check_integrity()
        assert cache.num_tokens == sum(map(len, kept)) <= capacity and len(cache) == len(kept)
        for tail in ([], context[-2:]):
            got = cache.propose(TokenSeq(context, []), tail, 6)
            want = _brute_force(kept, [*context, *tail], min_window, max_window, cache.min_agreement, 6)
            assert got == want, (kept, context, tail)


def test_the_oldest_outputs_are_dropped_first() -> None:
    cache = NgramCache(capacity=20, min_window=2, max_window=4, min_agreement=2)
    cache.add([], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    cache.add([], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20])
    assert cache.propose(TokenSeq([1, 2], []), [], 3) == [3, 4, 5]
    cache.add([], [21, 22, 23, 24, 25])  # 25 tokens > 20: the first output goes
    cache.check_integrity()
    assert cache.num_tokens == 15 and cache.propose(TokenSeq([1, 2], []), [], 3) == []
    assert cache.propose(TokenSeq([11, 12], []), [], 3) == [13, 14, 15]
    cache.add([], list(range(100, 150)))  # longer than the capacity: its last 20 tokens, alone
    assert cache.num_tokens == 20 and cache.propose(TokenSeq([130, 131], []), [], 2) == [132, 133]
    assert cache.propose(TokenSeq([100, 101], []), [], 2) == []
    cache.clear()
    cache.check_integrity()
    assert len(cache) == 0 and cache.propose(TokenSeq([130, 131], []), [], 2) == []
    with pytest.raises(ValueError, match="capacity"):
        NgramCache(0, 1, 2, 1)


def test_the_longest_agreement_wins_then_the_most_recent() -> None:
    cache = NgramCache(capacity=100, min_window=2, max_window=6, min_agreement=3)
    cache.add([], [9, 1, 2, 3, 50])  # agrees with ...9, 1, 2, 3 over 4 tokens
    cache.add([], [8, 1, 2, 3, 60])  # over 3
    cache.add([], [7, 7, 2, 3, 70])  # over 2: under min_agreement
    assert cache.propose(TokenSeq([4, 9, 1, 2], []), [3], 1) == [50]  # the tail takes part in the match
    assert cache.propose(TokenSeq([4, 5, 1, 2, 3], []), [], 1) == [60]  # 3 each: the most recent
    assert cache.propose(TokenSeq([4, 5, 6, 2, 3], []), [], 1) == []  # 2 < min_agreement


def test_no_proposal_where_earlier_outputs_went_on_differently() -> None:
    """After a schema's key every earlier request wrote its own value: no draft, unless most of
    the places agreeing with the context go on alike."""
    key = [11, 12, 13, 14, 15, 16]
    cache = NgramCache(capacity=100, min_window=2, max_window=8, min_agreement=6)
    for value in (21, 22, 23):
        cache.add([], [*key, value, 30])
    assert cache.propose(TokenSeq(key, []), [], 2) == []  # 23 (the most recent) has 1 vote of 3
    cache.add([], [*key, 23, 31])
    assert cache.propose(TokenSeq(key, []), [], 2) == [23, 31]  # 2 of 4
    assert cache.propose(TokenSeq([*key, 21], []), [], 1) == [30]  # one place agrees further


# ---------------------------------------------------------------- the drafter


def _req(rid: str, prompt: list[int], output: list[int]) -> Req:
    from radixlm.runtime.sampling.sampling_params import SamplingParams

    req = Req(rid, prompt, SamplingParams(temperature=0.0, max_new_tokens=None), frozenset({0}))
    req.output_ids = list(output)
    return req


def _finish(req: Req) -> Req:
    req.finish_reason = FinishReason("stop", None)
    return req


CFG = SpeculativeConfig(num_draft_tokens=4, ngram_min_match_window_size=2, ngram_max_match_window_size=8)


def test_the_drafter_falls_back_on_earlier_outputs() -> None:
    """A request whose own text has no match drafts what followed the same context in an earlier
    request's output; one whose own text matches drafts from it; a retracted request's output
    is not stored (it comes back), a finished one's is; flush forgets."""
    import radixlm.runtime.scheduler.speculative as spec

    drafter = Drafter(CFG)
    assert drafter.ngram_cache is not None and drafter.ngram_cache.min_agreement == spec.CACHE_MIN_AGREEMENT
    shape = [101, 102, 103, 104, 105, 106]  # e.g. a key and its value's format
    earlier = _req("a", [1, 2, 3], [*shape, 107, 108, 109, 110])
    retracted = _req("r", [1, 2, 3], [*shape, 200, 201, 202, 203])
    drafter.release(retracted)  # not finished: retracted
    assert len(drafter.ngram_cache) == 0
    drafter.release(_finish(earlier))
    assert len(drafter.ngram_cache) == 1
    req = _req("b", [4, 5, 6], shape)  # nothing of its own to copy
    assert drafter.draft(req, [], 100) == [107, 108, 109, 110] and req.ngram_source == -1
    own = _req("c", [4, *shape, 90, 91, 92, 93, 5], shape)  # its prompt holds the shape: its own text wins
    assert drafter.draft(own, [], 100) == [90, 91, 92, 93] and own.ngram_source == 7
    drafter.flush()
    assert drafter.draft(_req("d", [4, 5, 6], shape), [], 100) == []
    assert Drafter(replace(CFG, ngram_capacity=0)).ngram_cache is None
    assert Drafter(replace(CFG, algorithm="STANDALONE", draft_model_path="x"), _NoModel()).ngram_cache is None  # type: ignore[arg-type]


class _NoModel:
    """Stands for a draft model where only the drafter's construction is checked."""

    def release(self, rid: str) -> None: ...


def test_cache_drafts_back_off_on_an_allowance_of_their_own() -> None:
    """A cache draft with no token accepted halves the cache allowance, not the own text's; at
    0 no cache tokens are drafted until one would have hit; a full hit doubles it; no copy
    pointer is kept for a cache source (the next draft is a fresh lookup)."""
    drafter = Drafter(CFG)
    shape = [101, 102, 103, 104, 105, 106]
    drafter.release(_finish(_req("a", [1, 2, 3], [*shape, 107, 108, 109, 110, 111])))
    req = _req("b", [4, 5, 6], shape)
    for want in (2, 1, 0):
        draft = drafter.draft(req, [], 100)
        assert req.ngram_from_cache and draft == [107, 108, 109, 110][: 2 * want or 1]
        drafter.record_verify(req, draft, [300])  # a miss (not appended: the same context again)
        assert req.ngram_cache_allowance == want and req.ngram_allowance == CFG.num_draft_tokens
    assert drafter.draft(req, [], 100) == [] and req.ngram_shadow == 107
    drafter.record_verify(req, [], [107])  # it would have hit: drafting again, one token
    req.output_ids.append(107)
    assert req.ngram_cache_allowance == 1 and drafter.draft(req, [], 100) == [108]
    req.output_ids.extend([108, 109])
    drafter.record_verify(req, [108], [108, 109])  # a full hit: the allowance grows
    assert req.ngram_cache_allowance == 2 and req.ngram_copy_next is None
    assert drafter.draft(req, [], 100) == [110, 111]
