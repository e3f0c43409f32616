"""Prompt-lookup drafts (`--speculative-algorithm NGRAM`): a request's next tokens guessed by
finding the text it just produced earlier in its own prompt + output, and proposing what followed.

Extraction copies: a name, a date or a quote in the JSON is a span of the passage, so once the
first tokens of a span are out, the rest of it is in the prompt. `NgramIndex` maps every n-gram of
`min_window` tokens of a sequence to the positions right after it (oldest first); `propose` looks
up the sequence's last `min_window` tokens, prefers the candidate whose earlier context agrees
with the sequence's end the longest (up to `max_window` tokens; among equals, the most recent),
and proposes the tokens that followed it.

Incremental: the index remembers how many positions it has seen and indexes only the new ones at
the next `propose` (a prompt of thousands of tokens is indexed once, at the request's first
draft), so per step it costs O(new tokens + candidates looked at), never a rescan.

The index holds no request: the caller passes the sequence as a `TokenSeq` (the request's
prompt and output lists, read in place) and a `tail` of tokens already drafted this step (the
grammar's forced tokens), which the match may use but which are not indexed (they are not output).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

# Candidates of one lookup judged at most (the most recent ones): a frequent n-gram (a quote
# character with min_window 1) occurs hundreds of times in a long prompt.
MAX_CANDIDATES = 64


@dataclass(frozen=True)
class TokenSeq:
    """A request's prompt + output read in place (the lists grow; nothing is copied)."""

    input_ids: Sequence[int]
    output_ids: Sequence[int]

    def __len__(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    def __getitem__(self, i: int) -> int:
        num_input = len(self.input_ids)
        return self.input_ids[i] if i < num_input else self.output_ids[i - num_input]


class NgramIndex:
    """One request's n-gram index (see the module docstring). `min_window` >= 1 tokens must match
    for a proposal; candidates are ranked by agreement over up to `max_window` tokens."""

    def __init__(self, min_window: int, max_window: int):
        if not 1 <= min_window <= max_window:
            raise ValueError(f"need 1 <= min_window <= max_window, got {min_window}, {max_window}")
        self.min_window = min_window
        self.max_window = max_window
        # n-gram (its min_window tokens) -> the positions that follow an occurrence, ascending
        self._ngram_to_next: dict[tuple[int, ...], list[int]] = {}
        # occurrences ending before this position are indexed (each needs a token after it)
        self._num_indexed = min_window

    def _catch_up(self, seq: TokenSeq) -> None:
        """Index every occurrence followed by a token of `seq` (those not indexed yet)."""
        n, index = self.min_window, self._ngram_to_next
        for nxt in range(self._num_indexed, len(seq)):
            key = tuple(seq[i] for i in range(nxt - n, nxt))
            positions = index.get(key)
            if positions is None:
                index[key] = [nxt]
            else:
                positions.append(nxt)
        self._num_indexed = max(self._num_indexed, len(seq))

    def propose(self, seq: TokenSeq, tail: Sequence[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens that followed the best earlier match of the end of
        seq + tail (empty when none matches `min_window` tokens). The continuation is read from
        seq + tail, so a match inside a repeating run continues the run."""
        if max_tokens <= 0:
            return []
        start = self.match(seq, tail)
        return [] if start < 0 else continuation(seq, tail, start, max_tokens)

    def match(self, seq: TokenSeq, tail: Sequence[int]) -> int:
        """The position in seq of the token after the best earlier match of the end of
        seq + tail (its proposal starts there), or -1 when none matches `min_window` tokens."""
        self._catch_up(seq)
        context = context_tail(seq, tail, self.max_window)
        n = self.min_window
        if len(seq) + len(tail) < n + 1:
            return -1
        positions = self._ngram_to_next.get(tuple(context[len(context) - n :]))
        if not positions:
            return -1
        # every candidate precedes the suffix (nxt < len(seq)): its context is read from seq alone
        best = best_match(((seq, nxt) for nxt in reversed(positions[-MAX_CANDIDATES:])), context, n,
                          self.max_window)
        return -1 if best is None else best.next


def context_tail(seq: TokenSeq, tail: Sequence[int], max_window: int) -> list[int]:
    """The last (up to) `max_window` tokens of seq + tail: what a match is judged against."""
    num_seq, end = len(seq), len(seq) + len(tail)
    return [seq[i] if i < num_seq else tail[i - num_seq] for i in range(max(0, end - max_window), end)]


class Match(NamedTuple):
    source: Sequence[int]
    next: int  # the position in source right after the matched tokens: a proposal starts there
    length: int  # tokens before `next` that agree with the context's end (<= max_window)


def best_match(candidates: Iterable[tuple[Sequence[int], int]], context: Sequence[int], min_window: int,
               max_window: int) -> Match | None:
    """Of `candidates` (source, nxt), most recent first, each a place whose `min_window` tokens
    before `nxt` equal the end of `context`: the one whose earlier tokens agree with `context`
    the longest (up to `max_window`; the first among equals), or None when there is none."""
    best = None
    for source, nxt in candidates:
        length = agreement(source, nxt, context, min_window, max_window)
        if best is None or length > best.length:
            best = Match(source, nxt, length)
            if length == max_window:
                break
    return best


def agreement(source: Sequence[int], nxt: int, context: Sequence[int], min_window: int, max_window: int) -> int:
    """How many tokens before `nxt` in source equal the end of `context` (up to `max_window`),
    for a place whose `min_window` tokens before it are known to."""
    length = min_window
    while (length < max_window and length < len(context) and nxt - length - 1 >= 0
           and source[nxt - length - 1] == context[-length - 1]):
        length += 1
    return length


def continuation(seq: TokenSeq, tail: Sequence[int], start: int, max_tokens: int) -> list[int]:
    """Up to `max_tokens` tokens of seq + tail from position `start` (< len(seq) + len(tail))."""
    num_seq = len(seq)
    stop = min(start + max_tokens, num_seq + len(tail))
    return [seq[i] if i < num_seq else tail[i - num_seq] for i in range(start, stop)]
