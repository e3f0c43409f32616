"""The TokenizerManager (main process): sends validated requests to the scheduler and hands each
request's outputs (text deltas from the detokenizer) to whoever awaits them.

Generate requests go to the scheduler through an `ArrivalGate` (those prepared together leave
together, as one message). Per request: a `RequestOutput` that appends each delta as it
arrives, and an `asyncio.Event` set whenever one does; `generate` takes what accumulated each
time it wakes (so a slow reader gets the pending deltas coalesced into one chunk, and what waits
for it is bounded by its own output, never a queue of snapshots). A request whose consumer goes
away (client disconnect, cancelled task) is aborted in the scheduler, which frees its KV. If a
child process dies, `fail_all` wakes every waiter with an error and new requests are refused
with 503.

With data parallelism (`--dp-size N`) there is one scheduler per rank, each behind its own
socket: a `LoadBalancer` picks each request's rank; control requests (flush, info, abort) go to
every rank, and their answers merge (`merge_rank_infos`: sums, with each rank's own state kept).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from radixlm.runtime.api.request_io import PreparedRequest, RequestError, RequestValidator
from radixlm.runtime.api.request_output import OutputChunk, RequestOutput, TokenTexts
from radixlm.runtime.ipc import messages as io
from radixlm.runtime.ipc.sockets import IpcPaths, pull_socket, push_socket
from radixlm.runtime.server.arrival_gate import ArrivalGate
from radixlm.runtime.server.load_balance import LoadBalancer
from radixlm.runtime.server.metrics import Metrics
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

logger = logging.getLogger("radixlm.request")


@dataclass
class ReqState:
    output: RequestOutput
    event: asyncio.Event = field(default_factory=asyncio.Event)
    error: str | None = None
    last_token_time: float | None = None
    is_counted: bool = True  # in /metrics (SGLang's log_metrics; false for health checks)

    @property
    def finished(self) -> bool:
        return self.error is not None or self.output.is_finished


class ServiceUnavailable(RuntimeError):
    """A child process died: the server cannot serve (HTTP 503)."""


class TokenizerManager:
    def __init__(self, paths: IpcPaths, tokenizer: Tokenizer, model_name: str, context_len: int,
                 vocab_size: int, max_total_num_tokens: int, metrics: Metrics, incremental_streaming_output: bool,
                 grammar_backend: str, balancer: LoadBalancer | None = None,
                 whitespace_pattern: str | None = None):
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.context_len = context_len
        self.metrics = metrics
        self.validator = RequestValidator(tokenizer, context_len, vocab_size, max_total_num_tokens, grammar_backend,
                                          whitespace_pattern)
        self.token_texts = TokenTexts(tokenizer.decode)
        self.incremental_streaming_output = incremental_streaming_output
        ctx = zmq.asyncio.Context()
        self.balancer = balancer or LoadBalancer("round_robin", 1, max_total_num_tokens)
        self._to_schedulers = [push_socket(ctx, paths.scheduler_for_rank(r)) for r in range(self.balancer.dp_size)]
        self._recv = pull_socket(ctx, paths.tokenizer_manager)
        self.arrivals = ArrivalGate(self._send_generate)
        self.states: dict[str, ReqState] = {}
        self._control: dict[str, asyncio.Future[Any]] = {}
        self.dead_reason: str | None = None
        self._rid_counter = itertools.count()
        self._loop_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._handle_loop())

    # ---------------------------------------------------------------- requests
    async def generate(self, prepared: PreparedRequest) -> AsyncIterator[OutputChunk]:
        """Yield this request's output as it arrives: a chunk per wake when streaming (pending
        deltas coalesced), else only the final result."""
        if self.dead_reason is not None:
            raise ServiceUnavailable(self.dead_reason)
        req, ids = prepared.request, prepared.input_ids
        rid = req.rid or f"{uuid.uuid4().hex[:16]}-{next(self._rid_counter)}"
        if rid in self.states:
            raise RequestError(f"request id {rid!r} is already in use")
        state = ReqState(RequestOutput.of(rid, req, self.token_texts, self.incremental_streaming_output,
                                          prepared.grammar),
                         is_counted=req.log_metrics)
        self.states[rid] = state
        if state.is_counted:
            self.metrics.on_request_start(len(ids))
        rank = self.balancer.select(ids, req.data_parallel_rank)
        try:
            self.arrivals.submit(rank, io.TokenizedGenerateReq(
                rid, tuple(ids), prepared.params, req.return_logprob, req.logprob_start_len,
                req.top_logprobs_num, req.stream, req.require_reasoning, prepared.grammar, req.cache_salt,
            ))
            while True:
                await state.event.wait()
                state.event.clear()
                if state.error is not None:
                    raise ServiceUnavailable(state.error)
                if state.output.is_finished or req.stream:
                    chunk = state.output.take_chunk()
                    # decide by the chunk taken: more may arrive (and finish) while it is yielded
                    yield chunk
                    if chunk.is_finished:
                        return
        finally:
            self.states.pop(rid, None)
            self.balancer.on_finish(rank, len(ids))
            if not state.finished and self.dead_reason is None:
                self.arrivals.flush()  # a held request goes before its abort, not after
                await self._to_schedulers[rank].send(io.encode(io.AbortReq(rid)))
                if state.is_counted:
                    self.metrics.on_request_end(state.output, aborted=True)
                logger.debug("request %s aborted before it finished", rid)  # tests wait for this line
            elif state.error is None and state.is_counted:
                self.metrics.on_request_end(state.output, aborted=False)
                _log_request(state.output)

    def _send_generate(self, rank: int, reqs: list[io.TokenizedGenerateReq]) -> None:
        msg = reqs[0] if len(reqs) == 1 else io.BatchTokenizedGenerateReq(tuple(reqs))
        sent = self._to_schedulers[rank].send(io.encode(msg))  # a PUSH socket queues it at once
        sent.add_done_callback(_log_send_failure)
        for req in reqs:
            logger.debug("request %s sent to the scheduler", req.rid)  # tests wait for this line

    def check_rank(self, dp_rank: int | None) -> None:
        """A requested data-parallel rank must exist (RequestError, a 400, before anything runs)."""
        if dp_rank is not None and not 0 <= dp_rank < self.balancer.dp_size:
            raise RequestError(f"data_parallel_rank {dp_rank}: this server has {self.balancer.dp_size} "
                               f"data-parallel rank(s), 0 to {self.balancer.dp_size - 1} (radixlm serve --dp-size)")

    async def abort(self, rid: str) -> bool:
        if rid not in self.states:
            return False
        self.arrivals.flush()
        for sock in self._to_schedulers:  # every rank: aborting a request a rank does not hold is a no-op
            await sock.send(io.encode(io.AbortReq(rid)))
        return True

    async def flush_cache(self) -> bool:
        """Flush every rank's cache; True only if every rank flushed (a rank with running requests refuses)."""
        resps = await self._control_all(io.FlushCacheReq)
        self.balancer.on_flush()  # also when some refused: the index only guides, and a flushed rank holds nothing
        return all(resp.success for resp in resps)

    async def get_server_info(self) -> dict[str, Any]:
        """The scheduler's info; with data parallelism, every rank's merged (`merge_rank_infos`)."""
        infos = [dict(resp.info) for resp in await self._control_all(io.GetInfoReq)]
        if len(infos) == 1:
            return infos[0]
        for info, load in zip(infos, self.balancer.loads):
            info["num_dispatched_reqs"] = load.num_dispatched_reqs
        return merge_rank_infos(infos)

    async def get_cache_tree(self, max_nodes: int) -> dict[str, Any]:
        """Rank 0's cache tree (with data parallelism, the dashboard shows the first rank)."""
        resp = await self._control_call(io.CacheTreeReq(uuid.uuid4().hex, max_nodes), self._to_schedulers[0])
        return dict(resp.state)

    async def _control_all(self, kind: type[io.FlushCacheReq] | type[io.GetInfoReq]) -> list[Any]:
        """Send a control request to every rank and gather their replies in rank order."""
        base = uuid.uuid4().hex
        return list(await asyncio.gather(*(self._control_call(kind(f"{base}-{rank}"), sock)
                                           for rank, sock in enumerate(self._to_schedulers))))

    async def _control_call(self, msg: io.FlushCacheReq | io.GetInfoReq | io.CacheTreeReq, sock: zmq.asyncio.Socket,
                            timeout: float = 30.0) -> Any:
        if self.dead_reason is not None:
            raise ServiceUnavailable(self.dead_reason)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._control[msg.request_id] = future
        await sock.send(io.encode(msg))
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
            elif isinstance(msg, (io.FlushCacheResp, io.GetInfoResp, io.CacheTreeResp)):
                future = self._control.get(msg.request_id)
                if future is not None and not future.done():
                    future.set_result(msg)

    def _on_output(self, out: io.StrOutput) -> None:
        state = self.states.get(out.rid)
        if state is None:
            return  # the consumer left already
        now = time.perf_counter()
        if out.new_token_ids and state.is_counted:
            if state.last_token_time is not None:  # several ids: a stream interval, jump-forward, a final message
                self.metrics.on_token(now - state.last_token_time, len(out.new_token_ids))
            else:
                self.metrics.on_first_token(now - state.output.created)
            state.last_token_time = now
        state.output.add(out)
        state.event.set()


# summed over ranks in the merged info; a rank's other fields (its settings) are the same on every rank
_SUMMED = ("max_total_num_tokens", "num_running_reqs", "num_waiting_reqs", "num_grammar_queue_reqs", "num_retractions")


def merge_rank_infos(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """One server info for N ranks: settings from rank 0, counts and pool / cache sizes summed, the
    hit rate over all ranks' lookups, and each rank's own info under `internal_states` (SGLang's name)."""
    merged = {k: v for k, v in infos[0].items() if k not in ("dp_rank", "num_dispatched_reqs")}
    for key in _SUMMED:
        merged[key] = sum(info[key] for info in infos)
    merged["kv_pool"] = {k: sum(info["kv_pool"][k] for info in infos) for k in infos[0]["kv_pool"]}
    cache = {k: sum(info["radix_cache"][k] for info in infos) for k in infos[0]["radix_cache"] if k != "hit_rate"}
    queried = cache["num_queried_tokens"]
    cache["hit_rate"] = cache["num_matched_tokens"] / queried if queried else 0.0
    merged["radix_cache"] = cache
    merged["internal_states"] = infos
    return merged


def _log_send_failure(sent: asyncio.Future[Any]) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        logger.error("could not send requests to the scheduler: %s", sent.exception())


def _log_request(out: RequestOutput) -> None:
    if not logger.isEnabledFor(logging.INFO):
        return
    logger.info(
        "request rid=%s prompt_tokens=%d cached_tokens=%d completion_tokens=%d finish=%s latency=%.3fs",
        out.rid, out.prompt_tokens, out.cached_tokens, out.completion_tokens,
        (out.finish_reason or {}).get("type"), time.perf_counter() - out.created,
    )
