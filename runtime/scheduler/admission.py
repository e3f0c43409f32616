"""Admission: which waiting requests join this step's extend, and how many of their tokens.

Budget accounting only (the policy orders, the bridge moves KV):
  - tokens: at most `chunked_prefill_size` extend tokens per step; a longer prompt is split and
    continues next step as the scheduler's `chunked_req` (one at a time, served first);
  - memory: a request is admitted when the free + evictable KV slots cover this step's tokens
    plus an estimate of what the running requests and it will still decode
    (`remaining tokens x new_token_ratio`; the ratio decays while decoding goes well and resets
    after a retraction, as in SGLang);
  - requests that would compute the same new prefix as one admitted this step wait one step, so
    that they reuse it from the cache instead of computing it twice.

Prefix matches: a waiting request is matched against the cache at most once per step, by the
policy (prefix-aware policies rank by it) or else here, before it is tried. Nothing evicts
between ordering and admitting (slots are allocated after planning), and a node split keeps a
matched `prefix_node` valid, so the step's match stays exact; the matches of requests still
waiting are dropped when planning ends (the next step's cache may differ).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.mem_cache.radix_cache import RadixCache
from radixlm.runtime.scheduler.req import Req

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.scheduler import Scheduler

IN_BATCH_SHARED_PREFIX_THRESHOLD = 32  # shared new tokens that make a request wait a step
MAX_RESERVED_PER_REQ = 4096


@dataclass(frozen=True)
class ExtendItem:
    req: Req
    num_tokens: int  # tokens of req.all_ids[req.num_cached:] computed this step
    is_partial: bool  # the prompt continues next step (chunked prefill)


@dataclass
class AdmissionPlan:
    extends: list[ExtendItem] = field(default_factory=list)


class _NoSlots:
    def free(self, slots: torch.Tensor) -> None:
        pass


def remaining_decode_tokens(req: Req, context_len: int) -> int:
    limit = context_len - len(req.input_ids)
    max_new = req.params.max_new_tokens
    left = limit if max_new is None else min(max_new, limit)
    return max(0, left - len(req.output_ids))


def plan_extends(sched: Scheduler) -> AdmissionPlan:
    plan = AdmissionPlan()
    budget = sched.cfg.chunked_prefill_size
    # slots this step already needs: decodes (with their jump-forward drafts), then extends
    pending = sum(1 + len(r.jump_forward_ids) for r in sched.running)
    ratio = sched.new_token_ratio
    ctx = sched.cfg.context_len
    reserved = sum(min(remaining_decode_tokens(r, ctx), MAX_RESERVED_PER_REQ) * ratio for r in sched.running)

    chunked = sched.chunked_req
    num_paused = 0  # a chunked prompt that waits for memory this step
    if chunked is not None and not chunked.is_finished:
        # the rest of a chunked prompt was never reserved: compute what memory holds now; with
        # nothing free it waits (nothing else is admitted) while the decodes finish or retract
        n = min(budget, chunked.seq_len - chunked.num_cached, sched.bridge.available_tokens() - pending)
        if n > 0:
            plan.extends.append(ExtendItem(chunked, n, chunked.num_cached + n < chunked.seq_len))
            budget -= n
            pending += n
        else:
            num_paused = 1
    in_batch = RadixCache(_NoSlots())
    for req in sched.policy.order(sched.waiting):
        num_live = len(sched.running) + len(plan.extends) + num_paused
        if budget <= 0 or num_live >= sched.cfg.max_running_requests:
            break
        if req.prefix_slots is None:  # the policy did not match it this step
            sched.bridge.match(req)
        assert req.prefix_slots is not None
        prefix_len = req.prefix_slots.numel()
        new_len = req.seq_len - prefix_len
        # new tokens a request admitted this step computes too, which waiting a step would read
        # from the cache instead: all but the last (a request always computes its last token)
        reusable = min(_in_batch_shared_len(in_batch, req) - prefix_len, new_len - 1)
        if reusable > 0 and (reusable >= IN_BATCH_SHARED_PREFIX_THRESHOLD or reusable == new_len - 1):
            continue  # computes the same new prefix as a request admitted this step: next step
        n = min(new_len, budget)
        future = min(remaining_decode_tokens(req, ctx), MAX_RESERVED_PER_REQ) * ratio
        available = sched.bridge.available_tokens() - prefix_len  # admitting locks the prefix
        fits = available - pending >= n + reserved + future
        if not fits and not (num_live == 0 and available - pending >= n):
            break
        if not sched.bridge.admit(req):
            break
        sched.waiting.remove(req)
        plan.extends.append(ExtendItem(req, n, n < new_len))
        in_batch.insert(req.all_ids, torch.zeros(req.seq_len, dtype=torch.int64), namespace=req.cache_salt)
        budget -= n
        pending += n
        reserved += future
    for req in sched.waiting:
        req.prefix_slots = req.prefix_node = None
    return plan


def _in_batch_shared_len(in_batch: RadixCache, req: Req) -> int:
    """Tokens of the request's prefix that a request admitted this step computes too."""
    return in_batch.match_prefix(req.all_ids, namespace=req.cache_salt).slots.numel() if in_batch.num_nodes else 0
