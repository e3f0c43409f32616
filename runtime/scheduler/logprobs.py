"""Logprob bookkeeping in SGLang's shapes: per token `(logprob, token_id)`, and per position the
top-k list of `(logprob, token_id)`; the HTTP layer adds the token text when asked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixlm.runtime.ipc.messages import LogprobEntries
from radixlm.runtime.sampling.sampler import SampleOutput, top_logprobs
from radixlm.runtime.scheduler.req import Req


def record_logprobs(reqs: Sequence[Req], result: SampleOutput) -> None:
    """Append each logprob-requesting request's sampled-token logprob (and its top-k)."""
    assert result.logprobs is not None and result.vocab_logprobs is not None
    max_top = max((r.logprob.top_logprobs_num for r in reqs if r.logprob.return_logprob), default=0)
    top_values = top_ids = None
    if max_top > 0:
        top_values, top_ids = top_logprobs(result.vocab_logprobs, max_top)
    values, ids = result.logprobs.tolist(), result.next_ids.tolist()
    for i, req in enumerate(reqs):
        if not req.logprob.return_logprob:
            continue
        req.output_token_logprobs.append((values[i], ids[i]))
        k = req.logprob.top_logprobs_num
        if k > 0 and top_values is not None and top_ids is not None:
            req.output_top_logprobs.append(list(zip(top_values[i, :k].tolist(), top_ids[i, :k].tolist())))


@dataclass(frozen=True)
class InputLogprobSpan:
    """Prompt positions [first_pos, first_pos + count) whose next-token logprobs one extend chunk
    yields: logits row i of the span predicts prompt token first_pos + i + 1."""

    req: Req
    first_pos: int
    count: int
    first_row: int  # row in the forward's flat token order
    first_logit: int  # row in the extra part of the logits (after the sampling rows)


def input_logprob_span(req: Req, num_cached: int, chunk_len: int, chunk_row: int, first_logit: int) -> InputLogprobSpan | None:
    """The span of this extend chunk (starting at position num_cached, flat row chunk_row) that
    input logprobs need, or None. The first prompt token has no logprob (recorded as None)."""
    opts = req.logprob
    if not opts.return_logprob or opts.logprob_start_len < 0 or req.is_retracted:
        return None
    prompt_len = len(req.input_ids)
    start = min(opts.logprob_start_len, prompt_len - 1)
    if start == 0 and num_cached == 0:
        req.input_token_logprobs.append((None, req.input_ids[0]))
        req.input_top_logprobs.append(None)
    first = max(num_cached, start - 1, 0)
    last = min(num_cached + chunk_len, prompt_len - 1)  # positions < last predict a prompt token
    if last <= first:
        return None
    return InputLogprobSpan(req, first, last - first, chunk_row + first - num_cached, first_logit)


def record_input_logprobs(spans: Sequence[InputLogprobSpan], logits: torch.Tensor) -> None:
    """Append prompt-token logprobs (and top-k) from the extra logits rows of one forward."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    for span in spans:
        rows = logprobs[span.first_logit : span.first_logit + span.count]
        targets = torch.tensor(span.req.input_ids[span.first_pos + 1 : span.first_pos + 1 + span.count])
        values = rows.gather(1, targets.unsqueeze(1)).squeeze(1).tolist()
        span.req.input_token_logprobs.extend(zip(values, targets.tolist()))
        k = span.req.logprob.top_logprobs_num
        if k > 0:
            top_v, top_i = top_logprobs(rows, k)
            for v, i in zip(top_v.tolist(), top_i.tolist()):
                span.req.input_top_logprobs.append(list(zip(v, i)))


def take_new_logprobs(req: Req) -> LogprobEntries:
    """The logprob entries recorded since the previous call (each list grows only at its end)."""
    lists = (req.input_token_logprobs, req.output_token_logprobs, req.input_top_logprobs, req.output_top_logprobs)
    entries = LogprobEntries(*(
        tuple(tuple(row) if isinstance(row, list) else row for row in values[start:])
        for values, start in zip(lists, req.num_logprobs_reported)
    ))
    req.num_logprobs_reported = tuple(len(values) for values in lists)  # type: ignore[assignment]
    return entries
