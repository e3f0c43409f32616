"""How `select` picks a choice from the model's log-probabilities of each choice's tokens.

A backend scores every choice after the same prompt (one batched request, the prompt's KV
computed once) and returns, per choice, the log-probabilities of the tokens that spell it
(`ChoiceScores`). A choices method then decides, with SGLang's protocol: an object called as
`method(*, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
unconditional_token_logprobs)` that returns a `ChoicesDecision`, and whose
`requires_unconditional_logprobs` tells the backend to score the choices without the prompt too
(token entries are SGLang's `[logprob, token_id, token_text]`). Subclass `ChoicesSamplingMethod`
to write one. The built-in methods, also accepted by their names:
- token_length_normalized (default): the highest mean log-probability per token;
- greedy_token_selection: compare the first tokens' log-probabilities, keep the best, go on to
  the next token among the tied, until one is left (a shorter choice continues with its own mean);
- unconditional_likelihood_normalized: the highest mean of log P(token | prompt) minus
  log P(token | no prompt), which discounts choices that are likely anywhere.
With temperature > 0 a built-in method samples from softmax(score / temperature) instead.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TokenEntry = Sequence[Any]  # [logprob, token_id, token_text] (the id or text may be None)


@dataclass
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] | None = None


class ChoicesSamplingMethod(ABC):
    """SGLang's protocol for a way to pick a choice from its token log-probabilities."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return False

    @abstractmethod
    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[TokenEntry]],
        output_token_logprobs: list[list[TokenEntry]],
        unconditional_token_logprobs: list[list[TokenEntry]] | None = None,
    ) -> ChoicesDecision: ...


class ScoredChoicesMethod(ChoicesSamplingMethod):
    """A built-in method: one score per choice, the highest wins (or sampled by temperature)."""

    name = ""

    @abstractmethod
    def scores(self, normalized: list[float], conditional: list[list[float]],
               unconditional: list[list[float]] | None) -> list[float]: ...

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[TokenEntry]],
        output_token_logprobs: list[list[TokenEntry]],
        unconditional_token_logprobs: list[list[TokenEntry]] | None = None,
    ) -> ChoicesDecision:
        unconditional = None if unconditional_token_logprobs is None else _values(unconditional_token_logprobs)
        values = self.scores(normalized_prompt_logprobs, _values(input_token_logprobs), unconditional)
        best = max(range(len(choices)), key=lambda i: (values[i], -i))
        meta = {
            "normalized_prompt_logprobs": normalized_prompt_logprobs,
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
            "scores": values,
        }
        if unconditional_token_logprobs is not None:
            meta["unconditional_token_logprobs"] = unconditional_token_logprobs
        return ChoicesDecision(choices[best], meta)

    def __repr__(self) -> str:
        return self.name


class TokenLengthNormalized(ScoredChoicesMethod):
    name = "token_length_normalized"

    def scores(self, normalized: list[float], conditional: list[list[float]],
               unconditional: list[list[float]] | None) -> list[float]:
        return list(normalized)


class GreedyTokenSelection(ScoredChoicesMethod):
    name = "greedy_token_selection"

    def scores(self, normalized: list[float], conditional: list[list[float]],
               unconditional: list[list[float]] | None) -> list[float]:
        """1.0 for the greedy winner, 0.0 for the others."""
        width = max((len(lp) for lp in conditional), default=0)
        padded = [list(lp) + [_mean(lp)] * (width - len(lp)) for lp in conditional]
        alive = list(range(len(conditional)))
        for position in range(width):
            best = max(padded[i][position] for i in alive)
            alive = [i for i in alive if padded[i][position] >= best - 1e-9]
            if len(alive) == 1:
                break
        return [1.0 if i == alive[0] else 0.0 for i in range(len(conditional))]


class UnconditionalLikelihoodNormalized(ScoredChoicesMethod):
    name = "unconditional_likelihood_normalized"

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def scores(self, normalized: list[float], conditional: list[list[float]],
               unconditional: list[list[float]] | None) -> list[float]:
        if unconditional is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional log-probabilities")
        return [_mean([c - u for c, u in zip(cond, uncond)]) for cond, uncond in zip(conditional, unconditional)]


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
BUILTIN_METHODS: dict[str, ScoredChoicesMethod] = {
    m.name: m for m in (token_length_normalized, greedy_token_selection, unconditional_likelihood_normalized)
}


def as_choices_method(method: Any) -> ChoicesSamplingMethod:
    """A method object from an object or a built-in method's name; ValueError otherwise."""
    if isinstance(method, str):
        if method not in BUILTIN_METHODS:
            raise ValueError(f"select: choices_method must be one of {', '.join(BUILTIN_METHODS)} "
                             f"or a ChoicesSamplingMethod, got {method!r}")
        return BUILTIN_METHODS[method]
    if isinstance(method, ChoicesSamplingMethod) or (callable(method) and hasattr(method, "requires_unconditional_logprobs")):
        return method  # type: ignore[no-any-return]
    raise ValueError(f"select: choices_method must be a ChoicesSamplingMethod (SGLang's protocol) or the name of "
                     f"a built-in one, got {method!r}")


def requires_unconditional(method: Any) -> bool:
    return bool(as_choices_method(method).requires_unconditional_logprobs)


@dataclass
class ChoiceScores:
    token_logprobs: list[list[float]]  # per choice, log P of each of its tokens after the prompt
    unconditional_logprobs: list[list[float]] | None = None  # the same without the prompt
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # the same as SGLang's [logprob, token_id, token_text] entries, where the backend has them
    token_entries: list[list[TokenEntry]] | None = None
    unconditional_entries: list[list[TokenEntry]] | None = None


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


def decide(choices: list[str], scores: ChoiceScores, method: Any, temperature: float = 0.0) -> tuple[int, dict[str, Any]]:
    """(index of the chosen choice, meta info: the method's, the scores, the token counts)."""
    chooser = as_choices_method(method)
    entries = scores.token_entries or _entries(scores.token_logprobs)
    unconditional = scores.unconditional_entries
    if unconditional is None and scores.unconditional_logprobs is not None:
        unconditional = _entries(scores.unconditional_logprobs)
    if chooser.requires_unconditional_logprobs and unconditional is None:
        raise ValueError(f"choices_method {chooser!r} needs unconditional log-probabilities, which were not computed")
    decision = chooser(
        choices=list(choices),
        normalized_prompt_logprobs=[_mean(lp) for lp in scores.token_logprobs],
        input_token_logprobs=entries,
        output_token_logprobs=[[] for _ in choices],  # scoring generates nothing
        unconditional_token_logprobs=unconditional,
    )
    if not isinstance(decision, ChoicesDecision) or decision.decision not in choices:
        raise ValueError(f"choices_method {chooser!r} must return a ChoicesDecision naming one of the choices, "
                         f"got {decision!r}")
    meta = {**(decision.meta_info or {}), "prompt_tokens": scores.prompt_tokens, "cached_tokens": scores.cached_tokens}
    index = choices.index(decision.decision)
    if temperature > 0:
        if not isinstance(chooser, ScoredChoicesMethod):
            raise ValueError("select: temperature > 0 samples by a built-in method's scores; "
                             f"{chooser!r} decides by itself (use temperature=0)")
        values = meta["scores"]
        top = max(values)
        weights = [math.exp((v - top) / temperature) for v in values]
        index = random.choices(range(len(choices)), weights)[0]
    return index, meta


def _entries(logprobs: list[list[float]]) -> list[list[TokenEntry]]:
    return [[[lp, None, None] for lp in choice] for choice in logprobs]


def _values(entries: list[list[TokenEntry]]) -> list[list[float]]:
    return [[float(e[0]) if e[0] is not None else 0.0 for e in choice] for choice in entries]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("-inf")
