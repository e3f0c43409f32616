"""Incremental detokenization with stop strings and regex stops: one `IncrementalDecoder` per request.

Contract. Feed the request's output token ids with `push(ids)` as they are sampled, then call
`finish()` once when generation ends for another reason (EOS, length, abort). Each call returns
a text delta that is safe to show the user:

* Whole characters only. A multi-byte UTF-8 character split over several byte-level tokens is
  held back until its last byte arrives; `finish()` decodes an incomplete tail with U+FFFD,
  as `tokenizer.decode` does.
* Same text as one decode. Without a stop hit, the deltas of all calls concatenate to
  `tokenizer.decode(output_ids, skip_special_tokens, spaces_between_special_tokens)` with the
  request's flags (and leading spaces come out as in that one decode).
* Stop strings. The first occurrence of any of `params.stop` in the text (the one that ends
  first; of two ending at the same character, the longer) sets `stopped` and `matched_stop`, and
  the emitted text ends just before it (just after it with `no_stop_trim`); later calls return
  "". Which stop matches and where depends only on the text, not on how it was split into tokens.
  While streaming, the longest suffix of the text that is a proper prefix of some stop string is
  held back; it is released once it can no longer become a stop, or by `finish()`.
* Regex stops (`params.stop_regex`, `sampling/stop_regex.py`). The same, with "the first
  character after which the text contains a match" for "the first occurrence": `matched_stop` is
  the matched text, the match that ends first (the earliest-starting of those) competes with the
  stop strings by where it ends (the longer on a tie, a stop string if both are as long), and
  text from the start of a match still in progress is held back.

Technique ("prefix offset / read offset", as in vLLM and TGI): the ids in
`window[:read_len]` have been decoded into text already accounted for; a push decodes the
window with and without the new ids and takes the difference, so the ids just before the new ones
give the tokenizer the context it needs (leading spaces, special-token spacing). The window then
slides forward, so a push costs O(window + longest stop string), not O(output). The window only
grows while the new text ends in U+FFFD (an unfinished character, or invalid bytes the model
really produced) or is empty (skipped special tokens); the next visible character shrinks it.
Assumes `decode` does not rewrite text across token boundaries (no `clean_up_tokenization_spaces`,
SmolLM2 has it off).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from radixlm.runtime.sampling.stop_regex import StopRegexMatcher

if TYPE_CHECKING:
    from radixlm.runtime.sampling.sampling_params import SamplingParams
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
# At most this many trailing prompt ids are used as the initial decode context.
MAX_PROMPT_CONTEXT_LEN = 8


class IncrementalDecoder:
    """Streams one request's output ids into text deltas; see the module docstring."""

    def __init__(
        self, tokenizer: Tokenizer, params: SamplingParams, prompt_ids_tail: Sequence[int] | None = None
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = params.skip_special_tokens
        self._spaces_between_special_tokens = params.spaces_between_special_tokens
        self._stops = params.stop
        self._no_stop_trim = params.no_stop_trim
        self._stop_prefixes = frozenset(s[:k] for s in self._stops for k in range(1, len(s)))
        self._max_stop_prefix_len = max(map(len, self._stop_prefixes), default=0)
        self._regex = StopRegexMatcher(params.stop_regex) if params.stop_regex else None
        context = list(prompt_ids_tail or ())[-MAX_PROMPT_CONTEXT_LEN:]
        if self._decode(context).endswith(REPLACEMENT_CHAR):
            context = []  # the prompt ends inside a character: no clean boundary to diff against
        # Invariant: window[:read_len] decodes to text already passed on to `_pending`/emitted,
        # and the full decode of (prompt context +) output splits cleanly at window[read_len].
        self._window: list[int] = context
        self._read_len = len(context)
        self._pending = ""  # decoded, not yet emitted: a possible beginning of a stop string
        self._pending_start = 0  # where `_pending` begins in the output text (regex positions)
        self._deltas: list[str] = []
        self._num_deltas_popped = 0  # deltas already returned by pop_new_text
        self.stopped = False
        self.matched_stop: str | None = None

    @property
    def text(self) -> str:
        """All text emitted so far (trimmed at the stop string once `stopped`)."""
        return "".join(self._deltas)

    def pop_new_text(self) -> str:
        """The text emitted since the previous call (for a caller that does not keep the deltas
        `push` and `finish` return, e.g. when the scheduler pushes the ids)."""
        new = "".join(self._deltas[self._num_deltas_popped :])
        self._num_deltas_popped = len(self._deltas)
        return new

    def push(self, new_ids: Sequence[int]) -> str:
        """Add newly sampled ids; return the text that became safe to emit (maybe "")."""
        if self.stopped or not new_ids:
            return ""
        self._window.extend(new_ids)
        return self._emit(self._decode_unread(is_final=False), is_final=False)

    def finish(self) -> str:
        """End of generation: return everything still held back (stop checks still apply)."""
        if self.stopped:
            return ""
        return self._emit(self._decode_unread(is_final=True), is_final=True)

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(
            ids,
            skip_special_tokens=self._skip_special_tokens,
            spaces_between_special_tokens=self._spaces_between_special_tokens,
        )

    def _decode_unread(self, is_final: bool) -> str:
        """Text of window[read_len:], or "" while it may end inside a character (unless final)."""
        if self._read_len == len(self._window):
            return ""
        prefix_text = self._decode(self._window[: self._read_len])
        new_text = self._decode(self._window)
        if not is_final and (len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR)):
            return ""  # incomplete character, or ids that decode to nothing (skipped specials)
        # Slide: the ids just read become the context of the next diff.
        del self._window[: self._read_len]
        self._read_len = len(self._window)
        return new_text[len(prefix_text) :]

    def _emit(self, new_text: str, is_final: bool) -> str:
        """Run the stop checks over held-back + new text; record and return the delta."""
        # No stop can begin in text already emitted: every proper prefix of a stop at the end of
        # the text was held back, so scanning `_pending` is enough.
        pending = self._pending + new_text
        hit = self._first_stop(pending)
        if self._regex is not None:
            found = self._regex.feed(new_text)
            if found is not None:
                start, end = found[0] - self._pending_start, found[1] - self._pending_start
                # the earlier end wins; on a tie the longer match, a stop string if equally long
                if hit is None or (end, -(end - start)) < (hit[0] + len(hit[1]), -len(hit[1])):
                    hit = (start, pending[start:end])
        if hit is not None:
            start, stop = hit
            self.stopped, self.matched_stop = True, stop
            delta, self._pending = pending[: start + len(stop) if self._no_stop_trim else start], ""
        else:
            keep = len(pending) - (0 if is_final else self._held_back_len(pending))
            delta, self._pending = pending[:keep], pending[keep:]
            self._pending_start += keep
        if delta:
            self._deltas.append(delta)
        return delta

    def _first_stop(self, text: str) -> tuple[int, str] | None:
        """(start, stop) of the occurrence that ends first, the longer on a tie; None if none."""
        best: tuple[int, int] | None = None  # (end, start): ends first, then starts first
        best_stop = ""
        for stop in self._stops:
            start = text.find(stop)  # the first start of `stop` is also its first end
            if start >= 0 and (best is None or (start + len(stop), start) < best):
                best, best_stop = (start + len(stop), start), stop
        return None if best is None else (best[1], best_stop)

    def _held_back_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that may still become part of a stop: a proper
        prefix of some stop string, or the text from the start of a regex match in progress."""
        held = 0
        if self._regex is not None and (start := self._regex.pending_start()) is not None:
            held = len(text) - (start - self._pending_start)
        for n in range(min(self._max_stop_prefix_len, len(text)), held, -1):
            if text[-n:] in self._stop_prefixes:
                return n
        return held
