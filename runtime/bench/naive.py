"""The naive baseline of the frontend workloads: a Backend that sends every program step to
Hugging Face transformers as an independent request over the full prompt.

This is how a program runs on a system without a prefix cache and without cross-program
batching: each `gen` is one `model.generate` call (greedy) over the state's whole text, each
`select` runs one forward per choice over prompt + choice, `cache_prefix` (fork, run_batch) does
nothing, and a lock lets one call at a time use the model, so concurrent program instances never
share a batch. `json_schema` / `regex` gens are masked token by token with the same compiled
grammar engine radixlm uses by default, built without jump-forward, as outlines does over
transformers. Only greedy decoding is supported (pass temperature=0): the baseline exists to be
compared with radixlm output for output.

Every call records its prompt and completion token counts in `stats` (all prompt tokens are
computed: nothing is cached).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from radixlm.backend.base import UNCONDITIONAL_PREFIX, Backend
from radixlm.choices import ChoiceScores, choice_token_span, decide
from radixlm.formats.chat_template import CHATML, derive_chat_template
from radixlm.ir import UNCONDITIONAL_LIKELIHOOD_NORMALIZED, Gen, SamplingArgs, Select

if TYPE_CHECKING:
    from radixlm.interpreter import StreamExecutor
    from radixlm.runtime.constrained.grammar import Grammar

# sampling arguments the baseline does not implement, with their neutral values (None: unset)
_NEUTRAL = {"min_new_tokens": 0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
            "presence_penalty": 0.0, "repetition_penalty": 1.0, "ignore_eos": False}


@dataclass
class CallStats:
    num_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class NaiveTransformersBackend(Backend):
    """`model_path=None`: the embedded default model (the directory radixlm converts it into)."""

    def __init__(self, model_path: str | None = None, dtype: str = "float32"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from radixlm.runtime.model.model_files import float_checkpoint_dir, resolve_model_path

        path = resolve_model_path(model_path)
        self.model_path = path
        torch_dtype = torch.float32 if dtype in ("auto", "float32") else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(float_checkpoint_dir(path), dtype=torch_dtype).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        eos = self.model.config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = sorted(eos_ids)  # as the Engine stops: the config's and the tokenizer's EOS
        template = None
        if self.tokenizer.chat_template is not None:
            template = derive_chat_template(
                lambda m: self.tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=False), "model"
            )
        self.chat_template = template or CHATML
        self.stats = CallStats()
        self._lock = threading.Lock()
        self._grammar_backend: Any = None

    # ------------------------------------------------------------------ program steps
    def generate(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> tuple[str, dict[str, Any]]:
        _check_greedy(gen, sampling)
        ids = self.tokenizer.encode(s.text_)
        grammar = self._grammar(sampling)
        stops = [sampling.stop] if isinstance(sampling.stop, str) else list(sampling.stop or [])
        with self._lock:
            out_ids = self._generate_ids(ids, sampling, grammar, stops)
            meta = self._record(len(ids), len(out_ids))
        finish = "length" if sampling.max_new_tokens is not None and len(out_ids) >= sampling.max_new_tokens else "stop"
        text = self.tokenizer.decode(out_ids, skip_special_tokens=True)
        hit = _first_stop(text, stops)
        if hit is not None:
            text, finish = text[:hit], "stop"
        elif out_ids and out_ids[-1] in self.eos_token_ids:
            finish = "stop"
        return text, {**meta, "finish_reason": {"type": finish}}

    def select(self, s: StreamExecutor, sel: Select) -> tuple[int, dict[str, Any]]:
        with self._lock:
            token_logprobs = [self._choice_logprobs(s.text_ + c, c) for c in sel.choices]
            scores = ChoiceScores(token_logprobs)
            if sel.choices_method == UNCONDITIONAL_LIKELIHOOD_NORMALIZED:
                scores.unconditional_logprobs = [self._choice_logprobs(UNCONDITIONAL_PREFIX + c, c) for c in sel.choices]
        return decide(sel.choices, scores, sel.choices_method, sel.temperature)

    def get_server_info(self) -> dict[str, Any]:
        return {"model_path": str(self.model_path), "naive_calls": vars(self.stats).copy()}

    # ------------------------------------------------------------------ model calls (under the lock)
    def _generate_ids(self, ids: list[int], sampling: SamplingArgs, grammar: Grammar | None, stops: list[str]) -> list[int]:
        input_ids = torch.tensor([ids])
        config = GenerationConfig(
            do_sample=False, max_new_tokens=sampling.max_new_tokens or 128,
            eos_token_id=self.eos_token_ids + list(sampling.stop_token_ids or []),
            pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_ids[0],
        )
        processors = LogitsProcessorList([_GrammarMask(grammar, len(ids), config.max_new_tokens)] if grammar else [])
        criteria = StoppingCriteriaList([_StopCheck(self.tokenizer, len(ids), stops, grammar, self.eos_token_ids)] if stops or grammar else [])
        with torch.inference_mode():
            out = self.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config,
                logits_processor=processors, stopping_criteria=criteria,
            )
        return [int(t) for t in out[0, len(ids) :].tolist()]

    def _choice_logprobs(self, text: str, choice: str) -> list[float]:
        """log P of the tokens spelling `choice` at the end of `text` (one full forward of `text`),
        picked as the native backends pick them from their input logprobs."""
        ids = self.tokenizer.encode(text)
        with torch.inference_mode():
            logits = self.model(torch.tensor([ids])).logits[0].float()
        logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
        texts = [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids[1:]]
        span = choice_token_span(texts, choice)
        self._record(len(ids), 0)
        return [float(v) for v in logprobs[-span:]]

    def _grammar(self, sampling: SamplingArgs) -> Grammar | None:
        if not sampling.json_schema and not sampling.regex:
            return None
        if self._grammar_backend is None:
            from radixlm.runtime.config.server_args import DEFAULT_GRAMMAR_BACKEND
            from radixlm.runtime.constrained import backends
            from radixlm.runtime.tokenizer.tokenizer import Tokenizer

            # the server's default engine, so both systems produce the same outputs
            self._grammar_backend = backends.create(
                DEFAULT_GRAMMAR_BACKEND, Tokenizer(self.model_path), self.model.config.vocab_size,
                num_workers=1, enable_jump_forward=False, whitespace_pattern=None)
        kind, spec = ("json_schema", sampling.json_schema) if sampling.json_schema else ("regex", sampling.regex)
        return self._grammar_backend.get(kind, spec).result().new_state()  # type: ignore[no-any-return]

    def _record(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        self.stats.num_calls += 1
        self.stats.prompt_tokens += prompt_tokens
        self.stats.completion_tokens += completion_tokens
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "cached_tokens": 0}

    def shutdown(self) -> None:
        if self._grammar_backend is not None:
            self._grammar_backend.shutdown()


class _GrammarMask(LogitsProcessor):
    """Logits processor: tokens the grammar forbids get -inf (its state advanced by _StopCheck),
    with the same budget steering as the Engine (the output completes within max_new_tokens)."""

    def __init__(self, grammar: Grammar, prompt_len: int, max_new_tokens: int):
        self.grammar = grammar
        self.prompt_len = prompt_len
        self.max_new_tokens = max_new_tokens

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        budget = self.max_new_tokens - (input_ids.shape[1] - self.prompt_len)
        allowed = torch.zeros((1, self.grammar.compiled.vocab_size), dtype=torch.bool)
        self.grammar.fill_vocab_masks(allowed, [], budget)
        scores = scores.masked_fill(~allowed[0, : scores.shape[-1]], float("-inf"))
        # an engine that steers after sampling (as the scheduler's `_steer_by_budget`): the greedy
        # token, replaced by the grammar's closing token when it could not finish after it
        greedy = int(scores[0].argmax())
        steered = self.grammar.budget_token(greedy, budget)
        if steered != greedy:
            scores = torch.full_like(scores, float("-inf"))
            scores[:, steered] = 0.0
        return scores


class _StopCheck(StoppingCriteria):
    """Stopping criterion: advances the grammar by each new token; stops when the grammar admits
    nothing more or a stop string appears in the decoded output."""

    def __init__(self, tokenizer: Any, prompt_len: int, stops: list[str], grammar: Grammar | None,
                 eos_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.prompt_len = prompt_len
        self.stops = stops
        self.grammar = grammar

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        new = input_ids[0, self.prompt_len :].tolist()
        done = False
        if self.grammar is not None and new:
            token = int(new[-1])
            if token not in self.eos_token_ids:  # EOS ends generation anyway
                self.grammar.accept_token(token)
                done = self.grammar.is_terminated()
        if self.stops and not done:
            done = _first_stop(self.tokenizer.decode(new, skip_special_tokens=True), self.stops) is not None
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool)


def _first_stop(text: str, stops: list[str]) -> int | None:
    """Where `text` is cut: the start of the stop string occurrence that ends first (the longer on
    a tie), as the Engine's detokenizer cuts; None if no stop string occurs."""
    best: tuple[int, int] | None = None
    for stop in stops:
        start = text.find(stop)
        if stop and start >= 0 and (best is None or (start + len(stop), start) < best):
            best = (start + len(stop), start)
    return None if best is None else best[1]


def _check_greedy(gen: Gen, sampling: SamplingArgs) -> None:
    if sampling.temperature is None or sampling.temperature > 1e-6:
        raise ValueError("the naive baseline decodes greedily only: run the program with temperature=0")
    unsupported = [name for name, neutral in _NEUTRAL.items() if getattr(sampling, name) not in (None, neutral)]
    if gen.return_logprob or unsupported:
        raise ValueError(f"the naive baseline does not support {unsupported or ['return_logprob']}")
