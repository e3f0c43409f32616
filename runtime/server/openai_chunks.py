"""What goes into OpenAI stream chunks beside the text: the usage of
`stream_options.continuous_usage_stats`, and a `ToolCallStream` delta in `delta.tool_calls` form.
Shared by the streaming routes (chat completions, completions)."""

from __future__ import annotations

from typing import Any

from radixlm.formats.tool_stream import ToolCallDelta
from radixlm.runtime.api.protocol import StreamOptions


class UsageTracker:
    """`stream_options.continuous_usage_stats` (vLLM's, SGLang's): every chunk of a choice
    carries that choice's usage so far (its prompt's tokens, the completion tokens so far, their
    sum), from the latest output of that choice; nothing when it is off."""

    def __init__(self, options: StreamOptions | None, num_choices: int):
        self.is_on = options is not None and options.continuous_usage_stats
        self._latest: list[dict[str, Any] | None] = [None] * num_choices

    def update(self, index: int, meta: dict[str, Any]) -> None:
        if self.is_on:
            prompt, completion = meta["prompt_tokens"], meta["completion_tokens"]
            self._latest[index] = {"prompt_tokens": prompt, "completion_tokens": completion,
                                   "total_tokens": prompt + completion,
                                   "prompt_tokens_details": {"cached_tokens": meta["cached_tokens"]}}

    def of_chunk(self, index: int) -> dict[str, Any]:
        """The `usage` member of a chunk of choice `index` ({} if off or not yet known)."""
        latest = self._latest[index]
        return {"usage": latest} if latest is not None else {}


def tool_call_delta(delta: ToolCallDelta) -> dict[str, Any]:
    """A ToolCallStream delta as a chat chunk's `delta`: content, a call's first part (index,
    id, type, name, empty arguments), or an arguments fragment."""
    if delta.index < 0:
        return {"content": delta.content}
    if delta.name is not None:
        return {"tool_calls": [{"index": delta.index, "id": delta.id, "type": "function",
                                "function": {"name": delta.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": delta.index, "function": {"arguments": delta.arguments}}]}
