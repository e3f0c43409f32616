"""A matcher that finds a token-id sequence in a stream of generated ids, one id at a time: how
the scheduler sees a reasoning model's end-of-reasoning marker (`</think>` is several tokens in
SmolLM2's vocabulary: `</`, `think`, `>`), after which a request's grammar applies."""

from __future__ import annotations

from collections.abc import Sequence


class TokenSequenceMatcher:
    """The first occurrence of `target` in the ids given to `advance` (Knuth-Morris-Pratt: O(1)
    amortized per id, overlapping starts handled, `a a b` is found in `a a a b`)."""

    def __init__(self, target: Sequence[int]):
        if not target:
            raise ValueError("the token sequence to match is empty")
        self.target = tuple(target)
        # fallback[i]: the longest proper prefix of target[:i + 1] that is also its suffix
        self._fallback = [0] * len(self.target)
        size = 0
        for i in range(1, len(self.target)):
            while size and self.target[i] != self.target[size]:
                size = self._fallback[size - 1]
            if self.target[i] == self.target[size]:
                size += 1
            self._fallback[i] = size
        self.num_matched = 0  # ids of target matched by the end of the ids so far
        self.is_found = False

    def advance(self, token: int) -> bool:
        """Takes the next id; True when it completes the first occurrence of the target (once)."""
        if self.is_found:
            return False
        size = self.num_matched
        while size and token != self.target[size]:
            size = self._fallback[size - 1]
        if token == self.target[size]:
            size += 1
        self.num_matched = size
        if size == len(self.target):
            self.is_found = True
        return self.is_found
