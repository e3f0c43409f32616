"""The in-process engine: `Engine(...).generate(...)` over the scheduler, no server, no zmq.

Flow: the same front door as the HTTP server (`parse_generate`, `RequestValidator`: the same
checks, `n` copies and seeds, and error texts) -> Req (+ IncrementalDecoder for the text) ->
Scheduler.step() loop (ModelRunner.forward over the KV pool, sampler) -> each step's progress as
the same deltas the detokenizer sends -> `RequestOutput` -> result dicts shaped like SGLang's
/generate (streams too: cumulative text, new logprob entries per chunk). Any thread may call
`generate`; steps are serialised by one lock, and whichever caller holds it steps for everyone,
so concurrent callers share batches.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from radixlm.runtime.config.envs import set_process_defaults

set_process_defaults()  # before the imports below load torch

from radixlm.runtime.api.request_io import PreparedRequest, RequestError, RequestValidator, parse_generate  # noqa: E402
from radixlm.runtime.api.request_output import RequestOutput, TokenTexts  # noqa: E402
from radixlm.runtime.config.server_args import ServerArgs  # noqa: E402
from radixlm.runtime.ipc.messages import StrOutput  # noqa: E402
from radixlm.runtime.scheduler.req import LogprobOptions, Req  # noqa: E402
from radixlm.runtime.scheduler.scheduler import StepOutput  # noqa: E402
from radixlm.runtime.scheduler.scheduler_stack import SchedulerStack  # noqa: E402

Started = tuple[Req, RequestOutput]


class Engine:
    """Load a model and generate in this process. `model_path=None` is the embedded default model."""

    def __init__(self, model_path: str | None = None, **kwargs: Any):
        self.server_args = ServerArgs(model_path=model_path, **kwargs)
        if self.server_args.dp_size != 1:  # one scheduler in this process; ranks are processes of a server
            raise ValueError(f"dp_size {self.server_args.dp_size}: the in-process Engine runs one scheduler; "
                             "data parallelism is a server's (radixlm serve --dp-size N)")
        self.stack = SchedulerStack.build(self.server_args)
        self.model_config = self.stack.model_config
        self.tokenizer = self.stack.tokenizer
        self.runner = self.stack.runner
        self.grammar_backend = self.stack.grammar_backend
        self.scheduler = self.stack.scheduler
        self.context_len = self.stack.context_len
        self.validator = RequestValidator(
            self.tokenizer, self.context_len, self.model_config.vocab_size,
            self.runner.kv_pool.max_total_num_tokens,
            self.server_args.grammar_backend, self.server_args.constrained_json_whitespace_pattern,
        )
        self.token_texts = TokenTexts(self.tokenizer.decode)
        self._outputs: dict[str, RequestOutput] = {}  # by rid, while the request runs
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
        return_text_in_logprobs: bool = False,
        stream: bool = False,
        rid: str | Sequence[str] | None = None,
        require_reasoning: bool = False,
        cache_salt: str | Sequence[str] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]] | Iterator[dict[str, Any]]:
        """Generate for one request (a str / a list of ids) or a batch (a list of either), with
        /generate's fields and checks (a bad input raises RequestError, a ValueError, with the
        text the server answers 400 with).

        A batch is served concurrently. `n` > 1 in the sampling params gives n results per
        prompt (flattened, prompt-major). `stream=True` returns an iterator of partial results
        as /generate streams them (with "index" when several sequences run). `cache_salt`: the
        prefix-cache namespace (one, or one per prompt), as /generate's.
        """
        body = _body(prompt, input_ids, sampling_params, rid, return_logprob=return_logprob,
                     logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
                     return_text_in_logprobs=return_text_in_logprobs, stream=stream,
                     require_reasoning=require_reasoning)
        if cache_salt is not None:
            body["cache_salt"] = _as_list(cache_salt)
        reqs, is_batch = parse_generate(body)
        started = self._start([self.validator.validate(r) for r in reqs])
        if stream:
            return self._stream(started, is_batch)
        try:
            self._drive_until(lambda: all(out.is_finished for _, out in started))
            with self._lock:
                results = [out.take_chunk().result for _, out in started]
        finally:
            self._release(started)
        return results if is_batch else results[0]

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
        if self.scheduler.kv_events is not None:
            self.scheduler.kv_events.shutdown()
        self.runner.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---------------------------------------------------------------- internals
    def _start(self, prepared: list[PreparedRequest]) -> list[Started]:
        started = []
        with self._lock:
            for p in prepared:
                req = p.request
                rid = req.rid or f"engine-{next(self._rid_counter)}"
                if rid in self._outputs:
                    self._release(started, locked=True)
                    raise RequestError(f"request id {rid!r} is already in use")
                logprob = LogprobOptions(req.return_logprob, req.logprob_start_len, req.top_logprobs_num)
                sched_req = self.stack.make_req(rid, p.input_ids, p.params, logprob,
                                                require_reasoning=req.require_reasoning, grammar=p.grammar,
                                                cache_salt=req.cache_salt)
                self.scheduler.add_request(sched_req)
                output = self._outputs[rid] = RequestOutput.of(
                    rid, req, self.token_texts, self.server_args.incremental_streaming_output, p.grammar)
                started.append((sched_req, output))
        return started

    def _release(self, started: list[Started], locked: bool = False) -> None:
        """Forget these requests, aborting any still running (a consumer that stopped early)."""
        if not locked:
            with self._lock:
                return self._release(started, locked=True)
        for req, output in started:
            if not output.is_finished:
                self.scheduler.abort(req.rid)
            self._outputs.pop(req.rid, None)

    def _drive_until(self, done: Callable[[], bool]) -> None:
        while True:
            with self._lock:
                if done():
                    return
                for step_output in self.scheduler.step():
                    self._deliver(step_output)

    def _deliver(self, step: StepOutput) -> None:
        """Hand one request's progress to its RequestOutput, as the detokenizer would."""
        output = self._outputs.get(step.req.rid)
        if output is None:
            return
        msg = step.to_message()  # its text is the request's decoder's (track_text)
        assert msg.new_text is not None
        output.add(StrOutput(msg.rid, msg.new_text, msg.new_token_ids, msg.finish_reason,
                             msg.prompt_tokens, msg.completion_tokens, msg.cached_tokens, msg.logprobs, msg.spec))

    def _stream(self, started: list[Started], is_batch: bool) -> Iterator[dict[str, Any]]:
        outputs = [out for _, out in started]
        try:
            while True:
                self._drive_until(lambda: any(o.has_update for o in outputs) or all(o.is_finished for o in outputs))
                with self._lock:
                    chunks = [(i, o.take_chunk()) for i, o in enumerate(outputs) if o.has_update]
                for i, chunk in chunks:
                    yield {**chunk.result, "index": i} if is_batch else chunk.result
                if all(o.is_finished and not o.has_update for o in outputs):
                    return
        finally:
            self._release(started)


def _body(
    prompt: str | Sequence[str] | None,
    input_ids: Sequence[int] | Sequence[Sequence[int]] | None,
    sampling_params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
    rid: str | Sequence[str] | None,
    **options: Any,
) -> dict[str, Any]:
    """The Engine's arguments as the /generate body they stand for (JSON's lists and objects)."""
    body: dict[str, Any] = dict(options)
    if prompt is not None:
        body["text"] = _as_list(prompt)
    if input_ids is not None:
        body["input_ids"] = _as_list(input_ids)
        if isinstance(body["input_ids"], list):
            body["input_ids"] = [_as_list(x) for x in body["input_ids"]]
    if sampling_params is not None:
        params = _as_list(sampling_params)
        body["sampling_params"] = [_as_dict(p) for p in params] if isinstance(params, list) else _as_dict(params)
    if rid is not None:
        body["rid"] = _as_list(rid)
    return body


def _as_list(value: Any) -> Any:
    """A sequence (other than a str) as a list, as JSON would give it; anything else as is."""
    return list(value) if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) else value


def _as_dict(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value
