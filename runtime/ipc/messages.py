"""Every message the server's processes exchange over zmq, as small frozen dataclasses, with one
encode/decode pair (pickle: all parties are our own processes on one machine, sockets are ipc://
in a private directory).

  TokenizerManager --TokenizedGenerateReq (or several: BatchTokenizedGenerateReq) / AbortReq / FlushCacheReq / GetInfoReq / CacheTreeReq--> Scheduler
  Scheduler --BatchTokenIDOut--> Detokenizer --BatchStrOut--> TokenizerManager
  Scheduler --FlushCacheResp / GetInfoResp / CacheTreeResp--> TokenizerManager

Data crosses each boundary once, in its final form: sampling parameters travel as the frozen
`SamplingParams` validated at the door (pickle rebuilds it without running its checks again), a
grammar also in the form the door lowered it to for the backend (`constrained.lowered`), and outputs
carry only what is new since the request's previous output (token ids, text delta, logprob
entries); the receiver appends. No message grows with the length of the output so far.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.constrained.lowered import LoweredGrammar
from radixlm.runtime.sampling.sampling_params import SamplingParams


@dataclass(frozen=True)
class TokenizedGenerateReq:
    rid: str
    input_ids: tuple[int, ...]
    sampling_params: SamplingParams  # validated once, at the door
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    require_reasoning: bool = False  # with --reasoning-parser: the grammar waits for the reasoning's end
    grammar: LoweredGrammar | None = None  # lowered once, at the door: compiled as is
    cache_salt: str | None = None  # the prefix-cache namespace (radix_cache: namespaces)


@dataclass(frozen=True)
class BatchTokenizedGenerateReq:
    """Requests that arrived together (`server.arrival_gate`), taken by the scheduler before its next step."""

    reqs: tuple[TokenizedGenerateReq, ...]


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
class CacheTreeReq:
    request_id: str
    max_nodes: int  # validated at the door (1..MAX_CACHE_TREE_NODES)


@dataclass(frozen=True)
class CacheTreeResp:
    request_id: str
    state: dict[str, Any]  # the `CacheTree` body of GET /cache_tree (scheduler.cache_tree_state)


TokenLogprob = tuple[float | None, int]  # (logprob, token id); None for the first prompt token
TopLogprobs = tuple[TokenLogprob, ...]  # the top-k at one position, best first


@dataclass(frozen=True)
class LogprobEntries:
    """Logprob entries new since the request's previous output (SGLang's four lists; each list
    only grows at its end, so the receiver appends)."""

    input_token_logprobs: tuple[TokenLogprob, ...] = ()
    output_token_logprobs: tuple[TokenLogprob, ...] = ()
    input_top_logprobs: tuple[TopLogprobs | None, ...] = ()  # None where a position has none
    output_top_logprobs: tuple[TopLogprobs, ...] = ()


LOGPROB_LISTS = ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs")


@dataclass(frozen=True)
class SpecCounts:
    """A request's speculative decoding so far (SGLang's meta_info names): the steps that
    verified its drafts, and its n-gram draft tokens proposed and accepted."""

    spec_verify_ct: int
    spec_num_proposed_drafts: int
    spec_num_correct_drafts: int


@dataclass(frozen=True)
class ReqOutput:
    """One request's progress in one scheduler step: token ids, and text only where the scheduler
    made it already (a request with stop strings or stop regexes: its decoder, which must see the
    text to stop it, is the request's one decoder; the detokenizer passes its text on)."""

    rid: str
    new_token_ids: tuple[int, ...]
    finish_reason: dict[str, Any] | None  # FinishReason.to_dict() once finished
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: LogprobEntries | None = None  # only when asked for
    new_text: str | None = None  # the text delta, trimmed at a stop; None: the detokenizer decodes the ids
    spec: SpecCounts | None = None  # with speculative decoding on


@dataclass(frozen=True)
class DecodeSettings:
    """What the detokenizer needs to turn a request's ids into text (sent with its first output;
    only for requests whose text the scheduler does not make, see `ReqOutput.new_text`)."""

    sampling_params: SamplingParams
    prompt_tail: tuple[int, ...]  # the last prompt ids: context for the first output token's text


@dataclass(frozen=True)
class BatchTokenIDOut:
    outputs: tuple[ReqOutput, ...]
    decode_settings: dict[str, DecodeSettings] = field(default_factory=dict)  # by rid


@dataclass(frozen=True)
class StrOutput:
    """One request's progress as text: what is new since its previous output."""

    rid: str
    new_text: str  # the text delta (whole characters; trimmed at a stop string)
    new_token_ids: tuple[int, ...]
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: LogprobEntries | None = None
    spec: SpecCounts | None = None  # with speculative decoding on


@dataclass(frozen=True)
class BatchStrOut:
    outputs: tuple[StrOutput, ...]


def encode(msg: object) -> bytes:
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> object:
    return pickle.loads(data)
