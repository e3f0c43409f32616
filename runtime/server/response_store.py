"""The stored responses of /v1/responses (`store: true`): a bounded in-memory map, least recently
used first out (`--response-store-size`), read by GET /v1/responses/{id} and by a follow-up's
`previous_response_id`.

A `StoredResponse` keeps what a continuation needs beside the response body: the conversation
as chat messages (the input and the output of every turn so far), and the exact tokens of the
last turn (`TurnTokens`), so that the follow-up's prompt can begin with them and hit the radix
cache instead of re-tokenizing text that may tokenize differently.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.api.protocol import ChatMessage


@dataclass(frozen=True)
class TurnTokens:
    """The last turn as the model saw and wrote it: `prompt_text` tokenized as `prompt_ids`,
    then `output_ids`, whose text is `output_text` (the raw output, reasoning included). The ids
    are int32 arrays (4 bytes a token, not a Python int's 30-odd: the store may hold a thousand
    long prompts); never mutated."""

    prompt_text: str
    prompt_ids: array[int]
    output_ids: array[int]
    output_text: str


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the response object as GET returns it (never mutated)
    messages: tuple[ChatMessage, ...]  # the conversation through this response's output
    turn: TurnTokens | None  # None: the output cannot be continued token for token (e.g. it failed)


class ResponseStore:
    """At most `capacity` responses; storing one more drops the least recently used. Used from
    the event loop only (no lock)."""

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._by_id: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_id)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        if self.capacity == 0:
            return
        self._by_id[response_id] = stored
        self._by_id.move_to_end(response_id)
        while len(self._by_id) > self.capacity:
            self._by_id.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        stored = self._by_id.get(response_id)
        if stored is not None:
            self._by_id.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> bool:
        return self._by_id.pop(response_id, None) is not None
