"""Fair grammar compiles (issue 19): the outlines backend's fast and slow lanes.

Every compile starts in the fast lane; one still building past the fast lane's deadline moves to
the slow lane, so a new grammar never waits behind slow ones. Each check orders events (a future
done while others are not, a count reached), never elapsed times. Sizes measured here (2 cores):
`[^\\x00]{0,N}` takes ~12 ms per repetition for small N, so N=150 builds in ~2 s, far past a 0.1 s
fast-lane deadline on a machine twice as fast; N=19990 runs for minutes (its memory grows ~17 MB/s
until the 4 GB cap), so only a timeout or a shutdown ends it within a test.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest
from radixlm_testing import accepts_text, wait_until

from radixlm.runtime.constrained import GrammarBackend, GrammarError
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

PATHOLOGICAL = r"[^\x00]{0,19990}"
PATHOLOGICAL_TOO = r"[^\x00]{0,19989}"  # another spec: equal specs would share one compile
MEDIUM = r"[^\x00]{0,150}"
MEDIUM_TOO = r"[^\x00]{0,120}"
CHEAP = "(yes|no|maybe)"
WAIT_S = 60.0  # generous: a bound on hangs, not on speed


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Tokenizer:
    return Tokenizer(default_model_dir)


def assert_reaped(pids: list[int]) -> None:
    """Every pid gone: killed and reaped (a zombie would still have its /proc entry)."""
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), f"children {pids} reaped")


def accepts(future: Future, tokenizer: Tokenizer, text: str) -> bool:
    return accepts_text(future.result(timeout=WAIT_S), tokenizer, text)


def test_a_cheap_grammar_overtakes_two_slow_ones(tokenizer: Tokenizer) -> None:
    """Issue 19's case: with two pathological regexes compiling (the default two fast builders
    both busy), a new cheap grammar compiles while both still run. The timeout is long enough that
    only the shutdown ends them."""
    backend = GrammarBackend(tokenizer, tokenizer.vocab_size, compile_timeout_s=600.0, fast_lane_deadline_s=2.0)
    try:
        slow = [backend.get("regex", PATHOLOGICAL), backend.get("regex", PATHOLOGICAL_TOO)]
        wait_until(lambda: backend.num_compiles_in_flight() == 2, "both slow compiles started")
        cheap = backend.get("regex", CHEAP)
        assert accepts(cheap, tokenizer, "maybe") and not accepts(cheap, tokenizer, "perhaps")
        assert not any(f.done() for f in slow), "a slow compile ended first: the cheap one waited for it"
        # both went on in the slow lane (handed over: the two slow builders), freeing the fast lane
        wait_until(lambda: backend.num_slow_compiles() == 2, "both slow compiles in the slow lane")
        assert backend.num_compiles_in_flight() == 2
        pids = backend.builder_pids()
        assert len(pids) == 3  # two slow builders, and the fast one that built the cheap grammar
    finally:
        backend.shutdown()
    for future in slow:
        with pytest.raises(GrammarError, match="died"):
            future.result(timeout=WAIT_S)
    assert backend.builder_pids() == []
    assert_reaped(pids)
    wait_until(lambda: backend.num_compiles_in_flight() == 0, "no compile counted after the shutdown")


def test_slow_compiles_finish_in_the_slow_lane_first_come_first_served(tokenizer: Tokenizer) -> None:
    """One slow builder: the first compile past the fast deadline is handed over to it, the second
    (the slow lane full) is killed and queued there, builds again after the first, and both give
    correct grammars."""
    backend = GrammarBackend(tokenizer, tokenizer.vocab_size, num_slow_workers=1, fast_lane_deadline_s=0.1)
    try:
        futures = [backend.get("regex", MEDIUM), backend.get("regex", MEDIUM_TOO)]
        wait_until(lambda: backend.num_slow_compiles() == 2, "both in the slow lane (one building, one queued)")
        assert backend.num_compiles_in_flight() == 2
        assert accepts(futures[0], tokenizer, "x" * 150) and not accepts(futures[0], tokenizer, "x" * 151)
        assert accepts(futures[1], tokenizer, "") and not accepts(futures[1], tokenizer, "x" * 121)
        wait_until(lambda: backend.num_compiles_in_flight() == 0, "both compiles counted out")
        assert len(backend.builder_pids()) <= 3  # two fast builders at most, one slow one
    finally:
        backend.shutdown()


def test_a_slow_lane_timeout_is_a_grammar_error(tokenizer: Tokenizer) -> None:
    backend = GrammarBackend(tokenizer, tokenizer.vocab_size, compile_timeout_s=1.5, fast_lane_deadline_s=0.1)
    try:
        future = backend.get("regex", PATHOLOGICAL)
        wait_until(lambda: backend.num_slow_compiles() == 1, "moved to the slow lane")
        [child] = backend.builder_pids()  # handed over: the fast lane has no child left
        with pytest.raises(GrammarError, match="longer than 1.5 s"):
            future.result(timeout=WAIT_S)
        assert_reaped([child])
        assert accepts(backend.get("regex", CHEAP), tokenizer, "no")
    finally:
        backend.shutdown()
    assert backend.builder_pids() == []


def test_shutdown_fails_running_and_queued_slow_compiles(tokenizer: Tokenizer) -> None:
    backend = GrammarBackend(tokenizer, tokenizer.vocab_size, num_slow_workers=1, fast_lane_deadline_s=0.1)
    try:
        futures = [backend.get("regex", PATHOLOGICAL), backend.get("regex", PATHOLOGICAL_TOO)]
        wait_until(lambda: backend.num_slow_compiles() == 2, "one building in the slow lane, one queued")
        pids = backend.builder_pids()
    finally:
        backend.shutdown()
    messages = []
    for future in futures:
        with pytest.raises(GrammarError) as failure:
            future.result(timeout=WAIT_S)
        messages.append(str(failure.value))
    assert sum("died" in m for m in messages) == 1 and sum("shut down" in m for m in messages) == 1, messages
    assert backend.builder_pids() == []
    assert_reaped(pids)
