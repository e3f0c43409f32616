"""Drafts shared across requests (`--speculative-algorithm NGRAM`, `--speculative-ngram-capacity`):
a bounded store of earlier requests' outputs, indexed by n-gram, that a request consults when its
own prompt + output (`ngram_draft.NgramIndex`) has nothing to propose.

Extraction pipelines send many requests of one schema: what a request makes up rather than
copies (a closing `",` and the next key, a date's or an amount's format, a value the model
invents the same way each time) is often in an earlier request's output. The store holds each
finished request's output with the `max_window` prompt tokens before it (the context its first
tokens follow), oldest dropped first once it holds more than `capacity` tokens.

`NgramCache` maps every n-gram of `min_window` tokens of a stored sequence to the places right
after it, oldest first; `propose` looks up the request's last `min_window` tokens, keeps the
places whose earlier tokens agree with the request's end over `min_agreement` tokens or more,
and ranks them as `NgramIndex` does (longest agreement, up to `max_window` tokens; among equals,
the most recent); it proposes nothing unless at least half of them go on with the best one's
next token (requests of one schema agree on the key before a value, not on the value). Adding a sequence indexes it once (O(its length)); dropping one
removes its entries, which are the oldest of their n-grams (O(its length)); a proposal costs
O(candidates looked at). The cache holds tokens only, no request: a proposal is a copy, so a
sequence dropped after it was made changes nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import islice

from radixlm.runtime.scheduler.ngram_draft import (
    MAX_CANDIDATES,
    Match,
    TokenSeq,
    agreement,
    context_tail,
)


class NgramCache:
    """Earlier requests' outputs for drafting (see the module docstring); one per scheduler."""

    def __init__(self, capacity: int, min_window: int, max_window: int, min_agreement: int):
        if capacity < 1 or not 1 <= min_window <= max_window:
            raise ValueError(f"need capacity >= 1 and 1 <= min_window <= max_window, got {capacity}, "
                             f"{min_window}, {max_window}")
        self.capacity = capacity  # tokens held at most, over every stored sequence
        self.min_window = min_window
        self.max_window = max_window
        # a proposal's context must agree over this many tokens (within [min_window, max_window])
        self.min_agreement = min(max(min_window, min_agreement), max_window)
        self._seq_no_to_tokens: dict[int, list[int]] = {}  # oldest first (dicts keep insertion order)
        self._next_seq_no = 0
        self.num_tokens = 0
        # n-gram (min_window tokens) -> (seq_no, the position after an occurrence), oldest first
        self._ngram_to_places: dict[tuple[int, ...], deque[tuple[int, int]]] = {}

    def clear(self) -> None:
        self._seq_no_to_tokens.clear()
        self._ngram_to_places.clear()
        self.num_tokens = 0

    def __len__(self) -> int:
        return len(self._seq_no_to_tokens)

    def add(self, input_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        """Store a finished request's output (after its prompt's last max_window tokens), then
        drop the oldest sequences while more than `capacity` tokens are held. An output longer
        than the capacity keeps its last `capacity` tokens."""
        tokens = [*input_ids[max(0, len(input_ids) - self.max_window):], *output_ids][-self.capacity:]
        if len(tokens) <= self.min_window:  # no n-gram followed by a token
            return
        seq_no, n = self._next_seq_no, self.min_window
        self._next_seq_no += 1
        self._seq_no_to_tokens[seq_no] = tokens
        self.num_tokens += len(tokens)
        for nxt in range(n, len(tokens)):
            self._ngram_to_places.setdefault(tuple(tokens[nxt - n : nxt]), deque()).append((seq_no, nxt))
        while self.num_tokens > self.capacity:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        seq_no = next(iter(self._seq_no_to_tokens))
        tokens = self._seq_no_to_tokens.pop(seq_no)
        self.num_tokens -= len(tokens)
        n = self.min_window
        for nxt in range(n, len(tokens)):
            key = tuple(tokens[nxt - n : nxt])
            places = self._ngram_to_places[key]
            places.popleft()  # the oldest place of every n-gram of the oldest sequence is its own
            if not places:
                del self._ngram_to_places[key]

    def propose(self, seq: TokenSeq, tail: Sequence[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens that followed the best stored match of the end of seq + tail
        (see the module docstring; empty when none qualifies)."""
        context = context_tail(seq, tail, self.max_window)
        if max_tokens <= 0 or len(context) < self.min_window:
            return []
        places = self._ngram_to_places.get(tuple(context[len(context) - self.min_window :]))
        if not places:
            return []
        n, w = self.min_window, self.max_window
        scored = (Match(tokens, nxt, agreement(tokens, nxt, context, n, w)) for tokens, nxt in
                  ((self._seq_no_to_tokens[s], nxt) for s, nxt in islice(reversed(places), MAX_CANDIDATES)))
        agreeing = [m for m in scored if m.length >= self.min_agreement]  # most recent first
        if not agreeing:
            return []
        best = max(agreeing, key=lambda m: m.length)  # the first of the longest: the most recent
        # the places agreeing with the context must mostly go on alike: after a key of the schema
        # each earlier request went on with its own value
        first = best.source[best.next]
        if 2 * sum(m.source[m.next] == first for m in agreeing) < len(agreeing):
            return []
        return list(best.source[best.next : best.next + max_tokens])

    def check_integrity(self) -> None:
        """The index holds exactly the stored sequences' n-grams, oldest first; the count is right."""
        assert self.num_tokens == sum(len(t) for t in self._seq_no_to_tokens.values()) <= self.capacity
        want: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        n = self.min_window
        for seq_no, tokens in self._seq_no_to_tokens.items():
            for nxt in range(n, len(tokens)):
                want.setdefault(tuple(tokens[nxt - n : nxt]), []).append((seq_no, nxt))
        assert {k: list(v) for k, v in self._ngram_to_places.items()} == want
