"""The TokenizerManager (main process): validates and tokenizes requests, sends them to the
scheduler, and hands each request's outputs (text from the detokenizer) to whoever awaits them.

Per request: an `asyncio.Event` set whenever a new output arrives; `generate` yields the
latest output each time it wakes (so a slow reader skips intermediate states, never blocks the
loop). A request whose consumer goes away (client disconnect, cancelled task) is aborted in the
scheduler, which frees its KV. If a child process dies, `fail_all` wakes every waiter with an
error and new requests are refused with 503.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from radixlm.runtime import messages as io
from radixlm.runtime.constrained.grammar import GrammarError
from radixlm.runtime.constrained.grammar import validate as validate_grammar
from radixlm.runtime.ipc import IpcPaths, pull_socket, push_socket
from radixlm.runtime.limits import MAX_TOP_LOGPROBS_NUM
from radixlm.runtime.request_io import GenerateRequest, RequestError, check_params_fit, check_prompt_ids
from radixlm.runtime.sampling.sampling_params import InvalidSamplingParams, SamplingParams
from radixlm.runtime.server.metrics import Metrics
from radixlm.runtime.tokenizer import Tokenizer

logger = logging.getLogger("radixlm.request")

MIN_LOGPROB = -9999.0
LOGPROB_LISTS = ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs")


@dataclass
class ReqState:
    request: GenerateRequest
    prompt_tokens: int
    event: asyncio.Event = field(default_factory=asyncio.Event)
    latest: io.StrOutput | None = None
    error: str | None = None
    logprobs: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in LOGPROB_LISTS})
    created: float = field(default_factory=time.perf_counter)
    last_token_time: float | None = None

    @property
    def finished(self) -> bool:
        return self.error is not None or (self.latest is not None and self.latest.finish_reason is not None)


@dataclass(frozen=True)
class PreparedRequest:
    """A validated, tokenized request, ready for `generate`."""

    request: GenerateRequest
    input_ids: list[int]
    params: SamplingParams


class ServiceUnavailable(RuntimeError):
    """A child process died: the server cannot serve (HTTP 503)."""


class TokenizerManager:
    def __init__(self, paths: IpcPaths, tokenizer: Tokenizer, model_name: str, context_len: int,
                 vocab_size: int, max_total_tokens: int, metrics: Metrics):
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.context_len = context_len
        self.vocab_size = vocab_size
        self.max_total_tokens = max_total_tokens
        self.metrics = metrics
        # A token spells at most this many characters, so a longer text cannot fit the context:
        # such prompts are refused before tokenizing them (which would block the event loop).
        self.max_prompt_chars = context_len * max_token_chars(tokenizer)
        ctx = zmq.asyncio.Context()
        self._to_scheduler = push_socket(ctx, paths.scheduler)
        self._recv = pull_socket(ctx, paths.tokenizer_manager)
        self.states: dict[str, ReqState] = {}
        self._control: dict[str, asyncio.Future[Any]] = {}
        self.dead_reason: str | None = None
        self._rid_counter = itertools.count()
        self._loop_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._handle_loop())

    # ---------------------------------------------------------------- requests
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
            ids = self.tokenizer.encode(req.text)
        else:
            ids = list(req.input_ids or ())
        check_prompt_ids(ids, self.vocab_size, self.context_len, self.max_total_tokens)
        try:
            params = SamplingParams.from_dict(req.sampling_params)
        except (InvalidSamplingParams, TypeError) as e:
            raise RequestError(str(e)) from e
        check_params_fit(params, len(ids), self.context_len, self.vocab_size)
        for kind, spec in (("regex", params.regex), ("json_schema", params.json_schema)):
            if spec:
                try:
                    validate_grammar(kind, spec)
                except GrammarError as e:
                    raise RequestError(f"sampling_params.{kind}: {e}") from e
        if params.ebnf:
            raise RequestError("sampling_params.ebnf is not supported; use regex or json_schema")
        if params.n != 1:
            raise RequestError("sampling_params.n > 1 must be expanded before the tokenizer manager")
        if req.top_logprobs_num < 0 or req.top_logprobs_num > MAX_TOP_LOGPROBS_NUM:
            raise RequestError(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS_NUM}]")
        if req.logprob_start_len < -1 or req.logprob_start_len >= len(ids):
            raise RequestError(f"logprob_start_len must be in [-1, {len(ids) - 1}]")
        return PreparedRequest(req, ids, params)

    async def generate(self, prepared: PreparedRequest) -> AsyncIterator[dict[str, Any]]:
        """Yield this request's result dict as outputs arrive (the last one is final)."""
        if self.dead_reason is not None:
            raise ServiceUnavailable(self.dead_reason)
        req, ids, params = prepared.request, prepared.input_ids, prepared.params
        rid = req.rid or f"{uuid.uuid4().hex[:16]}-{next(self._rid_counter)}"
        if rid in self.states:
            raise RequestError(f"request id {rid!r} is already in use")
        state = ReqState(req, len(ids))
        self.states[rid] = state
        self.metrics.on_request_start(len(ids))
        await self._to_scheduler.send(io.encode(io.TokenizedGenerateReq(
            rid, tuple(ids), params.to_dict(), req.return_logprob, req.logprob_start_len,
            req.top_logprobs_num, req.stream,
        )))
        logger.debug("request %s sent to the scheduler", rid)  # tests wait for this line
        try:
            while True:
                await state.event.wait()
                state.event.clear()
                if state.error is not None:
                    raise ServiceUnavailable(state.error)
                assert state.latest is not None
                yield self._result(rid, state)
                if state.finished:
                    return
        finally:
            self.states.pop(rid, None)
            if not state.finished and self.dead_reason is None:
                await self._to_scheduler.send(io.encode(io.AbortReq(rid)))
                self.metrics.on_request_end(state, aborted=True)
                logger.debug("request %s aborted before it finished", rid)  # tests wait for this line
            elif state.latest is not None and state.error is None:
                self.metrics.on_request_end(state, aborted=False)
                _log_request(rid, state)

    async def abort(self, rid: str) -> bool:
        if rid not in self.states:
            return False
        await self._to_scheduler.send(io.encode(io.AbortReq(rid)))
        return True

    async def flush_cache(self) -> bool:
        resp = await self._control_call(io.FlushCacheReq(uuid.uuid4().hex))
        return bool(resp.success)

    async def get_server_info(self) -> dict[str, Any]:
        resp = await self._control_call(io.GetInfoReq(uuid.uuid4().hex))
        return dict(resp.info)

    async def _control_call(self, msg: io.FlushCacheReq | io.GetInfoReq, timeout: float = 30.0) -> Any:
        if self.dead_reason is not None:
            raise ServiceUnavailable(self.dead_reason)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._control[msg.request_id] = future
        await self._to_scheduler.send(io.encode(msg))
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._control.pop(msg.request_id, None)

    def fail_all(self, reason: str) -> None:
        """A child died: wake every waiter with an error; refuse new work."""
        self.dead_reason = reason
        for state in self.states.values():
            state.error = reason
            state.event.set()
        for future in self._control.values():
            if not future.done():
                future.set_exception(ServiceUnavailable(reason))

    # ---------------------------------------------------------------- outputs
    async def _handle_loop(self) -> None:
        while True:
            msg = io.decode(await self._recv.recv())
            if isinstance(msg, io.BatchStrOut):
                for out in msg.outputs:
                    self._on_output(out)
            elif isinstance(msg, (io.FlushCacheResp, io.GetInfoResp)):
                future = self._control.get(msg.request_id)
                if future is not None and not future.done():
                    future.set_result(msg)

    def _on_output(self, out: io.StrOutput) -> None:
        state = self.states.get(out.rid)
        if state is None:
            return  # the consumer left already
        now = time.perf_counter()
        if out.completion_tokens and state.latest is not None and state.last_token_time is not None:
            self.metrics.on_token(now - state.last_token_time)
        elif out.completion_tokens:
            self.metrics.on_first_token(now - state.created)
        state.last_token_time = now
        if out.logprobs:
            for name in LOGPROB_LISTS:
                state.logprobs[name].extend(out.logprobs.get(name, ()))
        state.latest = out
        state.event.set()

    def _result(self, rid: str, state: ReqState) -> dict[str, Any]:
        out = state.latest
        assert out is not None
        meta: dict[str, Any] = {
            "id": rid,
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.completion_tokens,
            "cached_tokens": out.cached_tokens,
            "finish_reason": out.finish_reason,
            "e2e_latency": time.perf_counter() - state.created,
        }
        if state.request.return_logprob:
            with_text = state.request.return_text_in_logprobs
            meta["input_token_logprobs"] = self._with_text(state.logprobs["input_token_logprobs"], with_text)
            meta["output_token_logprobs"] = self._with_text(state.logprobs["output_token_logprobs"], with_text)
            if state.request.top_logprobs_num > 0:
                meta["input_top_logprobs"] = [
                    None if row is None else self._with_text(row, with_text) for row in state.logprobs["input_top_logprobs"]
                ]
                meta["output_top_logprobs"] = [self._with_text(row, with_text) for row in state.logprobs["output_top_logprobs"]]
        return {"text": out.text, "output_ids": list(out.output_ids), "meta_info": meta}

    def _with_text(self, entries: list[Any], with_text: bool) -> list[list[Any]]:
        """SGLang's `[logprob, token_id, text-or-null]` triples, with JSON-safe logprobs."""
        if not with_text:
            return [[json_logprob(lp), tok, None] for lp, tok in entries]
        return [[json_logprob(lp), tok, self.tokenizer.decode([tok], skip_special_tokens=False)] for lp, tok in entries]


def json_logprob(logprob: float | None) -> float | None:
    """A logprob as JSON can carry it: -inf (a token a grammar mask or min_new_tokens ruled out,
    listed among the top logprobs when fewer tokens are allowed than asked for) becomes
    MIN_LOGPROB, as vLLM reports it; NaN becomes null."""
    if logprob is None or math.isfinite(logprob):
        return logprob
    return MIN_LOGPROB if logprob < 0 else None


def max_token_chars(tokenizer: Tokenizer) -> int:
    """The most characters one token of `tokenizer` spells (byte-level BPE: one per byte)."""
    tokens = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
    return max((len(t) for t in tokens if t is not None), default=1)


def _log_request(rid: str, state: ReqState) -> None:
    out = state.latest
    if out is None or not logger.isEnabledFor(logging.INFO):
        return
    logger.info(
        "request rid=%s prompt_tokens=%d cached_tokens=%d completion_tokens=%d finish=%s latency=%.3fs",
        rid, out.prompt_tokens, out.cached_tokens, out.completion_tokens,
        (out.finish_reason or {}).get("type"), time.perf_counter() - state.created,
    )
