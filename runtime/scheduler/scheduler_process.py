"""The scheduler process: model, KV pool, radix cache and the scheduler loop, behind zmq.

Loop: drain incoming messages (dispatched by type; a batch of generate requests one by one), run
one `Scheduler.step()` when there is work (else block on the socket briefly), send each step's
token ids to the detokenizer (each request's every `--stream-interval` tokens, its first and its
last: `output_stream`), with their text for the requests decoded here (those with stops). Replies
to control requests (flush, info, cache tree) go straight to the tokenizer manager.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import zmq

from radixlm.runtime.config.server_args import ServerArgs
from radixlm.runtime.detokenizer.detokenizer import MAX_PROMPT_CONTEXT_LEN
from radixlm.runtime.ipc import messages as io
from radixlm.runtime.ipc.sockets import IpcPaths, exit_with_parent, pull_socket, push_socket
from radixlm.runtime.scheduler.cache_tree_state import cache_tree_state
from radixlm.runtime.scheduler.output_stream import OutputStream
from radixlm.runtime.scheduler.req import LogprobOptions
from radixlm.runtime.scheduler.scheduler_stack import SchedulerStack

logger = logging.getLogger(__name__)

POLL_IDLE_MS = 50


class SchedulerServer:
    """Wraps an in-process Engine's scheduler with message handling (no sockets of its own)."""

    def __init__(self, args: ServerArgs, dp_rank: int = 0):
        self.dp_rank = dp_rank
        self.stack = SchedulerStack.build(args, dp_rank)
        self.scheduler = self.stack.scheduler
        self.output_stream = OutputStream(args.stream_interval)
        self._pending_settings: dict[str, io.DecodeSettings] = {}  # sent with a request's first output
        self.handlers: dict[type, Callable[[Any], object | None]] = {
            io.TokenizedGenerateReq: self.handle_generate,
            io.AbortReq: self.handle_abort,
            io.FlushCacheReq: self.handle_flush_cache,
            io.GetInfoReq: self.handle_get_info,
            io.CacheTreeReq: self.handle_cache_tree,
        }

    def handle(self, msg: object) -> object | None:
        """Dispatch one incoming message; returns a reply for the tokenizer manager, if any."""
        handler = self.handlers.get(type(msg))
        if handler is None:
            logger.warning("scheduler: unknown message %r", type(msg).__name__)
            return None
        return handler(msg)

    def handle_generate(self, msg: io.TokenizedGenerateReq) -> None:
        logprob = LogprobOptions(msg.return_logprob, msg.logprob_start_len, msg.top_logprobs_num)
        req = self.stack.make_req(msg.rid, list(msg.input_ids), msg.sampling_params, logprob, track_text=False,
                                  require_reasoning=msg.require_reasoning, grammar=msg.grammar,
                                  cache_salt=msg.cache_salt)
        self.scheduler.add_request(req)
        self.output_stream.add(msg.rid, msg.stream)
        logger.debug("request %s arrived (%d prompt tokens)", msg.rid, len(msg.input_ids))
        if req.decoder is None:  # else its text is made here (it has stops) and travels in its messages
            prompt_tail = msg.input_ids[-MAX_PROMPT_CONTEXT_LEN:]
            self._pending_settings[msg.rid] = io.DecodeSettings(msg.sampling_params, prompt_tail)

    def handle_abort(self, msg: io.AbortReq) -> None:
        self.scheduler.abort(msg.rid)

    def handle_flush_cache(self, msg: io.FlushCacheReq) -> io.FlushCacheResp:
        return io.FlushCacheResp(msg.request_id, self.scheduler.flush_cache())

    def handle_get_info(self, msg: io.GetInfoReq) -> io.GetInfoResp:
        return io.GetInfoResp(msg.request_id, {**self.stack.server_info(), "dp_rank": self.dp_rank,
                                                 "scheduler_pid": os.getpid()})

    def handle_cache_tree(self, msg: io.CacheTreeReq) -> io.CacheTreeResp:
        return io.CacheTreeResp(msg.request_id, cache_tree_state(
            self.scheduler, msg.max_nodes, lambda ids: self.stack.tokenizer.decode(ids, skip_special_tokens=False)))

    def step(self) -> io.BatchTokenIDOut | None:
        messages = self.output_stream.take(self.scheduler.step())
        if not messages:
            return None
        settings = {m.rid: self._pending_settings.pop(m.rid) for m in messages if m.rid in self._pending_settings}
        return io.BatchTokenIDOut(tuple(messages), settings)


def run_scheduler_process(args: ServerArgs, paths: IpcPaths, ready: Connection, dp_rank: int = 0,
                          num_threads: int | None = None) -> None:
    """Entry point of the scheduler process (multiprocessing target): data-parallel rank `dp_rank`,
    with `num_threads` torch threads (None: torch's default)."""
    exit_with_parent()
    name = "scheduler" if args.dp_size == 1 else f"scheduler-dp{dp_rank}"
    logging.basicConfig(level=args.log_level.upper(), format=f"%(asctime)s {name} %(levelname)s %(message)s")
    try:
        if num_threads is not None:
            import torch

            torch.set_num_threads(num_threads)  # before the runner's thread governor reads its maximum
        server = SchedulerServer(args, dp_rank)
    except Exception as e:  # report a failed start to the parent instead of dying silently
        ready.send(("error", f"{type(e).__name__}: {e}"))
        raise
    ctx = zmq.Context()
    recv = pull_socket(ctx, paths.scheduler_for_rank(dp_rank))
    to_detok = push_socket(ctx, paths.detokenizer)
    to_tm = push_socket(ctx, paths.tokenizer_manager)
    ready.send(("ready", {"max_total_num_tokens": server.scheduler.kv_pool.max_total_num_tokens,
                          "context_len": server.stack.context_len, "pid": os.getpid(), "dp_rank": dp_rank}))
    poller = zmq.Poller()
    poller.register(recv, zmq.POLLIN)
    while True:
        timeout = 0 if server.scheduler.has_work else POLL_IDLE_MS
        if poller.poll(timeout):
            while True:
                try:
                    msg = io.decode(recv.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                for one in msg.reqs if isinstance(msg, io.BatchTokenizedGenerateReq) else (msg,):
                    reply = _handle_safely(server, one, to_detok)
                    if reply is not None:
                        to_tm.send(io.encode(reply))
        if server.scheduler.has_work:
            num_forwards = server.scheduler.num_forwards
            batch = server.step()
            if batch is not None:
                to_detok.send(io.encode(batch))
            if num_forwards != server.scheduler.num_forwards and logger.isEnabledFor(logging.DEBUG):
                logger.debug("%s", server.scheduler.recent_steps[-1])


def _handle_safely(server: SchedulerServer, msg: object, to_detok: zmq.Socket) -> object | None:
    """A request the scheduler cannot take (validated upstream, so rare) finishes as aborted."""
    try:
        return server.handle(msg)
    except ValueError as e:
        if isinstance(msg, io.TokenizedGenerateReq):
            reason = {"type": "abort", "matched": None, "message": str(e)}
            out = io.ReqOutput(msg.rid, (), reason, len(msg.input_ids), 0, 0)
            to_detok.send(io.encode(io.BatchTokenIDOut((out,))))
            return None
        raise
