"""A request as the scheduler sees it: token ids, sampling parameters, KV ownership, progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.sampling_params import SamplingParams


@dataclass(frozen=True)
class FinishReason:
    type: str  # "stop" | "length" | "abort"
    matched: int | str | None = None  # the EOS / stop token id or stop string that matched
    message: str | None = None  # for "abort"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "matched": self.matched}
        if self.message is not None:
            out["message"] = self.message
        return out


@dataclass(eq=False)
class Req:
    """One sequence being generated.

    KV ownership: positions [0, num_cached) of `all_ids` have K/V in the pool, at the slots
    recorded in `req_to_token[req_pool_idx]`. Valid while `req_pool_idx` is not None.
    """

    rid: str
    input_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    req_pool_idx: int | None = None
    num_cached: int = 0
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache (meta_info)
    finish_reason: FinishReason | None = None

    @property
    def all_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def check_finished(self, context_len: int) -> None:
        """After a token was appended: set finish_reason if a stop condition holds."""
        if not self.output_ids:
            return
        last = self.output_ids[-1]
        num_out = len(self.output_ids)
        if num_out >= self.params.min_new_tokens:
            if not self.params.ignore_eos and last in self.eos_token_ids:
                self.finish_reason = FinishReason("stop", last)
                return
            if last in self.params.stop_token_ids:
                self.finish_reason = FinishReason("stop", last)
                return
        max_new = self.params.max_new_tokens
        if (max_new is not None and num_out >= max_new) or self.seq_len >= context_len:
            self.finish_reason = FinishReason("length", num_out)
