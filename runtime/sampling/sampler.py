"""Batched sampling: one call picks the next token of every request, each with its own params.

Flow of one decode step (the sampler's part):
  SamplingBatch.build(params, num_output_tokens, ..., output_token_counts=...)   once per step
  sample(logits[B, V], batch, vocab_mask=...)       after the model's forward
    1. penalties: frequency, presence (additive), then repetition (scaling), output tokens only;
       the results clamped finite (a repetition penalty that is 0 in float32 divides by 0)
    2. vocab_mask (constrained decoding)       masked-out tokens -> -inf
    3. min_new_tokens: EOS and stop_token_ids -> -inf while too few tokens were generated
    4. all-greedy batch: argmax, done
    5. temperature; softmax; top-k / top-p / min-p filtering (only if some row uses them)
    6. draw: argmax(probs / E) with E ~ Exp(1) noise, which samples exactly from probs; seeded
       rows draw their noise from their own generator, seeded by (seed, tokens generated so far)
    7. greedy rows of a mixed batch take the argmax of step 2-3's logits

Logprob convention (SGLang's default, i.e. without SGLANG_RETURN_ORIGINAL_LOGPROB): the reported
logprobs are `log_softmax(logits / temperature)` of the logits after steps 1-3, *before* the
top-k / top-p / min-p filter; greedy rows use temperature 1. Masked tokens have logprob -inf.

Repetition penalty scope (SGLang's, unlike Hugging Face's prompt + output): only tokens in the
request's *generated output* are penalized, as are frequency and presence penalties.

Penalty counts are per request and incremental: a request with penalties owns a float32[V]
count of its output (`count_tokens` once, then `counts[token] += 1` as each token is accepted);
`SamplingBatch.build` gathers the rows' counts into the step's [B, V], so no step recounts an
output. (A batched sampler may later keep these rows in one tensor per running batch.)
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from radixlm.runtime.sampling.sampling_params import SamplingParams

_MASK64 = (1 << 64) - 1


class SampleOutput(NamedTuple):
    """Result of `sample`. `logprobs` / `vocab_logprobs` are None unless `return_logprob`."""

    next_ids: torch.Tensor  # int64[B]
    logprobs: torch.Tensor | None  # float32[B]: logprob of next_ids[i] (convention above)
    vocab_logprobs: torch.Tensor | None  # float32[B, V]: the full distribution it came from


@dataclass(frozen=True)
class SamplingBatch:
    """Per-row sampling tensors of one step, all on one device, B rows, V = vocab_size.

    Valid only for the step it was built for: penalty counts and seeded generators depend on
    the tokens generated so far. Fields that no row needs are None, and the `need_*` flags tell
    `sample` which stages to run at all.
    """

    vocab_size: int
    temperatures: torch.Tensor  # float32[B, 1]; 1.0 on greedy rows
    top_ps: torch.Tensor  # float32[B, 1]
    top_ks: torch.Tensor  # int64[B, 1]; vocab_size where top-k is off
    min_ps: torch.Tensor  # float32[B, 1]
    is_greedy_rows: torch.Tensor  # bool[B]
    output_token_counts: torch.Tensor | None  # float32[B, V]: times each token was generated
    frequency_penalties: torch.Tensor | None  # float32[B, 1]
    presence_penalties: torch.Tensor | None  # float32[B, 1]
    repetition_penalties: torch.Tensor | None  # float32[B, 1]
    banned_rows: torch.Tensor | None  # int64[N]: (row, token) pairs masked by min_new_tokens
    banned_ids: torch.Tensor | None  # int64[N]
    seeds: tuple[int | None, ...]  # per row; None for unseeded and for greedy rows
    num_output_tokens: tuple[int, ...]  # per row: tokens generated before this step
    is_all_greedy: bool
    has_greedy_rows: bool
    has_unseeded_sampled_rows: bool  # some row draws from the shared generator
    need_top_k: bool
    need_top_p: bool
    need_min_p: bool
    max_top_k: int  # max top_k over rows that use it (vocab_size if none)

    @property
    def batch_size(self) -> int:
        return len(self.seeds)

    @property
    def need_penalties(self) -> bool:
        return self.output_token_counts is not None

    @property
    def has_seeded_rows(self) -> bool:
        """Some sampled (non-greedy) row has its own seed."""
        return any(seed is not None for seed in self.seeds)

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        num_output_tokens: Sequence[int],
        vocab_size: int,
        device: torch.device | str = "cpu",
        eos_token_ids: Sequence[Collection[int]] | None = None,
        output_token_counts: Sequence[torch.Tensor | None] | None = None,
        extra_counted_ids: Sequence[Sequence[int]] | None = None,
    ) -> SamplingBatch:
        """Tensors for one step. `num_output_tokens[i]`: tokens row i's request generated so far.

        `eos_token_ids[i]`: row i's EOS ids (model/tokenizer EOS); together with its
        `stop_token_ids` they are masked while fewer than `min_new_tokens` were generated
        (SGLang masks them even with `ignore_eos`). Ids >= vocab_size are ignored.
        Penalties: `output_token_counts[i]` is the float32[V] count of row i's output on `device`
        (required for rows with penalties, None = zeros elsewhere; several rows may share one),
        and `extra_counted_ids[i]` tokens row i counts on top of it (a jump-forward draft row:
        the draft tokens before its position). Neither is modified.
        """
        num_rows = len(params)
        if len(num_output_tokens) != num_rows or (eos_token_ids is not None and len(eos_token_ids) != num_rows):
            raise ValueError("SamplingBatch.build: params, num_output_tokens, eos_token_ids differ in length")
        greedy = [p.is_greedy for p in params]
        top_ks = [vocab_size if p.top_k == -1 else min(p.top_k, vocab_size) for p in params]
        used_top_ks = [k for k, p in zip(top_ks, params, strict=True) if p.top_k != -1 and not p.is_greedy]

        def column(values: Sequence[float | int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device).view(num_rows, 1)

        counts, freq, pres, rep = _penalty_tensors(params, output_token_counts, extra_counted_ids, vocab_size, device)
        banned_rows, banned_ids = _min_new_tokens_pairs(params, num_output_tokens, eos_token_ids, vocab_size, device)
        sampled = [p for p in params if not p.is_greedy]
        return cls(
            vocab_size=vocab_size,
            temperatures=column(
                [1.0 if g else p.temperature for g, p in zip(greedy, params, strict=True)], torch.float32
            ),
            top_ps=column([p.top_p for p in params], torch.float32),
            top_ks=column(top_ks, torch.int64),
            min_ps=column([p.min_p for p in params], torch.float32),
            is_greedy_rows=torch.tensor(greedy, dtype=torch.bool, device=device),
            output_token_counts=counts,
            frequency_penalties=freq,
            presence_penalties=pres,
            repetition_penalties=rep,
            banned_rows=banned_rows,
            banned_ids=banned_ids,
            seeds=tuple(None if g else p.seed for g, p in zip(greedy, params, strict=True)),
            num_output_tokens=tuple(num_output_tokens),
            is_all_greedy=all(greedy),
            has_greedy_rows=any(greedy),
            has_unseeded_sampled_rows=any(p.seed is None for p in sampled),
            need_top_k=bool(used_top_ks),
            need_top_p=any(p.top_p < 1.0 for p in sampled),
            need_min_p=any(p.min_p > 0.0 for p in sampled),
            max_top_k=max(used_top_ks, default=vocab_size),
        )


def has_penalties(params: SamplingParams) -> bool:
    """True when a request's output changes its logits (it needs penalty counts)."""
    return params.frequency_penalty != 0.0 or params.presence_penalty != 0.0 or params.repetition_penalty != 1.0


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """int64[B]: the index of each row's maximum of `x[B, V]`, as `x.argmax(dim=-1)` (the first
    index of the maximum; a row with a NaN gives its first NaN). A float32 CPU tensor goes through
    numpy, whose argmax is vectorized: over the default model's 49,152-token rows on 2 cores, 5 us
    for one row and 0.22 ms for 32, where torch's took 86 us and 1.55 ms (~3% of a 32-row decode
    step, all greedy). Anything else (bf16, CUDA) is torch's."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] > 0:
        return torch.from_numpy(x.numpy().argmax(axis=1).astype("int64", copy=False))
    return x.argmax(dim=-1)


def count_tokens(token_ids: Sequence[int], vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """float32[V]: times each id occurs in `token_ids` (all < vocab_size). A request's penalty
    counts start as this, once; then the owner adds 1 per accepted token (`counts[token] += 1`)."""
    counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
    if token_ids:
        ids = torch.tensor(list(token_ids), dtype=torch.int64, device=device)
        counts.index_put_((ids,), torch.ones_like(ids, dtype=torch.float32), accumulate=True)
    return counts


def _penalty_tensors(
    params: Sequence[SamplingParams],
    output_token_counts: Sequence[torch.Tensor | None] | None,
    extra_counted_ids: Sequence[Sequence[int]] | None,
    vocab_size: int,
    device: torch.device | str,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(counts[B, V], frequency[B, 1], presence[B, 1], repetition[B, 1]), all None if unused.

    counts is a fresh tensor: the rows' own counts are gathered (copied), never written. Rows
    without penalties may count zeros: their 0 / 0 / 1 penalties leave the logits bit-identical.
    """
    if not any(has_penalties(p) for p in params):
        return None, None, None, None
    num_rows = len(params)
    if output_token_counts is None or len(output_token_counts) != num_rows:
        raise ValueError("SamplingBatch.build: penalties need output_token_counts, one per row")
    if any(c is None and has_penalties(p) for p, c in zip(params, output_token_counts)):
        raise ValueError("SamplingBatch.build: a row with penalties has no output_token_counts")
    zeros = torch.zeros(vocab_size, dtype=torch.float32, device=device)
    counts = torch.stack([zeros if c is None else c for c in output_token_counts])
    if extra_counted_ids is not None:
        rows = [i for i, ids in enumerate(extra_counted_ids) for _ in ids]
        if rows:
            cols = torch.tensor([t for ids in extra_counted_ids for t in ids], dtype=torch.int64, device=device)
            rows_t = torch.tensor(rows, dtype=torch.int64, device=device)
            counts.index_put_((rows_t, cols), torch.ones_like(cols, dtype=torch.float32), accumulate=True)

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device).view(num_rows, 1)

    return (
        counts,
        column([p.frequency_penalty for p in params]),
        column([p.presence_penalty for p in params]),
        column([p.repetition_penalty for p in params]),
    )


def _min_new_tokens_pairs(
    params: Sequence[SamplingParams],
    num_output_tokens: Sequence[int],
    eos_token_ids: Sequence[Collection[int]] | None,
    vocab_size: int,
    device: torch.device | str,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(rows, ids) of the stop tokens to mask this step; (None, None) when there are none."""
    rows: list[int] = []
    ids: list[int] = []
    for i, p in enumerate(params):
        if num_output_tokens[i] >= p.min_new_tokens:
            continue
        stop_ids = set(p.stop_token_ids) | set(eos_token_ids[i] if eos_token_ids is not None else ())
        for token_id in sorted(stop_ids):
            if 0 <= token_id < vocab_size:
                rows.append(i)
                ids.append(token_id)
    if not rows:
        return None, None
    return (
        torch.tensor(rows, dtype=torch.int64, device=device),
        torch.tensor(ids, dtype=torch.int64, device=device),
    )


def apply_penalties_(
    logits: torch.Tensor,
    output_token_counts: torch.Tensor,
    frequency_penalties: torch.Tensor,
    presence_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
) -> torch.Tensor:
    """Penalize `logits[B, V]` in place (and return it), SGLang's rules, per row i:

    logit -= frequency[i] * count + presence[i] * (count > 0); then, for tokens with
    count > 0, logit *= repetition[i] if logit < 0 else logit /= repetition[i].
    `output_token_counts[B, V]` counts tokens of the generated output only; penalties are [B, 1].
    """
    appeared = output_token_counts > 0
    logits.sub_(frequency_penalties * output_token_counts + presence_penalties * appeared)
    scale = torch.where(appeared, repetition_penalties, 1.0)
    logits.copy_(torch.where(logits < 0, logits * scale, logits / scale))
    return logits


def filter_probs(probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Zero the probabilities outside each row's top-k, top-p nucleus and min-p set.

    `probs[B, V]` is not modified; the result is unnormalized. Top-p is measured on the full
    (pre-top-k) distribution and keeps every token whose preceding cumulative mass is <= top_p,
    so the most likely token always survives; min-p keeps tokens with p >= min_p * max(p).
    Ties are broken by a stable sort, so a row's result never depends on the other rows.
    """
    if batch.need_top_k or batch.need_top_p:
        probs = _top_k_top_p(probs, batch)
    if batch.need_min_p:
        threshold = probs.amax(dim=-1, keepdim=True) * batch.min_ps
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


def _top_k_top_p(probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    vocab_size = probs.shape[-1]
    # torch.topk's tie order may depend on k, a batch-wide value: seeded rows need the full
    # stable sort so their result is independent of the other rows.
    use_partial = not batch.need_top_p and not batch.has_seeded_rows and batch.max_top_k < vocab_size
    if use_partial:
        sorted_probs, sorted_ids = probs.topk(batch.max_top_k, dim=-1)
    else:
        sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(sorted_probs.shape[-1], device=probs.device)
    drop = ranks >= batch.top_ks
    if batch.need_top_p:
        cumulative = sorted_probs.cumsum(dim=-1)
        drop |= ((cumulative - sorted_probs) > batch.top_ps) & (batch.top_ps < 1.0)
    kept = torch.zeros_like(probs).scatter_(1, sorted_ids, sorted_probs.masked_fill(drop, 0.0))
    if use_partial:  # rows without top-k were truncated to max_top_k: restore them
        kept = torch.where(batch.top_ks < vocab_size, kept, probs)
    return kept


def mix_seed(seed: int, num_output_tokens: int) -> int:
    """The generator seed of a seeded request at one step: splitmix64 of (seed, step)."""
    z = ((seed & _MASK64) * 0x9E3779B97F4A7C15 + num_output_tokens + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _exponential_noise(
    probs: torch.Tensor, batch: SamplingBatch, generator: torch.Generator | None
) -> torch.Tensor:
    """Exp(1) noise [B, V]: seeded rows from their own generator, others from `generator`.

    Greedy rows may hold garbage (their draw is discarded). Clamped away from 0 so that
    probs / noise is never 0 / 0.
    """
    noise = torch.empty_like(probs)
    if batch.has_unseeded_sampled_rows:
        noise.exponential_(generator=generator)
    for i, seed in enumerate(batch.seeds):
        if seed is not None:
            row_generator = torch.Generator(device=probs.device)
            row_generator.manual_seed(mix_seed(seed, batch.num_output_tokens[i]))
            noise[i].exponential_(generator=row_generator)
    return noise.clamp_(min=torch.finfo(noise.dtype).tiny)


MAX_LOGIT = 1e30  # divided by the smallest non-greedy temperature (1e-6), still finite in float32


def _adjusted_logits(
    logits: torch.Tensor, batch: SamplingBatch, vocab_mask: torch.Tensor | None
) -> torch.Tensor:
    """Float32 logits after the vocab mask, penalties and min_new_tokens; the input is not modified."""
    if vocab_mask is None and not batch.need_penalties and batch.banned_rows is None:
        return logits.float()
    logits = logits.to(torch.float32, copy=True)
    if batch.output_token_counts is not None:
        assert batch.frequency_penalties is not None and batch.presence_penalties is not None
        assert batch.repetition_penalties is not None
        apply_penalties_(
            logits,
            batch.output_token_counts,
            batch.frequency_penalties,
            batch.presence_penalties,
            batch.repetition_penalties,
        )
        # A repetition penalty near 0 (valid: (0, 2]) is 0 in float32: logit / 0 = inf, and
        # inf / temperature or inf - inf in the softmax would be NaN. Keep every logit finite.
        logits.nan_to_num_(nan=float("-inf"), posinf=MAX_LOGIT).clamp_(max=MAX_LOGIT)
    if vocab_mask is not None:  # after the penalties, which must not turn a masked -inf into NaN
        logits.masked_fill_(~vocab_mask, float("-inf"))
    if batch.banned_rows is not None and batch.banned_ids is not None:
        logits[batch.banned_rows, batch.banned_ids] = float("-inf")
    return logits


def sample(
    logits: torch.Tensor,
    batch: SamplingBatch,
    *,
    vocab_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    return_logprob: bool = False,
) -> SampleOutput:
    """Pick the next token of each of the B rows of `logits[B, V]` (any float dtype; not modified).

    `vocab_mask[B, V]` bool, True = allowed; every row must allow at least one token.
    `generator` drives unseeded rows (None = torch's default generator of the device); seeded
    rows ignore it, so their tokens depend only on (seed, tokens generated so far, their
    logits row). An all-greedy batch without logprobs costs one argmax and draws no randomness.
    See the module docstring for the stage order and the logprob convention.
    """
    if logits.dim() != 2 or logits.shape != (batch.batch_size, batch.vocab_size):
        raise ValueError(f"sample: logits {tuple(logits.shape)} != ({batch.batch_size}, {batch.vocab_size})")
    if vocab_mask is not None and (vocab_mask.shape != logits.shape or vocab_mask.dtype != torch.bool):
        raise ValueError(f"sample: vocab_mask must be bool{tuple(logits.shape)}")
    logits = _adjusted_logits(logits, batch, vocab_mask)
    if batch.is_all_greedy:
        next_ids = argmax_rows(logits)
        return _output(next_ids, torch.log_softmax(logits, dim=-1) if return_logprob else None)

    scaled = logits / batch.temperatures
    vocab_logprobs = torch.log_softmax(scaled, dim=-1) if return_logprob else None
    probs = vocab_logprobs.exp() if vocab_logprobs is not None else torch.softmax(scaled, dim=-1)
    probs = filter_probs(probs, batch)
    next_ids = argmax_rows(probs / _exponential_noise(probs, batch, generator))
    if batch.has_greedy_rows:
        next_ids = torch.where(batch.is_greedy_rows, argmax_rows(logits), next_ids)
    return _output(next_ids, vocab_logprobs)


def _output(next_ids: torch.Tensor, vocab_logprobs: torch.Tensor | None) -> SampleOutput:
    if vocab_logprobs is None:
        return SampleOutput(next_ids, None, None)
    logprobs = vocab_logprobs.gather(1, next_ids.unsqueeze(1)).squeeze(1)
    return SampleOutput(next_ids, logprobs, vocab_logprobs)


def top_logprobs(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest logprobs of a row [V] or batch [B, V], and their token ids (int64).

    Sorted descending along the last dim; k is clamped to [0, V]. For per-request
    `top_logprobs_num` in one batch, call with the largest k and slice each row.
    """
    k = max(0, min(k, logprobs.shape[-1]))
    values, ids = torch.topk(logprobs, k, dim=-1, sorted=True)
    return values, ids
