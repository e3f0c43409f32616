"""Budget steering for the context-free backends (xgrammar, llguidance): a short way to finish the
grammar from a matcher's state, and the check that keeps one within the tokens left.

The outlines backend knows every state's exact distance to completion (a token DFA). A CFG
engine's state is a parser stack we cannot enumerate, so we search its matcher instead: from the
current state, append the single byte that most likely heads towards the end (closers first:
`"`, `}`, `]`, `)`, but right after `[` or `{` its closer first; then `,`, digits, letters (`n` and `t`
first: null, true), separators, any other printable ASCII), trying each in that order until the
matcher takes one, until the grammar can end. Both engines only ever accept
prefixes that can still complete, so the search cannot dead-end, but it can go round in circles
in free text (an email's local part takes `a` forever; a cron field's list of numbers
takes `0,` forever): after a unit of up to 4 bytes taken 3 times in a row, it takes the first byte, other
than the unit's next, that changes which of a dozen probe bytes may follow (`\n`, `\t`, `\r`
included: `[^\n]+ "\n"` ends a line) and has not broken a cycle before at the same place (same
signature, as many quotes taken): `.` then `@` in an email. Where no ASCII byte fits (an enum of
non-ASCII words), the shortest token the mask allows is taken. The bytes found are then tokenized
as the tokenizer would (usually far fewer tokens), and that plan is checked against the matcher.

No plan within MAX_PLAN_BYTES means, in practice, a grammar that cannot end from here (a
recursion with no way out, `{"next": {"$ref": "#"}}` required): the front door refuses a request
whose grammar has no plan from its start, and a state with none gets no jump-forward either
(xgrammar's forced-text search runs out of memory on an endless forced text).

The result is *a* completion, not always the shortest (a value that may be a string or a number
becomes `""` where `0` is a byte shorter), so budgets are judged against it: the front door
refuses a request whose `max_new_tokens` cannot hold the plan from the start, and after each
sampled token the scheduler asks `budget_token`: if the grammar could not finish within the
tokens left after it, the token is replaced by the plan's first token. The plan from every state
reached fits by induction, so the output always completes by the last token.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import torch

MAX_PLAN_BYTES = 2048  # a plan longer than this is not searched for (None: no steering)
NEAR_END = 4  # within this many tokens of the budget, plans are searched afresh (they may be shorter)

MAX_RUN = 3  # a unit of bytes taken this many times in a row: a cycle, which the search must leave
MAX_PERIOD = 4  # the longest unit looked for

_LOWER = "ntaeiou" + "".join(c for c in string.ascii_lowercase if c not in "ntaeiou")  # null / true first
_ORDER = [ord(c) for c in '"}]),' + string.digits + _LOWER + string.ascii_uppercase + " -._:@/+[{("]
_ORDER += [b for b in range(0x20, 0x7F) if b not in _ORDER]  # then any other printable ASCII
_CONTROLS = [ord("\n"), ord("\t"), ord("\r")]  # tried only to leave free text
_OPENERS = {ord("["): ord("]"), ord("{"): ord("}")}
_PROBES = [ord(c) for c in '"}],:0aA@.- ']
_QUOTE = ord('"')


class ClosingSearch:
    """A CFG state's plan to complete, cached until the state changes. Subclasses supply the
    matcher primitives `_try` (consume a token if allowed: bool) and `_can_end` (the text so far
    is complete); `_undo(n)` and `_shortest_allowed` default to a `_matcher` with `rollback`, and
    the vocabulary facts come from `compiled.steering`."""

    _plan_cache: tuple[int, list[int] | None] | None = None
    _pending: tuple[int, int, list[int] | None] | None = None
    _version: int = 0

    def _try(self, token_id: int) -> bool:
        raise NotImplementedError

    def _can_end(self) -> bool:
        raise NotImplementedError

    # defaults for a state with an engine matcher `_matcher` (rollback) and `compiled.steering`
    def _undo(self, num_tokens: int) -> None:
        if num_tokens:
            self._matcher.rollback(num_tokens)  # type: ignore[attr-defined]

    @property
    def _steering(self) -> Steering:
        return self.compiled.steering  # type: ignore[attr-defined, no-any-return]

    def _shortest_allowed(self) -> int | None:
        """The allowed token with the fewest bytes (the search's fallback), or None."""
        row = torch.zeros(self._steering.token_lengths.size, dtype=torch.bool)
        self.fill_vocab_mask(row)  # type: ignore[attr-defined]
        return self._steering.shortest(row.numpy())

    def _state_changed(self) -> None:
        self._version += 1

    def closing_ids(self) -> list[int] | None:
        """Tokens that complete the grammar from here ([] when complete), or None when the search
        found none within MAX_PLAN_BYTES; the state does not change."""
        cached = self._plan_cache
        if cached is not None and cached[0] == self._version:
            return cached[1]
        plan = self._search()
        self._plan_cache = (self._version, plan)
        return plan

    def budget_token(self, token_id: int, budget: int) -> int:
        """`token_id` if, once it is taken, the grammar can still complete within `budget - 1`
        tokens (`budget`: tokens left, this one included); else the first token of the plan from
        here (EOS when the text is complete). The state does not change.

        Cheap in the common case: when the token is the plan's first, the rest of the plan
        follows it; else, away from the end, the plan from here is tried behind the token (inside
        a string, or between fields, it still completes); only near the end, or when that fails,
        is a new plan searched for."""
        eos = self._steering.eos_token_id
        if token_id == eos:
            return token_id
        plan = self.closing_ids()
        if plan is None:
            return token_id
        if plan and plan[0] == token_id:
            self._pending = (self._version, token_id, plan[1:])
            return token_id
        if not self._try(token_id):
            return token_id  # not ours to judge: accept_token refuses it
        after = plan if len(plan) + NEAR_END < budget and self._takes(plan) else self._search()
        self._undo(1)
        if after is not None and len(after) <= budget - 1:
            self._pending = (self._version, token_id, after)
            return token_id
        if not plan:
            return eos
        self._pending = (self._version, plan[0], plan[1:])  # the plan's rest, not a new search: it fits
        return plan[0]

    def _took(self, token_id: int) -> None:
        """After the state consumed `token_id`: the plan `budget_token` found behind it is now current."""
        pending, self._pending = self._pending, None
        self._state_changed()
        if pending is not None and pending[0] == self._version - 1 and pending[1] == token_id:
            self._plan_cache = (self._version, pending[2])

    def _search(self) -> list[int] | None:
        byte_ids = self._steering.byte_ids
        path: list[int] = []
        spelled = bytearray()
        order = [b for b in _ORDER if b in byte_ids]
        probes = [byte_ids[b] for b in _PROBES if b in byte_ids]
        controls = [b for b in _CONTROLS if b in byte_ids]  # only to leave free text (a line's end)
        # bytes that broke a run, by where: (probe signature, quotes taken so far)
        breakers: dict[tuple[int, bool, int], set[int]] = {}
        last, quotes = -1, 0
        try:
            while not self._can_end():
                if len(spelled) >= MAX_PLAN_BYTES:
                    return None
                # right after "[" or "{", "]" / "}" (an empty container) before '"' (its first item)
                closer = _OPENERS.get(last)
                candidates = order if closer is None else [closer, *order]
                token_id, byte = None, -1
                period = _cycle_period(spelled)
                if period:  # going round: leave by a byte other than the cycle's next that changes what may follow
                    now = self._signature(probes)
                    used = breakers.setdefault((*now, quotes), set())
                    cycle_next = {spelled[-period]}
                    token_id, byte = self._breaker(byte_ids, candidates + controls, probes, now, used | cycle_next)
                    if token_id is None:  # every breaker was used here before: one of them again
                        token_id, byte = self._breaker(byte_ids, candidates + controls, probes, now, cycle_next)
                    if token_id is not None:
                        used.add(byte)
                if token_id is None:
                    token_id, byte = self._first_byte(byte_ids, candidates)
                if token_id is None:
                    token_id = self._shortest_allowed()
                    if token_id is None or not self._try(token_id):
                        return None
                path.append(token_id)
                if byte >= 0:
                    spelled.append(byte)
                quotes += byte == _QUOTE
                last = byte
        finally:
            self._undo(len(path))
        if len(path) > 1 and len(spelled) == len(path):  # all ASCII: the tokenizer's own encoding
            encoded = self._steering.encode(spelled.decode("ascii"))
            if len(encoded) < len(path) and self._takes(encoded):
                return encoded
        return path

    def _signature(self, probes: list[int]) -> tuple[int, bool]:
        """Which probe bytes the state takes, and whether it can end: a cheap stand-in for the
        parser state, to notice the search going round in circles."""
        bits = 0
        for i, token_id in enumerate(probes):
            if self._try(token_id):
                self._undo(1)
                bits |= 1 << i
        return bits, self._can_end()

    def _first_byte(self, byte_ids: Mapping[int, int], candidates: list[int]) -> tuple[int | None, int]:
        """Takes the first byte of `candidates` the state allows: (token id, byte), or (None, -1)."""
        for byte in candidates:
            token_id = byte_ids[byte]
            if self._try(token_id):
                return token_id, byte
        return None, -1

    def _breaker(self, byte_ids: Mapping[int, int], candidates: list[int], probes: list[int],
                 now: tuple[int, bool], excluded: set[int]) -> tuple[int | None, int]:
        """Takes the first allowed byte of `candidates` (none of `excluded`) after which the probe
        signature differs from `now`: (token id, byte), or (None, -1)."""
        for byte in candidates:
            if byte in excluded:
                continue
            token_id = byte_ids[byte]
            if not self._try(token_id):
                continue
            if self._signature(probes) != now:
                return token_id, byte
            self._undo(1)
        return None, -1

    def _takes(self, ids: list[int]) -> bool:
        """Whether `ids` are allowed in turn and complete the grammar; the state does not change."""
        taken = 0
        for token_id in ids:
            if not self._try(token_id):
                break
            taken += 1
        complete = taken == len(ids) and self._can_end()
        self._undo(taken)
        return complete


def _cycle_period(spelled: bytearray) -> int:
    """The length of the unit (1 to MAX_PERIOD bytes) that `spelled` ends with MAX_RUN times in a
    row, the shortest such; 0 if none."""
    for period in range(1, MAX_PERIOD + 1):
        tail = spelled[-period * MAX_RUN:]
        if len(tail) == period * MAX_RUN and tail == tail[:period] * MAX_RUN:
            return period
    return 0


@dataclass(frozen=True)
class Steering:
    """One vocabulary's facts for the search: byte -> the token spelling exactly that byte
    (byte-level vocabularies have all 256), the plain encoder (no special tokens), EOS, and each
    id's length in bytes (0: special or beyond the tokenizer)."""

    byte_ids: Mapping[int, int]
    encode: Callable[[str], list[int]]
    eos_token_id: int
    token_lengths: np.ndarray

    @classmethod
    def build(cls, id_to_bytes: Mapping[int, bytes], vocab_size: int, encode: Callable[[str], list[int]],
              eos_token_id: int) -> Steering:
        byte_ids: dict[int, int] = {}
        lengths = np.zeros(vocab_size, dtype=np.int32)
        for token_id, data in id_to_bytes.items():
            if token_id < vocab_size:
                lengths[token_id] = len(data)
            if len(data) == 1 and data[0] not in byte_ids:
                byte_ids[data[0]] = token_id
        return cls(byte_ids, encode, eos_token_id, lengths)

    def without_control_bytes(self) -> Steering:
        """The same, never trying the single-byte tokens of U+0000-U+001F."""
        return replace(self, byte_ids={b: i for b, i in self.byte_ids.items() if b >= 0x20})

    def shortest(self, allowed: np.ndarray) -> int | None:
        """The allowed (bool [vocab_size]) token with the fewest bytes, EOS and specials aside."""
        ids = np.flatnonzero(allowed[: self.token_lengths.size] & (self.token_lengths > 0))
        return None if ids.size == 0 else int(ids[np.argmin(self.token_lengths[ids])])
