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
"""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass

import torch

from radixlm.runtime.admission import AdmissionPlan, plan_extends
from radixlm.runtime.cache_bridge import CacheBridge
from radixlm.runtime.constrained.grammar import GrammarBackend
from radixlm.runtime.forward_batch import ForwardBatch
from radixlm.runtime.logprobs import (
    InputLogprobSpan,
    input_logprob_span,
    record_input_logprobs,
    record_logprobs,
)
from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.radix_cache import BasePrefixCache, NoopRadixCache, RadixCache
from radixlm.runtime.req import FinishReason, Req
from radixlm.runtime.sampler import SamplingBatch, sample
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.schedule_policy import SchedulePolicy

GRAMMAR_POLL_S = 0.005
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = 0.002


@dataclass(frozen=True)
class SchedulerConfig:
    context_len: int
    max_running_requests: int
    chunked_prefill_size: int = 2048
    schedule_policy: str = "lpm"
    disable_radix_cache: bool = False
    random_seed: int | None = None


@dataclass(frozen=True)
class StepOutput:
    """One request's progress in a step: the token it gained (None: aborted or nothing new)."""

    req: Req
    token_id: int | None


class Scheduler:
    def __init__(self, runner: ModelRunner, cfg: SchedulerConfig, grammar_backend: GrammarBackend | None = None):
        self.runner = runner
        self.cfg = cfg
        self.grammar_backend = grammar_backend
        self.grammar_waiting: list[Req] = []  # their grammar is compiling (in a worker thread)
        self.kv_pool = runner.kv_pool
        cache: BasePrefixCache = NoopRadixCache(self.kv_pool) if cfg.disable_radix_cache else RadixCache(self.kv_pool)
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
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO  # share of remaining tokens admission reserves

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
        if len(req.input_ids) + 1 > self.kv_pool.size:
            raise ValueError(f"the prompt has {len(req.input_ids)} tokens; the KV pool holds {self.kv_pool.size}")
        grammar = grammar_spec(req.params)
        if grammar is None:
            self.waiting.append(req)
            return
        if self.grammar_backend is None:
            raise ValueError("this scheduler has no grammar backend for regex / json_schema requests")
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
        """Drop the prefix cache; refused (False) while requests are running."""
        if self.running or self.chunked_req:
            return False
        self.cache.flush()
        return True

    def check_integrity(self) -> None:
        live = self.running + ([self.chunked_req] if self.chunked_req else [])
        self.bridge.check_integrity(live)

    def step(self) -> list[StepOutput]:
        self._poll_grammars()
        outputs = [StepOutput(r, None) for r in self._aborted]
        self._aborted = []
        self._retire_finished()
        self._make_room_for_decode()
        plan = plan_extends(self)
        if not plan.extends and not self.running:
            return outputs
        batch, sample_reqs, spans = self._prepare(plan)
        logits = self.runner.forward(batch)
        outputs += self._process_results(plan, sample_reqs, spans, logits)
        self._retire_finished()
        return outputs

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
                req.grammar = future.result().new_state()
                self.waiting.append(req)
            req.grammar_future = None
        self.grammar_waiting = still

    def _make_room_for_decode(self) -> None:
        """Ensure one slot per running request: evict, then retract newest-first."""
        if self.running:
            self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        while self.running and self.bridge.available_tokens() < len(self.running):
            req = self.running.pop()
            if not self.running and self.chunked_req is None:
                # alone and still out of memory: the pool cannot hold this sequence any longer
                req.finish_reason = FinishReason("abort", message=f"KV pool ({self.kv_pool.size} tokens) is full")
                self.bridge.release(req, keep_in_cache=True)
                self._aborted.append(req)
                break
            self.bridge.release(req, keep_in_cache=True)
            req.is_retracted = True
            self.waiting.insert(0, req)
            self.num_retractions += 1
            self.new_token_ratio = INIT_NEW_TOKEN_RATIO

    def _prepare(self, plan: AdmissionPlan) -> tuple[ForwardBatch, list[Req], list[InputLogprobSpan]]:
        """Allocate the step's slots and build the ForwardBatch; extends first, then decodes.

        Logits rows: first one per request that samples this step (its last new token), then,
        for requests asking for input logprobs, the rows of the prompt positions they need.
        """
        reqs = [e.req for e in plan.extends] + self.running
        chunks = [e.req.all_ids[e.req.num_cached : e.req.num_cached + e.num_tokens] for e in plan.extends]
        chunks += [[r.output_ids[-1]] for r in self.running]
        slots = self.bridge.alloc(sum(len(c) for c in chunks))
        assert slots is not None, "admission and _make_room_for_decode guarantee the slots"
        offset = 0
        for req, chunk in zip(reqs, chunks):
            self.runner.req_to_token_pool.write(req.req_pool_idx, req.num_cached, slots[offset : offset + len(chunk)])  # type: ignore[arg-type]
            offset += len(chunk)
        rows = [r.req_pool_idx for r in reqs]
        if not plan.extends:
            seq_lens = [r.seq_len for r in self.running]
            batch = ForwardBatch.decode(rows, seq_lens, [c[0] for c in chunks], slots)  # type: ignore[arg-type]
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
                sample_rows.append(end - 1)
        logits_indices = torch.tensor(sample_rows + extra_rows, dtype=torch.int64)
        batch = ForwardBatch.extend(rows, [r.num_cached for r in reqs], chunks, slots, logits_indices)  # type: ignore[arg-type]
        return batch, sample_reqs, spans

    def _process_results(
        self, plan: AdmissionPlan, sample_reqs: list[Req], spans: list[InputLogprobSpan], logits: torch.Tensor
    ) -> list[StepOutput]:
        if spans:
            record_input_logprobs(spans, logits[len(sample_reqs) :])
        logits = logits[: len(sample_reqs)]
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
            req.num_cached = req.seq_len
        outputs = []
        for req in sample_reqs:
            if req.params.max_new_tokens == 0 and not req.is_finished:  # prefill only (e.g. cache a prefix)
                req.finish_reason = FinishReason("length", 0)
                outputs.append(StepOutput(req, None))
        keep = [i for i, r in enumerate(sample_reqs) if not r.is_finished]
        if len(keep) < len(sample_reqs):
            sample_reqs = [sample_reqs[i] for i in keep]
            logits = logits[keep]
        if not sample_reqs:
            return outputs
        want_logprob = any(r.logprob.return_logprob for r in sample_reqs)
        vocab_mask = grammar_mask(sample_reqs, logits.shape[-1])
        result = sample(
            logits,
            SamplingBatch.build(
                [r.params for r in sample_reqs],
                [r.output_ids for r in sample_reqs],
                logits.shape[-1],
                eos_token_ids=[r.eos_token_ids for r in sample_reqs],
            ),
            vocab_mask=vocab_mask,
            generator=self.generator,
            return_logprob=want_logprob,
        )
        if want_logprob:
            record_logprobs(sample_reqs, result)
        for req, token in zip(sample_reqs, result.next_ids.tolist()):
            req.append_token(token, self.cfg.context_len)
            if req.grammar is not None and not req.is_finished:
                req.grammar.accept_token(token)
                if req.grammar.is_terminated():  # nothing but EOS could follow: done
                    req.finish_reason = FinishReason("stop", None)
            outputs.append(StepOutput(req, token))
        return outputs

    def _retire_finished(self) -> None:
        still_running = []
        for req in self.running:
            if req.is_finished:
                self.bridge.release(req, keep_in_cache=True)
            else:
                still_running.append(req)
        self.running = still_running
        if self.chunked_req is not None and self.chunked_req.is_finished:
            self.bridge.release(self.chunked_req, keep_in_cache=True)
            self.chunked_req = None


def grammar_spec(params: SamplingParams) -> tuple[str, str] | None:
    """(kind, spec) of a request's grammar, or None for free generation."""
    if params.json_schema:
        return "json_schema", params.json_schema
    if params.regex:
        return "regex", params.regex
    if params.ebnf:
        raise ValueError("sampling_params.ebnf is not supported; use regex or json_schema")
    return None


def grammar_mask(reqs: list[Req], vocab_size: int) -> torch.Tensor | None:
    """The allowed-token mask of a batch (True = allowed): each constrained request's FSM fills
    its row; free requests allow everything. None when no request is constrained."""
    if not any(r.grammar is not None for r in reqs):
        return None
    mask = torch.ones(len(reqs), vocab_size, dtype=torch.bool)
    for i, req in enumerate(reqs):
        if req.grammar is not None:
            mask[i].fill_(False)
            req.grammar.fill_vocab_mask(mask[i])
    return mask
