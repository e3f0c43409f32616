"""A request as the scheduler sees it: token ids, sampling parameters, KV ownership, progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from radixlm.runtime.sampling.sampling_params import SamplingParams

if TYPE_CHECKING:
    from concurrent.futures import Future

    from radixlm.runtime.constrained.grammar import CompiledGrammar, Grammar
    from radixlm.runtime.constrained.lowered import LoweredGrammar
    from radixlm.runtime.detokenizer.detokenizer import IncrementalDecoder
    from radixlm.runtime.mem_cache.radix_cache import TreeNode
    from radixlm.runtime.scheduler.ngram_draft import NgramIndex
    from radixlm.runtime.scheduler.token_matcher import TokenSequenceMatcher


@dataclass(frozen=True)
class FinishReason:
    type: str  # "stop" | "length" | "abort"
    matched: int | str | None = None  # the EOS / stop token id or stop string that matched
    message: str | None = None  # for "abort"
    # "length" of a constrained request whose budget steered its last tokens to complete the grammar
    closed_by_budget: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "matched": self.matched}
        if self.message is not None:
            out["message"] = self.message
        if self.closed_by_budget:
            out["closed_by_budget"] = True
        return out


@dataclass(frozen=True)
class LogprobOptions:
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no input logprobs; else from this prompt position
    top_logprobs_num: int = 0


@dataclass(eq=False)
class Req:
    """One sequence being generated.

    KV ownership while `req_pool_idx` is set: positions [0, num_cached) of `all_ids` have K/V in
    the pool at the slots in `req_to_token[req_pool_idx]`; of those, [0, cache_prefix_len) are
    the prefix cache's (locked through `last_node`), [cache_prefix_len, num_cached) the request's.
    """

    rid: str
    input_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int]
    logprob: LogprobOptions = field(default_factory=LogprobOptions)
    # makes the text and watches for stop strings (needs a tokenizer); the one decoder of the request
    decoder: IncrementalDecoder | None = None
    output_ids: list[int] = field(default_factory=list)
    # KV state
    req_pool_idx: int | None = None
    num_cached: int = 0
    cache_prefix_len: int = 0
    last_node: TreeNode | None = None
    # filled by the schedule policy / admission before the request is admitted
    prefix_slots: torch.Tensor | None = None
    prefix_node: TreeNode | None = None
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache (meta_info)
    is_retracted: bool = False
    cache_salt: str | None = None  # the prefix cache's namespace for this request (None: the shared one)
    finish_reason: FinishReason | None = None
    # constrained decoding: its grammar as the front door lowered it for the backend (None: the
    # backend lowers the spec from params), the compile in flight, then the request's own FSM state
    lowered_grammar: LoweredGrammar | None = None
    grammar_future: Future[CompiledGrammar] | None = None
    grammar: Grammar | None = None
    # a reasoning request's grammar applies to its answer only: it waits in
    # `grammar_after_reasoning` until `reasoning_end` has seen the end-of-reasoning ids, and
    # applies from the next token on (reasoning_end is None without reasoning, or once it ended)
    reasoning_end: TokenSequenceMatcher | None = None
    grammar_after_reasoning: Grammar | None = None
    budget_steered: bool = False  # the output budget narrowed the mask or replaced a token (closed_by_budget)
    budget_ended: bool = False  # ... and the token it took last was EOS: the budget ended the output
    # the draft (`speculative`): tokens the grammar forces after output_ids[-1] (jump-forward; the
    # first `num_forced_draft`), then with speculative decoding the n-gram proposal; computed
    # with it next step and kept as far as sampling agrees (only running requests have one)
    jump_forward_ids: list[int] = field(default_factory=list)
    num_forced_draft: int = 0
    ngram_index: NgramIndex | None = None  # speculative NGRAM: its prompt + output's n-grams
    # n-gram tokens its next draft may have (speculative.Drafter), from its own prompt + output and
    # from earlier requests' outputs
    ngram_allowance: int | None = None
    ngram_cache_allowance: int | None = None
    ngram_shadow: int | None = None  # with allowance 0: the first token it would have drafted
    ngram_source: int = -1  # where in prompt + output its last n-gram proposal was read from
    ngram_from_cache: bool = False  # ... or it was read from earlier requests' outputs
    # after a step that accepted all its n-gram tokens: where in prompt + output the copy goes on
    # (the next draft reads from there without a lookup), else None
    ngram_copy_next: int | None = None
    # speculative decoding's counts (SGLang's meta_info names): steps that verified this
    # request's draft, and its n-gram draft tokens proposed and accepted (forced ones not counted)
    spec_verify_ct: int = 0
    spec_num_proposed_drafts: int = 0
    spec_num_correct_drafts: int = 0
    # logprobs: lists of (logprob, token_id) and per-position top lists
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    # how many entries of each of the four lists above were reported already (take_new_logprobs)
    num_logprobs_reported: tuple[int, int, int, int] = (0, 0, 0, 0)
    # penalty counts (requests with penalties): float32[V] on the sampling device, how many times
    # each token occurs in output_ids. Counted once from output_ids (by the scheduler, before the
    # first sampling), then kept equal by `append_token`; survives retraction with output_ids.
    output_token_counts: torch.Tensor | None = None

    @property
    def all_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    def token_ids(self, start: int, stop: int) -> list[int]:
        """`all_ids[start:stop]` (0 <= start <= stop), copying only those ids."""
        num_input = len(self.input_ids)
        return self.input_ids[start:stop] + self.output_ids[max(0, start - num_input) : max(0, stop - num_input)]

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def budget(self) -> int | None:
        """Tokens this request may still generate (None: no max_new_tokens)."""
        max_new = self.params.max_new_tokens
        return None if max_new is None else max_new - len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def take_new_text(self) -> str | None:
        """The text its decoder made since the previous call (None: no decoder, the detokenizer
        makes the text). Once finished, the held-back tail is released with it: the decoder
        never saw the EOS / stop token id, so its text is not part of the output."""
        if self.decoder is None:
            return None
        if self.is_finished:
            self.decoder.finish()
        return self.decoder.pop_new_text()

    def append_token(self, token: int, context_len: int) -> None:
        """Record a sampled token and set finish_reason if a stop condition now holds."""
        self.output_ids.append(token)
        if self.output_token_counts is not None:
            self.output_token_counts[token] += 1
        num_out = len(self.output_ids)
        may_stop = num_out >= self.params.min_new_tokens
        if may_stop and (
            (not self.params.ignore_eos and token in self.eos_token_ids) or token in self.params.stop_token_ids
        ):
            self.finish_reason = FinishReason("stop", token)  # the token's text is not output
            return
        if self.decoder is not None:
            self.decoder.push([token])
            if may_stop and self.decoder.matched_stop is not None:
                self.finish_reason = FinishReason("stop", self.decoder.matched_stop)
                return
        max_new = self.params.max_new_tokens
        if (max_new is not None and num_out >= max_new) or self.seq_len >= context_len:
            self.finish_reason = FinishReason("length", num_out)
