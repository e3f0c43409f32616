"""The scheduler: a plain object (`add_request`, `abort`, `step()`) that batches requests over the
model runner. No I/O: the Engine drives it in-process, the server wraps it in a process.

One step (iteration-level continuous batching):
  1. the running requests each need one KV slot for their decode; if memory is short, evict
     cache, then retract the newest requests to the waiting queue (their tokens are kept, their
     K/V goes to the cache, so resuming recomputes only what was evicted meanwhile);
  2. admission (`admission.plan_extends`) adds new requests' extends, in policy order, within the
     chunked-prefill token budget and the KV memory estimate; a long prompt is split into chunks;
  3. one forward runs the extends and the decodes together, then one token is sampled for every
     request whose prompt is complete;
  4. newly prefilled tokens go to the radix cache at once (so requests sharing a new prefix that
     were held back reuse it next step); finished requests leave at once, their tokens cached.

Jump-forward (constrained requests; `constrained.jump_forward`): after a request samples a token,
its grammar may force the next text; the tokens spelling it (`req.jump_forward_ids`, the draft)
join that token in the next forward, which then computes one logits row per draft position. Each
row is sampled under the grammar mask of its position; the draft is kept as far as the samples
agree with it, and the first disagreeing sample is the request's next token, so the output is
what token-by-token decoding gives. The K/V of the rejected draft tokens is freed at once.
Speculative decoding (`speculative`, `--speculative-algorithm NGRAM`) extends the same draft
with prompt-lookup tokens, cut where the grammar refuses; it is verified the same way.

Reasoning (`require_reasoning` with --reasoning-parser): a constrained request's grammar is held
(`req.grammar_after_reasoning`) while `req.reasoning_end` watches its sampled ids for the
end-of-reasoning marker's ids; from the token after the marker the grammar applies, as SGLang's.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent import futures
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from radixlm.runtime.config.speculative_config import SpeculativeConfig
from radixlm.runtime.constrained.closing import MAX_PLAN_BYTES
from radixlm.runtime.constrained.grammar import GrammarBackend
from radixlm.runtime.constrained.unique_items import UniqueItemsDeadEnd, wrap
from radixlm.runtime.constrained.vocabulary import get_grammar_vocabulary
from radixlm.runtime.ipc.messages import ReqOutput, SpecCounts
from radixlm.runtime.mem_cache.radix_cache import BasePrefixCache, NoopRadixCache, RadixCache
from radixlm.runtime.model.forward_batch import ForwardBatch
from radixlm.runtime.model.model_runner import ModelRunner
from radixlm.runtime.sampling.sampler import SampleOutput, SamplingBatch, count_tokens, has_penalties, sample
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.admission import AdmissionPlan, plan_extends
from radixlm.runtime.scheduler.cache_bridge import CacheBridge
from radixlm.runtime.scheduler.draft_model import DraftModel
from radixlm.runtime.scheduler.logprobs import (
    InputLogprobSpan,
    input_logprob_span,
    record_input_logprobs,
    record_logprobs,
    take_new_logprobs,
)
from radixlm.runtime.scheduler.req import FinishReason, Req
from radixlm.runtime.scheduler.schedule_policy import SchedulePolicy
from radixlm.runtime.scheduler.speculative import Drafter

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.kv_events_publisher import KVEventStream

GRAMMAR_POLL_S = 0.005
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = 0.002

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    context_len: int
    max_running_requests: int
    chunked_prefill_size: int = 2048
    schedule_policy: str = "lpm"
    disable_radix_cache: bool = False
    random_seed: int | None = None
    speculative: SpeculativeConfig | None = None  # None: no speculative decoding


@dataclass(frozen=True)
class StepOutput:
    """One request's progress in a step: the tokens it gained (several with jump-forward; none
    when aborted or nothing new)."""

    req: Req
    token_ids: tuple[int, ...]

    def to_message(self) -> ReqOutput:
        """This progress as the detokenizer takes it (new ids, new logprob entries and, when the
        request's decoder is here, its new text). Call it once per message: it takes what is new."""
        req = self.req
        return ReqOutput(
            rid=req.rid,
            new_token_ids=self.token_ids,
            new_text=req.take_new_text(),
            finish_reason=None if req.finish_reason is None else req.finish_reason.to_dict(),
            prompt_tokens=len(req.input_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            logprobs=take_new_logprobs(req) if req.logprob.return_logprob else None,
            spec=None if req.spec_verify_ct == 0 else SpecCounts(
                req.spec_verify_ct, req.spec_num_proposed_drafts, req.spec_num_correct_drafts),
        )


@dataclass(frozen=True)
class StepRecord:
    """One forward of the scheduler: when it started (time.monotonic), what it computed and how
    long the whole step took (prepare, forward, sampling, grammar work)."""

    start: float
    num_extends: int  # requests with new prompt tokens (whole or a chunk)
    num_extend_tokens: int
    num_decodes: int  # running requests that decoded (drafts included in their one row each)
    secs: float
    num_draft_tokens: int = 0  # query rows beyond the decodes' one each: their drafts (forced + speculative)
    num_new_tokens: int = 0  # output tokens the step appended, over every request


STEP_RECORDS_KEPT = 4096


class Scheduler:
    def __init__(self, runner: ModelRunner, cfg: SchedulerConfig, grammar_backend: GrammarBackend | None = None,
                 kv_events: KVEventStream | None = None, draft_runner: ModelRunner | None = None):
        """`draft_runner`: STANDALONE speculative decoding's draft model (`draft_model`)."""
        self.runner = runner
        self.kv_events = kv_events  # publishes the cache's block events after each step and flush
        self.cfg = cfg
        self.grammar_backend = grammar_backend
        self.grammar_waiting: list[Req] = []  # their grammar is compiling (in a worker thread)
        self.kv_pool = runner.kv_pool
        observer = None if kv_events is None else kv_events.recorder
        cache: BasePrefixCache = NoopRadixCache(self.kv_pool) if cfg.disable_radix_cache else \
            RadixCache(self.kv_pool, observer)
        self.bridge = CacheBridge(self.kv_pool, runner.req_to_token_pool, cache)
        self.policy = SchedulePolicy(cfg.schedule_policy, self.bridge, cfg.random_seed)
        self.waiting: list[Req] = []
        self.running: list[Req] = []  # prompt complete, decoding; in admission order
        self.chunked_req: Req | None = None  # prompt partly computed
        self.generator = torch.Generator()
        if cfg.random_seed is not None:
            self.generator.manual_seed(cfg.random_seed)
        self._aborted: list[Req] = []
        self.num_retractions = 0
        self.num_jump_forward_tokens = 0  # draft tokens kept: each saved a decode step
        self.drafter = Drafter(cfg.speculative, None if draft_runner is None else DraftModel(draft_runner))
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO  # share of remaining tokens admission reserves
        self.num_forwards = 0
        self.recent_steps: deque[StepRecord] = deque(maxlen=STEP_RECORDS_KEPT)  # newest last

    @property
    def cache(self) -> BasePrefixCache:
        return self.bridge.cache

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked_req or self._aborted or self.grammar_waiting)

    def add_request(self, req: Req) -> None:
        if not req.input_ids:
            raise ValueError("the prompt is empty: at least one input token is required")
        if len(req.input_ids) >= self.cfg.context_len:
            raise ValueError(
                f"the prompt has {len(req.input_ids)} tokens; the context length is {self.cfg.context_len}"
            )
        if len(req.input_ids) + 1 > self.kv_pool.max_total_num_tokens:
            raise ValueError(f"the prompt has {len(req.input_ids)} tokens; "
                             f"the KV pool holds {self.kv_pool.max_total_num_tokens}")
        grammar = grammar_spec(req.params)
        if grammar is None:
            self.waiting.append(req)
            return
        if self.grammar_backend is None:
            raise ValueError("this scheduler has no grammar backend for regex / json_schema requests")
        if req.lowered_grammar is not None:  # lowered at the door: compiled as it is
            req.grammar_future = self.grammar_backend.get_lowered(req.lowered_grammar)
        else:
            req.grammar_future = self.grammar_backend.get(*grammar)
        self.grammar_waiting.append(req)

    def abort(self, rid: str) -> None:
        """Finish a request now; its KV is released by the next step, which also reports it."""
        for req in [r for r in self.waiting + self.grammar_waiting if r.rid == rid]:
            (self.waiting if req in self.waiting else self.grammar_waiting).remove(req)
            req.finish_reason = FinishReason("abort", message="aborted")
            self._aborted.append(req)
        for req in self.running + ([self.chunked_req] if self.chunked_req else []):
            if req.rid == rid and not req.is_finished:
                req.finish_reason = FinishReason("abort", message="aborted")
                self._aborted.append(req)

    def flush_cache(self) -> bool:
        """Drop the prefix cache and the n-gram cache of earlier outputs (drafts); refused (False)
        while requests are running."""
        if self.running or self.chunked_req:
            return False
        self.cache.flush()
        self.drafter.flush()
        self._publish_kv_events()
        return True

    def check_integrity(self) -> None:
        live = self.running + ([self.chunked_req] if self.chunked_req else [])
        self.bridge.check_integrity(live)
        if self.drafter.draft_model is not None:
            self.drafter.draft_model.check_integrity(r.rid for r in live)
        if self.drafter.ngram_cache is not None:
            self.drafter.ngram_cache.check_integrity()

    def step(self) -> list[StepOutput]:
        self._poll_grammars()
        outputs = [StepOutput(r, ()) for r in self._aborted]
        self._aborted = []
        self._retire_finished()
        self._make_room_for_decode()
        self.drafter.fit_budget(self.running)
        plan = plan_extends(self)
        if not plan.extends and not self.running:
            self._publish_kv_events()
            return outputs
        start = time.monotonic()
        num_decodes = len(self.running)
        num_draft_tokens = sum(len(r.jump_forward_ids) for r in self.running)
        batch, sample_reqs, spans = self._prepare(plan)
        logits = self.runner.forward(batch)
        new_outputs = self._process_results(plan, sample_reqs, spans, logits)
        outputs += new_outputs
        self._retire_finished()
        self.num_forwards += 1
        self.recent_steps.append(StepRecord(start, len(plan.extends), sum(e.num_tokens for e in plan.extends),
                                            num_decodes, time.monotonic() - start, num_draft_tokens,
                                            sum(len(o.token_ids) for o in new_outputs)))
        self._publish_kv_events()
        return outputs

    def _publish_kv_events(self) -> None:
        if self.kv_events is not None:
            self.kv_events.publish_pending()

    def _poll_grammars(self) -> None:
        """Requests whose grammar finished compiling join the waiting queue (a failed compile
        finishes the request with its error). With nothing else to do, wait briefly for one."""
        if not self.grammar_waiting:
            return
        if not (self.waiting or self.running or self.chunked_req):
            futures.wait([r.grammar_future for r in self.grammar_waiting], timeout=GRAMMAR_POLL_S,
                         return_when=futures.FIRST_COMPLETED)
        still = []
        for req in self.grammar_waiting:
            future = req.grammar_future
            assert future is not None
            if not future.done():
                still.append(req)
                continue
            error = future.exception()
            if error is not None:
                req.finish_reason = FinishReason("abort", message=f"invalid grammar: {error}")
                self._aborted.append(req)
            else:
                grammar = self._new_grammar_state(req, future.result())
                shortest = grammar.min_tokens()
                if shortest is None:  # a context-free grammar with no end our search finds
                    req.finish_reason = FinishReason("abort", message=(
                        f"invalid grammar: no output of this grammar ends within {MAX_PLAN_BYTES} bytes "
                        "(a recursion with no way out?)"))
                    self._aborted.append(req)
                elif req.budget and shortest > req.budget:  # max_new_tokens=0: no output
                    req.finish_reason = FinishReason("abort", message=(
                        f"invalid grammar: max_new_tokens={req.params.max_new_tokens} cannot hold the shortest "
                        f"output this grammar allows ({shortest} tokens)"))
                    self._aborted.append(req)
                else:
                    if req.reasoning_end is not None:  # the answer's grammar: after the reasoning
                        req.grammar_after_reasoning = grammar
                    else:
                        req.grammar = grammar
                    self.waiting.append(req)
            req.grammar_future = None
        self.grammar_waiting = still

    def _new_grammar_state(self, req: Req, compiled: Any) -> Any:
        """The request's grammar state; where its JSON schema has `uniqueItems`, wrapped so that
        no array item repeats (`unique_items`: no engine enforces it)."""
        state = compiled.new_state()
        lowered = req.lowered_grammar
        if lowered is None or not lowered.unique_items:
            return state
        backend = self.grammar_backend
        assert backend is not None
        return wrap(state, lowered.unique_items, get_grammar_vocabulary(backend.tokenizer).id_to_bytes,
                    backend.vocab_size)

    def _make_room_for_decode(self) -> None:
        """Ensure one slot per running request (plus its draft, or the drafts are dropped): evict,
        then retract newest-first."""
        if self.running:
            self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        num_draft_tokens = sum(len(r.jump_forward_ids) for r in self.running)
        if num_draft_tokens and self.bridge.available_tokens() < len(self.running) + num_draft_tokens:
            for req in self.running:
                req.jump_forward_ids, req.num_forced_draft = [], 0
        while self.running and self.bridge.available_tokens() < len(self.running):
            req = self.running.pop()
            if not self.running and self.chunked_req is None:
                # alone and still out of memory: the pool cannot hold this sequence any longer
                req.finish_reason = FinishReason(
                    "abort", message=f"KV pool ({self.kv_pool.max_total_num_tokens} tokens) is full")
                self._release(req)
                self._aborted.append(req)
                break
            self._release(req)
            req.is_retracted = True
            self.waiting.insert(0, req)
            self.num_retractions += 1
            self.new_token_ratio = INIT_NEW_TOKEN_RATIO

    def _prepare(self, plan: AdmissionPlan) -> tuple[ForwardBatch, list[Req], list[InputLogprobSpan]]:
        """Allocate the step's slots and build the ForwardBatch; extends first, then decodes.

        Logits rows: first those of the requests that sample this step (one for the last new
        token, then one per draft token), then, for requests asking for input logprobs, the rows
        of the prompt positions they need.
        """
        reqs = [e.req for e in plan.extends] + self.running
        chunks = [e.req.token_ids(e.req.num_cached, e.req.num_cached + e.num_tokens) for e in plan.extends]
        chunks += [[r.output_ids[-1], *r.jump_forward_ids] for r in self.running]
        slots = self.bridge.alloc(sum(len(c) for c in chunks))
        assert slots is not None, "admission and _make_room_for_decode guarantee the slots"
        offset = 0
        for req, chunk in zip(reqs, chunks):
            self.runner.req_to_token_pool.write(req.req_pool_idx, req.num_cached, slots[offset : offset + len(chunk)])  # type: ignore[arg-type]
            offset += len(chunk)
        rows = [r.req_pool_idx for r in reqs]
        if not plan.extends:
            # A decode batch, with drafts too: a request's token at position p is its own row,
            # attending to positions [0, p] (DecodeStack and the attention backends write every
            # row's K/V before any row attends), so drafts are verified on the decode fast path.
            row_seq = [(r.req_pool_idx, r.seq_len + j) for r, c in zip(self.running, chunks) for j in range(len(c))]
            batch = ForwardBatch.decode([r for r, _ in row_seq], [n for _, n in row_seq],  # type: ignore[misc]
                                        [t for c in chunks for t in c], slots)
            return batch, list(self.running), []
        sample_reqs, sample_rows, spans, extra_rows, end = [], [], [], [], 0
        for req, chunk, ext in zip(reqs, chunks, list(plan.extends) + [None] * len(self.running)):
            if ext is not None:
                span = input_logprob_span(req, req.num_cached, len(chunk), end, len(extra_rows))
                if span is not None:
                    spans.append(span)
                    extra_rows.extend(range(span.first_row, span.first_row + span.count))
            end += len(chunk)
            if ext is None or not ext.is_partial:
                sample_reqs.append(req)
                sample_rows.extend(range(end - 1 - len(req.jump_forward_ids), end))
        logits_indices = torch.tensor(sample_rows + extra_rows, dtype=torch.int64)
        batch = ForwardBatch.extend(rows, [r.num_cached for r in reqs], chunks, slots, logits_indices)  # type: ignore[arg-type]
        return batch, sample_reqs, spans

    def _process_results(
        self, plan: AdmissionPlan, sample_reqs: list[Req], spans: list[InputLogprobSpan], logits: torch.Tensor
    ) -> list[StepOutput]:
        num_rows = sum(1 + len(r.jump_forward_ids) for r in sample_reqs)
        if spans:
            record_input_logprobs(spans, logits[num_rows:])
        logits = logits[:num_rows]
        for ext in plan.extends:
            ext.req.num_cached += ext.num_tokens
            self.bridge.cache_unfinished(ext.req)
            if ext.is_partial:
                self.chunked_req = ext.req
            else:
                if self.chunked_req is ext.req:
                    self.chunked_req = None
                self.running.append(ext.req)
        for req in self.running:
            req.num_cached = req.seq_len + len(req.jump_forward_ids)  # the draft has K/V now too
        outputs = []
        for req in sample_reqs:
            if req.params.max_new_tokens == 0 and not req.is_finished:  # prefill only (e.g. cache a prefix)
                req.finish_reason = FinishReason("length", 0)
                outputs.append(StepOutput(req, ()))
        if any(r.is_finished for r in sample_reqs):  # only prefill-only extends, which have no draft
            row_reqs = [r for r in sample_reqs for _ in range(1 + len(r.jump_forward_ids))]
            logits = logits[[i for i, r in enumerate(row_reqs) if not r.is_finished]]
            sample_reqs = [r for r in sample_reqs if not r.is_finished]
        if sample_reqs:
            outputs += self._sample_and_accept(sample_reqs, logits)
        return outputs

    def _sample_and_accept(self, reqs: list[Req], logits: torch.Tensor) -> list[StepOutput]:
        """Sample every row (a request's rows: its last token, then each draft token), append each
        request's tokens while they agree with its draft, and set its next draft."""
        drafts = [r.jump_forward_ids for r in reqs]
        row_reqs = [r for r, draft in zip(reqs, drafts) for _ in range(len(draft) + 1)]
        want_logprob = any(r.logprob.return_logprob for r in reqs)
        result = sample(
            logits,
            sampling_batch(reqs, logits.shape[-1], logits.device),
            vocab_mask=grammar_mask(reqs, logits.shape[-1], self.cfg.context_len),
            generator=self.generator,
            return_logprob=want_logprob,
        )
        next_ids = result.next_ids.tolist()
        outputs, kept_rows, row = [], [], 0
        for req, draft in zip(reqs, drafts):
            first_draft_pos = req.num_cached - len(draft)  # the draft's K/V starts here
            new_ids: list[int] = []
            for j in range(len(draft) + 1):
                token = self._steer_by_budget(req, next_ids[row + j], result, row + j)
                kept_rows.append(row + j)
                new_ids.append(token)
                self._accept_token(req, token)
                if req.is_finished or j == len(draft) or token != draft[j]:
                    break
            row += len(draft) + 1
            self.num_jump_forward_tokens += sum(t == d for t, d in zip(new_ids, draft))
            self.drafter.record_verify(req, draft, new_ids)
            self.bridge.truncate(req, first_draft_pos + len(new_ids) - 1)  # K/V of the kept draft only
            req.jump_forward_ids, req.num_forced_draft = [], 0
            if not req.is_finished:
                max_len = self._max_draft_len(req)
                forced = [] if req.grammar is None else req.grammar.jump_forward_ids(new_ids[-1], max_len)
                req.jump_forward_ids = self.drafter.draft(req, forced, max_len)
            outputs.append(StepOutput(req, tuple(new_ids)))
        self.drafter.draft_with_model(len(self.running))
        if want_logprob:
            assert result.logprobs is not None and result.vocab_logprobs is not None
            kept = torch.tensor(kept_rows, dtype=torch.int64)
            kept_result = SampleOutput(result.next_ids[kept], result.logprobs[kept], result.vocab_logprobs[kept])
            record_logprobs([row_reqs[i] for i in kept_rows], kept_result)
        return outputs

    def _steer_by_budget(self, req: Req, token: int, result: SampleOutput, row: int) -> int:
        """The token to take for a sampled `token`: itself, unless the request's grammar steers by
        its budget after sampling (the context-free backends, `closing.ClosingSearch`) and could not
        complete within the tokens left after it (max_new_tokens, or without one the context
        length); then the first token of the grammar's closing plan (its logprob recorded in
        `result` in place of the sampled one's)."""
        grammar = req.grammar
        if grammar is None or req.is_finished:
            return token
        steered = grammar.budget_token(token, tokens_left(req, self.cfg.context_len))
        if steered != token:
            req.budget_steered = True
            req.budget_ended = steered in req.eos_token_ids
            result.next_ids[row] = steered
            if result.logprobs is not None and result.vocab_logprobs is not None:
                result.logprobs[row] = result.vocab_logprobs[row, steered]
        return steered

    def _accept_token(self, req: Req, token: int) -> None:
        req.append_token(token, self.cfg.context_len)
        if req.reasoning_end is not None:
            if req.reasoning_end.advance(token):  # the reasoning ended: the grammar takes the next token
                req.reasoning_end = None
                req.grammar, req.grammar_after_reasoning = req.grammar_after_reasoning, None
            return
        if req.grammar is None:
            return
        reason = req.finish_reason
        if reason is None:
            try:
                req.grammar.accept_token(token)
            except UniqueItemsDeadEnd as e:  # only repeats were left: the request ends, saying so
                req.finish_reason = FinishReason("abort", message=str(e))
                return
            except ValueError as e:  # a sampler bug must cost this request, not the server
                logger.error("request %s: the grammar refused the sampled token %d: %s", req.rid, token, e)
                req.finish_reason = FinishReason("abort", message=f"internal error: the grammar refused token {token}")
                return
            if req.grammar.is_terminated():  # nothing but EOS could follow: done
                req.finish_reason = FinishReason("stop", None)
        elif reason.type == "length" and req.budget == 0 and req.budget_steered:
            req.finish_reason = replace(reason, closed_by_budget=True)
        elif reason.type == "stop" and req.budget_ended:  # the budget ended it, not the model
            req.finish_reason = FinishReason("length", len(req.output_ids), closed_by_budget=True)

    def _max_draft_len(self, req: Req) -> int:
        """Draft tokens the next step may add: all of them plus one sample stay within the
        context length and max_new_tokens."""
        limit = self.cfg.context_len - req.seq_len - 1
        if req.params.max_new_tokens is not None:
            limit = min(limit, req.params.max_new_tokens - len(req.output_ids) - 1)
        return limit

    def _retire_finished(self) -> None:
        still_running = []
        for req in self.running:
            if req.is_finished:
                self._release(req)
            else:
                still_running.append(req)
        self.running = still_running
        if self.chunked_req is not None and self.chunked_req.is_finished:
            self._release(self.chunked_req)
            self.chunked_req = None

    def _release(self, req: Req) -> None:
        """A request leaves the running set (finished, aborted or retracted): its K/V goes to the
        cache, its draft model's K/V (STANDALONE) is freed."""
        self.bridge.release(req, keep_in_cache=True)
        self.drafter.release(req)


def grammar_spec(params: SamplingParams) -> tuple[str, str] | None:
    """(kind, spec) of a request's grammar, or None for free generation."""
    if params.json_schema:
        return "json_schema", params.json_schema
    if params.regex:
        return "regex", params.regex
    if params.ebnf:
        return "ebnf", params.ebnf
    if params.structural_tag:
        return "structural_tag", params.structural_tag
    return None


def sampling_batch(reqs: list[Req], vocab_size: int, device: torch.device) -> SamplingBatch:
    """The SamplingBatch of a step's sampled rows: each request's row samples the token after its
    output, then one row per draft token j samples the token after the output and draft[:j].

    Per-step cost is independent of output lengths: a request with penalties is counted from its
    output once (its first sampling), then `Req.append_token` keeps the counts; the batch gathers
    them and counts each draft row's earlier draft tokens on top.
    """
    params: list[SamplingParams] = []
    num_output_tokens: list[int] = []
    counts: list[torch.Tensor | None] = []
    extra_counted_ids: list[list[int]] = []
    for req in reqs:
        if req.output_token_counts is None and has_penalties(req.params):
            req.output_token_counts = count_tokens(req.output_ids, vocab_size, device)
        draft = req.jump_forward_ids
        for j in range(len(draft) + 1):
            params.append(req.params)
            num_output_tokens.append(len(req.output_ids) + j)
            counts.append(req.output_token_counts)
            extra_counted_ids.append(draft[:j])
    return SamplingBatch.build(
        params,
        num_output_tokens,
        vocab_size,
        device,
        eos_token_ids=[r.eos_token_ids for r in reqs for _ in range(len(r.jump_forward_ids) + 1)],
        output_token_counts=counts,
        extra_counted_ids=extra_counted_ids,
    )


def tokens_left(req: Req, context_len: int) -> int:
    """Tokens the request may still generate, the next one included: its max_new_tokens left, and
    at most what the context holds. Grammars are closed within it (budget steering)."""
    room = context_len - req.seq_len
    return room if req.budget is None else min(req.budget, room)


def grammar_mask(reqs: list[Req], vocab_size: int, context_len: int) -> torch.Tensor | None:
    """The allowed-token mask of a batch's sampled rows (True = allowed): each request has one row
    plus one per draft token, filled by its FSM along the draft; free requests allow everything.
    None when no request is constrained."""
    if not any(r.grammar is not None for r in reqs):
        return None
    mask = torch.ones(sum(1 + len(r.jump_forward_ids) for r in reqs), vocab_size, dtype=torch.bool)
    row = 0
    for req in reqs:
        num_rows = 1 + len(req.jump_forward_ids)
        if req.grammar is not None and req.finish_reason is None:
            mask[row : row + num_rows].fill_(False)
            # budget steering: the last tokens complete the grammar within max_new_tokens
            try:
                if req.grammar.fill_vocab_masks(mask[row : row + num_rows], req.jump_forward_ids,
                                                tokens_left(req, context_len)):
                    req.budget_steered = True
            except Exception as e:  # an engine's failure costs this request, not the server
                logger.exception("request %s: its grammar's mask failed", req.rid)
                req.finish_reason = FinishReason("abort", message=f"internal error: the grammar's mask failed: {e}")
                mask[row : row + num_rows].fill_(True)
        row += num_rows
    return mask
