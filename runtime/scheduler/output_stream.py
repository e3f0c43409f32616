"""Which of a step's outputs leave the scheduler process now (SGLang's `--stream-interval`).

Every step gives each running request a token; sending each one on its own costs the server's
other processes a message, a wake-up, a chunk and an SSE write per request and step: CPU that
the next forward needs on a small machine. A request's progress is sent
  - with its first output (the time to first token is never delayed);
  - when it finishes (aborted ones too);
  - while it streams, once `stream_interval` tokens have gathered since its previous message;
  - never in between when it does not stream: its reader takes only the final result.
Held ids are not lost: a request's next message carries every id since its previous one, and
logprob entries (and the text of a request decoded here) stay in the request until taken
(`StepOutput.to_message`), so the detokenizer and the tokenizer manager see the same ids in
the same order, in fewer, larger messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from radixlm.runtime.ipc.messages import ReqOutput
from radixlm.runtime.scheduler.scheduler import StepOutput


@dataclass
class _Held:
    interval: int | None  # tokens that make a message; None: only the final one
    token_ids: list[int] = field(default_factory=list)


class OutputStream:
    def __init__(self, stream_interval: int = 1):
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
        self.stream_interval = stream_interval
        self._is_streaming: dict[str, bool] = {}  # rid -> stream, until the request's first message
        self._held: dict[str, _Held] = {}  # rid -> what it holds, from its first message to its last

    def add(self, rid: str, is_streaming: bool) -> None:
        self._is_streaming[rid] = is_streaming

    @property
    def num_tracked_reqs(self) -> int:
        """Requests it knows of: added and not yet sent, or holding until their last message."""
        return len(self._is_streaming) + len(self._held)

    def take(self, outputs: list[StepOutput]) -> list[ReqOutput]:
        """The messages to send for one step's outputs; the rest is held for later steps."""
        messages = []
        for out in outputs:
            rid, is_finished = out.req.rid, out.req.is_finished
            held = self._held.get(rid)
            if held is None:  # its first output (or a request never added: sent as it comes)
                is_streaming = self._is_streaming.pop(rid, True)
                if not is_finished:
                    self._held[rid] = _Held(self.stream_interval if is_streaming else None)
                messages.append(out.to_message())
                continue
            num_ids = len(held.token_ids) + len(out.token_ids)
            if is_finished or (held.interval is not None and num_ids >= held.interval):
                message = out.to_message()
                if held.token_ids:  # ids held from earlier steps go first (at interval 1 there are none)
                    message = replace(message, new_token_ids=(*held.token_ids, *out.token_ids))
                    held.token_ids = []
                messages.append(message)
            else:
                held.token_ids.extend(out.token_ids)
            if is_finished:
                del self._held[rid]
        return messages
