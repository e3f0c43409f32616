"""Every message the server's processes exchange over zmq, as small frozen dataclasses, with one
encode/decode pair (pickle: all parties are our own processes on one machine, sockets are ipc://
in a private directory).

  TokenizerManager --TokenizedGenerateReq / AbortReq / FlushCacheReq / GetInfoReq--> Scheduler
  Scheduler --BatchTokenIDOut--> Detokenizer --BatchStrOut--> TokenizerManager
  Scheduler --FlushCacheResp / GetInfoResp (via the detokenizer, which forwards them)--> TokenizerManager
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TokenizedGenerateReq:
    rid: str
    input_ids: tuple[int, ...]
    sampling_params: dict[str, Any]  # validated SamplingParams.to_dict()
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False


@dataclass(frozen=True)
class AbortReq:
    rid: str


@dataclass(frozen=True)
class FlushCacheReq:
    request_id: str


@dataclass(frozen=True)
class FlushCacheResp:
    request_id: str
    success: bool


@dataclass(frozen=True)
class GetInfoReq:
    request_id: str


@dataclass(frozen=True)
class GetInfoResp:
    request_id: str
    info: dict[str, Any]


@dataclass(frozen=True)
class ReqOutput:
    """One request's progress in one scheduler step (token ids, not text)."""

    rid: str
    new_token_ids: tuple[int, ...]
    finish_reason: dict[str, Any] | None  # FinishReason.to_dict() once finished
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    # logprob lists as built so far (only when asked for; sent whole when finished or streaming)
    logprobs: dict[str, Any] | None = None


@dataclass(frozen=True)
class BatchTokenIDOut:
    outputs: tuple[ReqOutput, ...]
    # per-rid detokenization settings, sent with a request's first output
    decode_settings: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class StrOutput:
    rid: str
    text: str  # all text so far (cumulative; trimmed at a stop string)
    output_ids: tuple[int, ...]  # all output ids so far
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: dict[str, Any] | None = None


@dataclass(frozen=True)
class BatchStrOut:
    outputs: tuple[StrOutput, ...]


def encode(msg: object) -> bytes:
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> object:
    return pickle.loads(data)
