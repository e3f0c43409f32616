"""The front door, one for the Engine and the HTTP server: a /generate request's fields ->
validated, tokenized `PreparedRequest`s, one per prompt and copy (`n`), with the copies' seeds.
Both doors call `parse_generate` and `RequestValidator.validate`, so the same bad input gets
the same error text (a `RequestError`, answered 400 by the server) from either.

Flow: body (JSON object or Engine keywords) -> parse_generate -> GenerateRequest per sequence
-> RequestValidator.validate (tokenize, check against the model, SamplingParams built once)
-> PreparedRequest -> the scheduler (in process, or as a TokenizedGenerateReq message).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from radixlm.runtime.api.errors import RequestError
from radixlm.runtime.api.protocol import GenerateReqInput, parse_body
from radixlm.runtime.api.protocol_sglang import SGLANG_SAMPLING_FIELDS
from radixlm.runtime.config.limits import MAX_BATCH, MAX_N, MAX_RID_CHARS, MAX_SEQUENCES, MAX_TOP_LOGPROBS_NUM
from radixlm.runtime.config.server_args import DEFAULT_GRAMMAR_BACKEND
from radixlm.runtime.constrained.backends import validate as validate_grammar
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.lowered import LoweredGrammar
from radixlm.runtime.sampling.sampling_params import InvalidSamplingParams, SamplingParams
from radixlm.runtime.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True)
class GenerateRequest:
    """One sequence to generate, as the door takes it (a single prompt; batches and `n` are
    expanded by `parse_generate` / `expand_copies` into several of these)."""

    text: str | None = None
    input_ids: tuple[int, ...] | None = None
    sampling_params: Mapping[str, Any] | None = None
    rid: str | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    require_reasoning: bool = False  # SGLang's: the output starts with reasoning (see --reasoning-parser)
    log_metrics: bool = True  # counted in /metrics
    data_parallel_rank: int | None = None  # SGLang's: run on this rank (None: the load balancer picks)
    cache_salt: str | None = None  # the prefix-cache namespace: no prefix is shared across salts


@dataclass(frozen=True)
class PreparedRequest:
    """A validated, tokenized request: what the scheduler gets."""

    request: GenerateRequest
    input_ids: list[int]
    params: SamplingParams
    grammar: LoweredGrammar | None = None  # its grammar as the door lowered it, compiled as is


def parse_generate(body: Any) -> tuple[list[GenerateRequest], bool]:
    """The /generate body -> one GenerateRequest per prompt and copy (`n`), prompt-major. Shape
    and types are the contract's (`protocol.GenerateReqInput`); the rest is checked here."""
    req: GenerateReqInput = parse_body(GenerateReqInput, body)
    if (req.text is None) == (req.input_ids is None):
        raise RequestError("exactly one of 'text' and 'input_ids' is required")
    if req.text is not None:
        is_batch = isinstance(req.text, list)
        prompts: list[Any] = req.text if is_batch else [req.text]
        if not prompts:
            raise RequestError("'text' must be a string or a non-empty list of strings")
    else:
        ids = req.input_ids or []
        is_batch = bool(ids) and isinstance(ids[0], list)
        prompts = ids if is_batch else [ids]
    if len(prompts) > MAX_BATCH:
        raise RequestError(f"a batch holds at most {MAX_BATCH} prompts, got {len(prompts)}")
    params_list = _per_prompt(req.sampling_params, len(prompts), "sampling_params")
    rids = _per_prompt(req.rid, len(prompts), "rid")
    if is_batch and isinstance(req.rid, str):
        raise RequestError("a batch needs 'rid' as a list with one id per prompt")
    if any(rid is not None and len(rid) > MAX_RID_CHARS for rid in rids):
        raise RequestError(f"'rid' is longer than {MAX_RID_CHARS} characters")
    params_dicts = [None if p is None else p.model_dump(exclude_unset=True, exclude=SGLANG_SAMPLING_FIELDS)
                    for p in params_list]  # SGLang's fields that have no effect here stay out
    copies = [_num_copies(params) for params in params_dicts]
    if sum(copies) > MAX_SEQUENCES:
        raise RequestError(f"a request generates at most {MAX_SEQUENCES} sequences (prompts x n), got {sum(copies)}")
    per_prompt_opts = {name: _per_prompt(getattr(req, name), len(prompts), name) for name in _OPTIONS}
    reqs = []
    for i, (prompt, params, rid, n) in enumerate(zip(prompts, params_dicts, rids, copies)):
        opts = {name: values[i] for name, values in per_prompt_opts.items() if values[i] is not None}
        params = {k: v for k, v in (params or {}).items() if k != "n"}
        key = "text" if isinstance(prompt, str) else "input_ids"
        value = prompt if isinstance(prompt, str) else tuple(prompt)
        reqs += expand_copies(GenerateRequest(**{key: value}, sampling_params=params, rid=rid,
                                              log_metrics=req.log_metrics, data_parallel_rank=requested_rank(req),
                                              **opts), n)
    return reqs, is_batch or len(reqs) > 1


_OPTIONS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "stream",
            "require_reasoning", "cache_salt")


def _num_copies(params: dict[str, Any] | None) -> int:
    n = (params or {}).get("n")
    n = 1 if n is None else n
    if not 1 <= n <= MAX_N:
        raise RequestError(f"sampling_params.n must be an integer in [1, {MAX_N}], got {n!r}")
    return int(n)


def _per_prompt(value: Any, count: int, name: str) -> list[Any]:
    """One value for all prompts, or a list with one per prompt."""
    if not isinstance(value, list):
        return [value] * count
    if len(value) != count:
        raise RequestError(f"'{name}' must be one value or a list of {count} (one per prompt), got {len(value)}")
    return value


def requested_rank(req: Any) -> int | None:
    """The data-parallel rank a request asks for (SGLang's `data_parallel_rank`, or its newer
    `routed_dp_rank`), if any."""
    return req.data_parallel_rank if req.data_parallel_rank is not None else req.routed_dp_rank


def expand_copies(base: GenerateRequest, n: int) -> list[GenerateRequest]:
    """The `n` copies of one prompt's request: seeds `copy_seed(seed, i)` (so copies of a seeded
    request differ, reproducibly) and rids `<rid>-<i>` when a rid was given."""
    if n == 1:
        return [base]
    params = dict(base.sampling_params or {})
    params.pop("n", None)
    copies = []
    for i in range(n):
        copy_params = params
        if isinstance(params.get("seed"), int):
            copy_params = {**params, "seed": copy_seed(params["seed"], i)}
        copies.append(replace(base, sampling_params=copy_params, rid=None if base.rid is None else f"{base.rid}-{i}"))
    return copies


class RequestValidator:
    """Tokenizes and checks requests against one model (its tokenizer, vocabulary, context
    length and KV pool size) and its grammar backend (with the server's JSON whitespace pattern)."""

    def __init__(self, tokenizer: Tokenizer, context_len: int, vocab_size: int, max_total_num_tokens: int,
                 grammar_backend: str = DEFAULT_GRAMMAR_BACKEND, whitespace_pattern: str | None = None):
        self.tokenizer = tokenizer
        self.grammar_backend = grammar_backend
        self.whitespace_pattern = whitespace_pattern
        self.context_len = context_len
        self.vocab_size = vocab_size
        self.max_total_num_tokens = max_total_num_tokens
        # A token spells at most this many characters, so a longer text cannot fit the context:
        # such prompts are refused before tokenizing them (which would block the event loop).
        self.max_prompt_chars = context_len * max_token_chars(tokenizer)
        # An empty text prompt ("", which the documents allow) starts from the start-of-text
        # token, as OpenAI's completions take "": the BOS token, else (GPT-style) the EOS token.
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self.empty_text_ids = [start] if start is not None else []

    def validate(self, req: GenerateRequest) -> PreparedRequest:
        """Tokenize and check a request; raises RequestError naming the problem."""
        if (req.text is None) == (req.input_ids is None):
            raise RequestError("exactly one of 'text' and 'input_ids' is required")
        if req.text is not None:
            if not isinstance(req.text, str):
                raise RequestError("'text' must be a string or a list of strings")
            if len(req.text) > self.max_prompt_chars:
                raise RequestError(
                    f"the prompt has {len(req.text)} characters, more than the context length "
                    f"({self.context_len} tokens) can hold"
                )
            ids = self.tokenizer.encode(req.text) or list(self.empty_text_ids)
        else:
            ids = list(req.input_ids or ())
        check_prompt_ids(ids, self.vocab_size, self.context_len, self.max_total_num_tokens)
        try:
            params = SamplingParams.from_dict(req.sampling_params)
        except (InvalidSamplingParams, TypeError) as e:
            raise RequestError(str(e)) from e
        check_params_fit(params, len(ids), self.context_len, self.vocab_size)
        grammar = None
        for kind, spec in (("regex", params.regex), ("json_schema", params.json_schema), ("ebnf", params.ebnf),
                           ("structural_tag", params.structural_tag)):
            if spec:
                try:
                    grammar = validate_grammar(self.grammar_backend, kind, spec, self.whitespace_pattern)
                except GrammarError as e:
                    raise RequestError(f"sampling_params.{kind}: {e}") from e
        if params.n != 1:
            raise RequestError("sampling_params.n > 1 must be expanded before validation (parse_generate)")
        if req.top_logprobs_num < 0 or req.top_logprobs_num > MAX_TOP_LOGPROBS_NUM:
            raise RequestError(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS_NUM}]")
        if req.logprob_start_len < -1 or req.logprob_start_len >= len(ids):
            raise RequestError(f"logprob_start_len must be in [-1, {len(ids) - 1}]")
        return PreparedRequest(req, ids, params, grammar)


def max_token_chars(tokenizer: Tokenizer) -> int:
    """The most characters one token of `tokenizer` spells (byte-level BPE: one per byte)."""
    tokens = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
    return max((len(t) for t in tokens if t is not None), default=1)


def check_prompt_ids(ids: Sequence[object], vocab_size: int, context_len: int, max_total_num_tokens: int) -> None:
    """The checks every prompt passes before it is queued (RequestError, a ValueError, if not)."""
    bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"input_ids holds values that are not token ids in [0, {vocab_size}): {bad[:5]}")
    if not ids:
        raise RequestError("the prompt is empty: at least one input token is required")
    if len(ids) >= context_len:
        raise RequestError(f"the prompt has {len(ids)} tokens; the context length is {context_len}")
    if len(ids) + 1 > max_total_num_tokens:
        raise RequestError(f"the prompt has {len(ids)} tokens; the KV pool holds {max_total_num_tokens}")


def copy_seed(seed: Any, copy: int) -> Any:
    """The seed of copy `copy` of an `n` > 1 request: seed + copy, wrapped into the int64 range
    (a seed near 2**63 - 1 stays a valid seed). Non-int seeds are left for validation to refuse."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not -(2**63) <= seed < 2**63:
        return seed
    return (seed + copy + 2**63) % 2**64 - 2**63


def check_params_fit(params: SamplingParams, prompt_len: int, context_len: int, vocab_size: int) -> None:
    """The checks of sampling parameters against the model (RequestError if one fails): the
    prompt plus `max_new_tokens` fit the context length; stop token ids are token ids."""
    max_new = params.max_new_tokens
    if max_new is not None and prompt_len + max_new > context_len:
        raise RequestError(  # worded as SGLang's, which clients recognize
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens: "
            f"the prompt has {prompt_len} tokens and max_new_tokens (OpenAI: max_tokens) asks for {max_new} "
            f"more, {prompt_len + max_new} in all. Ask for at most {context_len - prompt_len}, or leave it unset"
        )
    bad = [t for t in params.stop_token_ids if t >= vocab_size]
    if bad:
        raise RequestError(
            f"sampling_params.stop_token_ids holds values that are not token ids in [0, {vocab_size}): {bad[:5]}"
        )
