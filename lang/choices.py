"""How `select` picks a choice from the model's log-probabilities of each choice's tokens.

A backend scores every choice after the same prompt (one batched request, the prompt's KV
computed once) and returns, per choice, the log-probabilities of the tokens that spell it
(`ChoiceScores`). The methods, as SGLang names them:
- token_length_normalized (default): the highest mean log-probability per token;
- greedy_token_selection: compare the first tokens' log-probabilities, keep the best, go on to
  the next token among the tied, until one is left (a choice that ends early loses a tie);
- unconditional_likelihood_normalized: the highest mean of log P(token | prompt) minus
  log P(token | no prompt), which discounts choices that are likely anywhere.
With temperature > 0 the choice is sampled from softmax(score / temperature) instead.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixlm.ir import GREEDY_TOKEN_SELECTION, TOKEN_LENGTH_NORMALIZED, UNCONDITIONAL_LIKELIHOOD_NORMALIZED


@dataclass
class ChoiceScores:
    token_logprobs: list[list[float]]  # per choice, log P of each of its tokens after the prompt
    unconditional_logprobs: list[list[float]] | None = None  # the same without the prompt
    prompt_tokens: int = 0
    cached_tokens: int = 0


def choice_token_span(token_texts: Sequence[str], choice: str) -> int:
    """How many tokens at the end of a scored sequence spell `choice` (the last tokens whose texts
    together cover its characters; a token straddling the prompt/choice boundary counts)."""
    covered, count = 0, 0
    for text in reversed(token_texts):
        if covered >= len(choice):
            break
        covered += len(text)
        count += 1
    return max(count, 1)


def decide(choices: list[str], scores: ChoiceScores, method: str, temperature: float = 0.0) -> tuple[int, dict[str, Any]]:
    """(index of the chosen choice, meta info with the per-choice scores)."""
    normalized = [_mean(lp) for lp in scores.token_logprobs]
    meta: dict[str, Any] = {
        "normalized_prompt_logprobs": normalized,
        "input_token_logprobs": scores.token_logprobs,
        "prompt_tokens": scores.prompt_tokens,
        "cached_tokens": scores.cached_tokens,
    }
    if method == TOKEN_LENGTH_NORMALIZED:
        values = normalized
    elif method == GREEDY_TOKEN_SELECTION:
        values = _greedy_rank(scores.token_logprobs)
    elif method == UNCONDITIONAL_LIKELIHOOD_NORMALIZED:
        if scores.unconditional_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional log-probabilities")
        values = [
            _mean([c - u for c, u in zip(cond, uncond)])
            for cond, uncond in zip(scores.token_logprobs, scores.unconditional_logprobs)
        ]
        meta["unconditional_token_logprobs"] = scores.unconditional_logprobs
    else:
        raise ValueError(f"unknown choices_method {method!r}")
    meta["scores"] = values
    if temperature > 0:
        top = max(values)
        weights = [math.exp((v - top) / temperature) for v in values]
        return random.choices(range(len(choices)), weights)[0], meta
    return max(range(len(choices)), key=lambda i: (values[i], -i)), meta


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("-inf")


def _greedy_rank(token_logprobs: list[list[float]]) -> list[float]:
    """1.0 for the greedy winner, 0.0 for the others (as scores for `decide`)."""
    alive = list(range(len(token_logprobs)))
    position = 0
    while len(alive) > 1:
        reaching = [i for i in alive if position < len(token_logprobs[i])]
        if not reaching:
            break
        best = max(token_logprobs[i][position] for i in reaching)
        alive = [i for i in reaching if token_logprobs[i][position] >= best - 1e-9]
        position += 1
    return [1.0 if i == alive[0] else 0.0 for i in range(len(token_logprobs))]
