"""The in-process engine: `Engine(...).generate(...)` over the scheduler, no server, no zmq.

Flow: prompt -> Tokenizer.encode -> Req (+ IncrementalDecoder) -> Scheduler.step() loop
(ModelRunner.forward over the KV pool, sampler) -> output ids and text -> result dicts shaped
like SGLang's /generate. Any thread may call `generate`; steps are serialised by one lock, and
whichever caller holds it steps for everyone, so concurrent callers share batches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from radixlm.runtime.envs import set_omp_defaults

set_omp_defaults()  # before the imports below load torch

from radixlm.runtime.request_io import (  # noqa: E402
    build_result,
    check_prompt_ids,
    normalize_inputs,
    normalize_params,
)
from radixlm.runtime.scheduler.req import LogprobOptions, Req  # noqa: E402
from radixlm.runtime.scheduler.scheduler_stack import SchedulerStack  # noqa: E402
from radixlm.runtime.server_args import ServerArgs  # noqa: E402


class Engine:
    """Load a model and generate in this process. `model_path=None` is the embedded default model."""

    def __init__(self, model_path: str | None = None, **kwargs: Any):
        self.server_args = ServerArgs(model_path=model_path, **kwargs)
        self.stack = SchedulerStack.build(self.server_args)
        self.model_config = self.stack.model_config
        self.tokenizer = self.stack.tokenizer
        self.runner = self.stack.runner
        self.grammar_backend = self.stack.grammar_backend
        self.scheduler = self.stack.scheduler
        self.context_len = self.stack.context_len
        self._rid_counter = itertools.count()
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- public API
    def generate(
        self,
        prompt: str | Sequence[str] | None = None,
        sampling_params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        stream: bool = False,
    ) -> dict[str, Any] | list[dict[str, Any]] | Iterator[dict[str, Any]]:
        """Generate for one request (a str / a list of ids) or a batch (a list of either).

        A batch is served concurrently. `n` > 1 in the sampling params gives n results per
        prompt (flattened, prompt-major). `stream=True` (single request, n == 1) returns an
        iterator of partial results whose `text` is cumulative, as SGLang's /generate streams.
        """
        logprob = LogprobOptions(return_logprob, logprob_start_len, top_logprobs_num)
        is_batch, reqs = self._make_reqs(prompt, input_ids, sampling_params, logprob)
        if stream:
            if is_batch or len(reqs) != 1:
                raise ValueError("stream=True takes a single prompt with n == 1")
            return self._stream(reqs[0])
        self._submit(reqs)
        self._drive_until(lambda: all(r.is_finished for r in reqs))
        results = [self._result(r) for r in reqs]
        return results if is_batch or len(results) > 1 else results[0]

    async def async_generate(self, *args: Any, **kwargs: Any) -> dict[str, Any] | list[dict[str, Any]]:
        """`generate` without blocking the event loop (runs in a worker thread; shares batches)."""
        if kwargs.get("stream"):
            raise ValueError("use async_generate_stream for streaming")
        return await asyncio.to_thread(self.generate, *args, **kwargs)  # type: ignore[arg-type]

    async def async_generate_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        """Async streaming: yields the same partial results as `generate(stream=True)`."""
        iterator = self.generate(*args, stream=True, **kwargs)
        assert isinstance(iterator, Iterator)
        done = object()
        while (chunk := await asyncio.to_thread(next, iterator, done)) is not done:
            yield chunk  # type: ignore[misc]

    def abort_request(self, rid: str) -> None:
        with self._lock:
            self.scheduler.abort(rid)

    def flush_cache(self) -> bool:
        """Empty the prefix cache; False (nothing done) while requests are running."""
        with self._lock:
            return self.scheduler.flush_cache()

    def get_server_info(self) -> dict[str, Any]:
        with self._lock:
            return self.stack.server_info()

    def shutdown(self) -> None:
        """Abort everything queued or running and release its memory."""
        with self._lock:
            self.stack.abort_all()
        self.grammar_backend.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---------------------------------------------------------------- internals
    def _make_reqs(
        self,
        prompt: str | Sequence[str] | None,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None,
        sampling_params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
        logprob: LogprobOptions,
    ) -> tuple[bool, list[Req]]:
        is_batch, prompts = normalize_inputs(prompt, input_ids)
        params = normalize_params(sampling_params, len(prompts))
        reqs = []
        for text_or_ids, sp in zip(prompts, params):
            ids = self.tokenizer.encode(text_or_ids) if isinstance(text_or_ids, str) else text_or_ids
            check_prompt_ids(ids, self.model_config.vocab_size, self.context_len, self.runner.kv_pool.size)
            for copy in range(sp.n):
                copy_params = sp
                if sp.n > 1 and sp.seed is not None:  # copies of a seeded request differ, reproducibly
                    copy_params = dataclasses.replace(sp, seed=sp.seed + copy)
                reqs.append(self.stack.make_req(str(next(self._rid_counter)), ids, copy_params, logprob))
        return is_batch, reqs

    def _submit(self, reqs: list[Req]) -> None:
        with self._lock:
            for req in reqs:
                self.scheduler.add_request(req)

    def _drive_until(self, done: Any) -> None:
        while True:
            with self._lock:
                if done():
                    return
                self.scheduler.step()

    def _stream(self, req: Req) -> Iterator[dict[str, Any]]:
        self._submit([req])
        sent = 0
        try:
            while True:
                self._drive_until(lambda sent=sent: req.is_finished or len(req.output_ids) > sent)
                sent = len(req.output_ids)
                yield self._result(req) if req.is_finished else self._partial(req)
                if req.is_finished:
                    return
        finally:
            if not req.is_finished:  # the consumer stopped early
                self.abort_request(req.rid)

    def _partial(self, req: Req) -> dict[str, Any]:
        assert req.decoder is not None
        return build_result(req, req.decoder.text)

    def _result(self, req: Req) -> dict[str, Any]:
        assert req.decoder is not None and req.finish_reason is not None
        req.decoder.finish()
        return build_result(req, req.decoder.text)
