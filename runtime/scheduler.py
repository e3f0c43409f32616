"""The scheduler: a plain object (`add_request`, `abort`, `step()`) that batches requests over the
model runner. No I/O: the Engine drives it in-process, the server wraps it in a process.

One step: admit waiting requests that fit (a KV row and enough slots for their prompt plus the
tokens every running request may still generate), run one forward — an extend batch for the newly
admitted requests together with one token of each running request, or a pure decode batch — then
sample one token per request and retire the finished ones, freeing their KV at once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
from radixlm.runtime.forward_batch import ForwardBatch
from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.req import FinishReason, Req
from radixlm.runtime.sampler import SamplingBatch, sample


@dataclass(frozen=True)
class StepOutput:
    """What one step produced for one request: its new token (None if aborted) and whether done."""

    req: Req
    token_id: int | None


class Scheduler:
    def __init__(self, runner: ModelRunner, context_len: int, random_seed: int | None = None):
        self.runner = runner
        self.context_len = context_len
        self.kv_pool = runner.kv_pool
        self.req_to_token_pool = runner.req_to_token_pool
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.generator = torch.Generator()
        if random_seed is not None:
            self.generator.manual_seed(random_seed)
        self._aborted: list[Req] = []

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._aborted)

    def add_request(self, req: Req) -> None:
        if not req.input_ids:
            raise ValueError("the prompt is empty: at least one input token is required")
        if len(req.input_ids) >= self.context_len:
            raise ValueError(
                f"the prompt has {len(req.input_ids)} tokens; the context length is {self.context_len}"
            )
        self.waiting.append(req)

    def abort(self, rid: str) -> None:
        for req in list(self.waiting):
            if req.rid == rid:
                self.waiting.remove(req)
                req.finish_reason = FinishReason("abort", message="aborted")
                self._aborted.append(req)
        for req in self.running:
            if req.rid == rid and not req.is_finished:
                req.finish_reason = FinishReason("abort", message="aborted")
                self._aborted.append(req)  # reported by the next step, which also frees its KV

    def step(self) -> list[StepOutput]:
        outputs = [StepOutput(r, None) for r in self._aborted]
        self._aborted = []
        self._retire_finished()
        new_reqs = self._admit()
        batch_reqs = new_reqs + self.running
        if not batch_reqs:
            return outputs
        batch = self._prepare(new_reqs)
        logits = self.runner.forward(batch)
        sampling = SamplingBatch.build(
            [r.params for r in batch_reqs],
            [r.output_ids for r in batch_reqs],
            logits.shape[-1],
            eos_token_ids=[r.eos_token_ids for r in batch_reqs],
        )
        next_ids = sample(logits, sampling, generator=self.generator).next_ids.tolist()
        self.running = batch_reqs
        for req, token in zip(batch_reqs, next_ids):
            req.num_cached = req.seq_len
            req.output_ids.append(token)
            req.check_finished(self.context_len)
            outputs.append(StepOutput(req, token))
        self._retire_finished()
        return outputs

    def _admit(self) -> list[Req]:
        """Move waiting requests that fit into KV memory to the batch, first come first served."""
        reserved = sum(self._remaining_tokens(r) for r in self.running)
        admitted: list[Req] = []
        while self.waiting and len(self.running) + len(admitted) < self.req_to_token_pool.max_reqs:
            req = self.waiting[0]
            need = len(req.input_ids) + self._remaining_tokens(req)
            if reserved + need > self.kv_pool.num_free:
                if not self.running and not admitted:
                    self.waiting.popleft()
                    req.finish_reason = FinishReason(
                        "abort", message=f"request needs {need} KV slots; the pool has {self.kv_pool.size}"
                    )
                    self._aborted.append(req)
                    continue
                break
            self.waiting.popleft()
            row = self.req_to_token_pool.alloc()
            assert row is not None
            req.req_pool_idx = row
            reserved += need
            admitted.append(req)
        return admitted

    def _remaining_tokens(self, req: Req) -> int:
        max_new = req.params.max_new_tokens
        limit = self.context_len - len(req.input_ids)
        left = limit if max_new is None else min(max_new, limit)
        return max(0, left - len(req.output_ids))

    def _prepare(self, new_reqs: list[Req]) -> ForwardBatch:
        """Allocate slots for every new token of the step and build the ForwardBatch."""
        batch_reqs = new_reqs + self.running
        new_tokens = [r.all_ids[r.num_cached :] for r in batch_reqs]
        slots = self.kv_pool.alloc(sum(len(t) for t in new_tokens))
        assert slots is not None, "admission reserved these slots"
        offset = 0
        for req, tokens in zip(batch_reqs, new_tokens):
            assert req.req_pool_idx is not None
            self.req_to_token_pool.write(req.req_pool_idx, req.num_cached, slots[offset : offset + len(tokens)])
            offset += len(tokens)
        rows = [r.req_pool_idx for r in batch_reqs]
        if not new_reqs:
            return ForwardBatch.decode(rows, [r.seq_len for r in batch_reqs], [t[0] for t in new_tokens], slots)
        return ForwardBatch.extend(rows, [r.num_cached for r in batch_reqs], new_tokens, slots)

    def _retire_finished(self) -> None:
        still_running = []
        for req in self.running:
            if req.is_finished:
                self._release(req)
            else:
                still_running.append(req)
        self.running = still_running

    def _release(self, req: Req) -> None:
        assert req.req_pool_idx is not None
        slots = self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.num_cached].to(torch.int64)
        self.kv_pool.free(slots)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None
        req.num_cached = 0
