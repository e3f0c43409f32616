"""Request inputs in, result dicts out: the shapes of SGLang's /generate, shared by the Engine
and the server."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.errors import RequestError
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.req import Req


def normalize_inputs(
    prompt: str | Sequence[str] | None, input_ids: Sequence[int] | Sequence[Sequence[int]] | None
) -> tuple[bool, list[str | list[int]]]:
    """(is_batch, prompts): each prompt a str or a list of token ids."""
    if (prompt is None) == (input_ids is None):
        raise ValueError("pass exactly one of text/prompt or input_ids")
    if prompt is not None:
        if isinstance(prompt, str):
            return False, [prompt]
        if isinstance(prompt, Sequence) and prompt and all(isinstance(p, str) for p in prompt):
            return True, list(prompt)
        raise ValueError("text must be a string or a non-empty list of strings")
    assert input_ids is not None
    if isinstance(input_ids, Sequence) and input_ids and all(_is_token(t) for t in input_ids):
        return False, [list(input_ids)]  # type: ignore[arg-type]
    if (
        isinstance(input_ids, Sequence)
        and input_ids
        and all(isinstance(x, Sequence) and not isinstance(x, str) and all(_is_token(t) for t in x) for x in input_ids)
    ):
        return True, [list(x) for x in input_ids]  # type: ignore[union-attr]
    raise ValueError("input_ids must be a non-empty list of ints or a list of such lists")


def _is_token(t: object) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def normalize_params(
    sampling_params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None, count: int
) -> list[SamplingParams]:
    if sampling_params is None or isinstance(sampling_params, Mapping):
        one = SamplingParams.from_dict(sampling_params)
        return [one] * count
    if len(sampling_params) != count:
        raise ValueError(f"got {len(sampling_params)} sampling_params for {count} prompts")
    return [SamplingParams.from_dict(p) for p in sampling_params]


def build_result(req: Req, text: str) -> dict[str, Any]:
    """One /generate result: text, output_ids, meta_info (with logprob lists when asked)."""
    meta: dict[str, Any] = {
        "id": req.rid,
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "finish_reason": None if req.finish_reason is None else req.finish_reason.to_dict(),
    }
    if req.logprob.return_logprob:
        meta["input_token_logprobs"] = [list(x) for x in req.input_token_logprobs]
        meta["output_token_logprobs"] = [list(x) for x in req.output_token_logprobs]
        if req.logprob.top_logprobs_num > 0:
            meta["input_top_logprobs"] = [None if x is None else [list(p) for p in x] for x in req.input_top_logprobs]
            meta["output_top_logprobs"] = [[list(p) for p in x] for x in req.output_top_logprobs]
    return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}


def check_prompt_ids(ids: Sequence[object], vocab_size: int, context_len: int, max_total_tokens: int) -> None:
    """The checks every prompt passes before it is queued (RequestError, a ValueError, if not)."""
    bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"input_ids holds values that are not token ids in [0, {vocab_size}): {bad[:5]}")
    if not ids:
        raise RequestError("the prompt is empty: at least one input token is required")
    if len(ids) >= context_len:
        raise RequestError(f"the prompt has {len(ids)} tokens; the context length is {context_len}")
    if len(ids) + 1 > max_total_tokens:
        raise RequestError(f"the prompt has {len(ids)} tokens; the KV pool holds {max_total_tokens}")


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


@dataclass(frozen=True)
class GenerateRequest:
    """One generation request as the tokenizer manager takes it (a single prompt; batches and
    `n` are expanded by the HTTP layer into several of these)."""

    text: str | None = None
    input_ids: tuple[int, ...] | None = None
    sampling_params: Mapping[str, Any] | None = None
    rid: str | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
