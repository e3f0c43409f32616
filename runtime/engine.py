"""The in-process engine: `Engine(...).generate(...)` over the scheduler, no server, no zmq.

Flow: prompt -> Tokenizer.encode -> Req -> Scheduler.step() loop (ModelRunner.forward over the KV
pool, sampler) -> output ids -> Tokenizer.decode -> result dicts shaped like SGLang's /generate.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from radixlm.runtime.model_config import ModelConfig
from radixlm.runtime.model_runner import ModelRunner, RunnerConfig
from radixlm.runtime.req import Req
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.scheduler import Scheduler
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class Engine:
    """Load a model and generate in this process. `model_path=None` is the embedded default model."""

    def __init__(self, model_path: str | None = None, **kwargs: Any):
        from radixlm.runtime.model_files import load_state_dict, resolve_model_path

        self.server_args = ServerArgs(model_path=model_path, **kwargs)
        args = self.server_args
        model_dir = resolve_model_path(args.model_path)
        self.model_config = ModelConfig.from_dir(model_dir)
        self.tokenizer = Tokenizer(args.tokenizer_path or model_dir)
        context_len = min(args.context_length or self.model_config.context_len, self.model_config.context_len)
        max_total_tokens = args.max_total_tokens or _kv_tokens_from_memory(self.model_config, args)
        runner_cfg = RunnerConfig(
            dtype=args.torch_dtype,
            attention_backend=args.resolved_attention_backend,
            max_total_tokens=max_total_tokens,
            max_running_requests=args.max_running_requests,
            context_len=min(context_len, max_total_tokens),
            device=args.device,
        )
        self.runner = ModelRunner(self.model_config, runner_cfg, load_state_dict(model_dir))
        self.context_len = runner_cfg.context_len
        self.scheduler = Scheduler(self.runner, self.context_len, args.random_seed)
        self._eos_ids = frozenset(self.model_config.eos_token_ids) | (
            {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        )
        self._rid_counter = itertools.count()

    def generate(
        self,
        prompt: str | Sequence[str] | None = None,
        sampling_params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Generate for one request (a str / a list of ids) or a batch (a list of either)."""
        is_batch, prompts = _normalize_inputs(prompt, input_ids)
        params = _normalize_params(sampling_params, len(prompts))
        reqs = [self._make_req(p, sp) for p, sp in zip(prompts, params)]
        for req in reqs:
            self.scheduler.add_request(req)
        while not all(r.is_finished for r in reqs):
            self.scheduler.step()
        results = [self._result(r) for r in reqs]
        return results if is_batch else results[0]

    def shutdown(self) -> None:
        """Drop queued work and release the model's memory."""
        for req in list(self.scheduler.waiting) + list(self.scheduler.running):
            self.scheduler.abort(req.rid)
        while self.scheduler.has_work:
            self.scheduler.step()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _make_req(self, prompt: str | list[int], params: SamplingParams) -> Req:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"input_ids contains ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        return Req(str(next(self._rid_counter)), ids, params, self._eos_ids)

    def _result(self, req: Req) -> dict[str, Any]:
        assert req.finish_reason is not None
        text = self.tokenizer.decode(
            _strip_matched_stop(req),
            skip_special_tokens=req.params.skip_special_tokens,
            spaces_between_special_tokens=req.params.spaces_between_special_tokens,
        )
        return {
            "text": text,
            "output_ids": list(req.output_ids),
            "meta_info": {
                "id": req.rid,
                "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(req.output_ids),
                "cached_tokens": req.cached_tokens,
                "finish_reason": req.finish_reason.to_dict(),
            },
        }


def _strip_matched_stop(req: Req) -> list[int]:
    """Output ids without a final EOS / stop token (SGLang leaves it out of the text)."""
    reason = req.finish_reason
    if reason is not None and reason.type == "stop" and isinstance(reason.matched, int):
        return req.output_ids[:-1]
    return req.output_ids


def _normalize_inputs(
    prompt: str | Sequence[str] | None, input_ids: Sequence[int] | Sequence[Sequence[int]] | None
) -> tuple[bool, list[str | list[int]]]:
    if (prompt is None) == (input_ids is None):
        raise ValueError("pass exactly one of prompt or input_ids")
    if prompt is not None:
        if isinstance(prompt, str):
            return False, [prompt]
        if not all(isinstance(p, str) for p in prompt):
            raise ValueError("prompt must be a str or a list of str")
        return True, list(prompt)
    assert input_ids is not None
    if len(input_ids) > 0 and all(isinstance(t, int) for t in input_ids):
        return False, [list(input_ids)]  # type: ignore[arg-type]
    if all(isinstance(x, Sequence) and all(isinstance(t, int) for t in x) for x in input_ids):
        return True, [list(x) for x in input_ids]  # type: ignore[union-attr]
    raise ValueError("input_ids must be a list of ints or a list of lists of ints")


def _normalize_params(
    sampling_params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None, count: int
) -> list[SamplingParams]:
    if sampling_params is None or isinstance(sampling_params, Mapping):
        one = SamplingParams.from_dict(sampling_params)
        return [one] * count
    if len(sampling_params) != count:
        raise ValueError(f"got {len(sampling_params)} sampling_params for {count} prompts")
    return [SamplingParams.from_dict(p) for p in sampling_params]


def _kv_tokens_from_memory(cfg: ModelConfig, args: ServerArgs) -> int:
    """KV pool size from `mem_fraction_static` of the memory available now (CPU)."""
    from radixlm.runtime.mem_pool import KVPool

    available = _available_memory_bytes()
    per_token = KVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, args.torch_dtype)
    return max(1024, int(available * args.mem_fraction_static) // per_token)


def _available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30
