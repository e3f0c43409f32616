"""Logprob bookkeeping in SGLang's shapes: per token `(logprob, token_id)`, and per position the
top-k list of `(logprob, token_id)`; the HTTP layer adds the token text when asked."""

from __future__ import annotations

from collections.abc import Sequence

from radixlm.runtime.req import Req
from radixlm.runtime.sampler import SampleOutput, top_logprobs


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
