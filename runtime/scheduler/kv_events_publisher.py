"""Publishing KV events (`--kv-events-config`, SGLang's flag and JSON form) over zmq.

In: the events a `BlockEventRecorder` (mem_cache/kv_events.py, which also pins the wire format)
recorded during a scheduler step. Out: one msgpack `KVEventBatch` per step that changed the
cache, as SGLang's and vLLM's ZmqEventPublisher send it: a PUB socket sends the multipart
message [topic, seq, payload], seq an 8-byte big-endian counter from 0 (a gap tells a subscriber
it missed a batch). With a `replay_endpoint`, a ROUTER socket keeps the last `buffer_steps`
batches: a request [start_seq as 8 bytes big-endian] (from a DEALER socket) is answered
with one [seq, payload] message per kept batch from start_seq on, then [-1 as 8 signed bytes, b""].
Sockets bind when the endpoint has `*` or `::` or is ipc:// / inproc://, else connect; with data
parallelism, rank r adds r to a tcp port (or `_dp<r>` to an inproc name), as SGLang does.

A background thread owns the sockets, so the scheduler only queues a batch (never blocks on the
network); a full queue drops the batch with a warning.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import msgpack
import zmq

from radixlm.runtime.config.kv_events_config import KVEventsConfig, endpoint_for_rank
from radixlm.runtime.mem_cache.kv_events import BlockEventRecorder, KVCacheEvent, KVEventBatch

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_QUEUE_POLL_S = 0.05  # how often the publisher thread looks at the replay socket while idle
_SHUTDOWN_WAIT_S = 2.0


def _open(ctx: zmq.Context, kind: int, endpoint: str, can_connect: bool, hwm: int | None = None) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if hwm is not None:
        sock.setsockopt(zmq.SNDHWM, hwm)  # before bind / connect: it applies to later connections
    is_bind = not can_connect or "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))
    try:
        sock.bind(endpoint) if is_bind else sock.connect(endpoint)
    except zmq.ZMQError as e:
        sock.close()
        raise ValueError(f"--kv-events-config: cannot {'bind' if is_bind else 'connect'} {endpoint}: {e}") from None
    return sock


class ZmqEventPublisher:
    """Sends KVEventBatches from a background thread (see the module docstring for the protocol)."""

    def __init__(self, config: KVEventsConfig, dp_rank: int = 0):
        self.dp_rank = dp_rank
        self._topic = config.topic.encode()
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(maxsize=config.max_queue_size)
        self._kept: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._ctx = zmq.Context.instance()
        self._pub = _open(self._ctx, zmq.PUB, endpoint_for_rank(config.endpoint, dp_rank), can_connect=True,
                          hwm=config.hwm)
        self._replay = None
        if config.replay_endpoint is not None:
            self._replay = _open(self._ctx, zmq.ROUTER, endpoint_for_rank(config.replay_endpoint, dp_rank),
                                 can_connect=False)
        self.num_dropped = 0
        self._thread = threading.Thread(target=self._run, name="kv-events-publisher", daemon=True)
        self._thread.start()

    def publish(self, events: list[KVCacheEvent]) -> None:
        """Queue one batch (stamped now); never blocks."""
        try:
            self._queue.put_nowait(KVEventBatch(time.time(), tuple(events), self.dp_rank))
        except queue.Full:
            self.num_dropped += 1
            logger.warning("KV events: the publisher queue is full; dropped a batch of %d events", len(events))

    def shutdown(self) -> None:
        """Send what is queued, then close the sockets."""
        if not self._thread.is_alive():
            return
        self._queue.put(None)
        self._thread.join(timeout=_SHUTDOWN_WAIT_S)

    def _run(self) -> None:
        seq = 0
        # without a replay socket the thread sleeps in the queue until a batch comes
        timeout = None if self._replay is None else _QUEUE_POLL_S
        try:
            while True:
                if self._replay is not None:
                    while self._replay.poll(0):
                        self._serve_replay()
                try:
                    batch = self._queue.get(timeout=timeout)
                except queue.Empty:
                    continue
                if batch is None:
                    return
                try:
                    payload = msgpack.packb(batch.to_wire())
                    self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
                except (zmq.ZMQError, ValueError, TypeError):  # lose this batch, not the stream
                    logger.exception("KV events: could not send batch %d", seq)
                else:
                    self._kept.append((seq, payload))
                seq += 1  # a lost batch leaves a gap, so subscribers know they missed it
        finally:
            self._pub.close()
            if self._replay is not None:
                self._replay.close()

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("KV events: ignored a malformed replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._kept):
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))


class KVEventStream:
    """The recorder the radix cache reports to and the publisher its events leave through."""

    def __init__(self, config: KVEventsConfig, dp_rank: int = 0):
        self.recorder = BlockEventRecorder(config.block_size)
        self.publisher = ZmqEventPublisher(config, dp_rank)

    def publish_pending(self) -> None:
        """Send the events recorded since the last call as one batch (nothing if none)."""
        events = self.recorder.take_events()
        if events:
            self.publisher.publish(events)

    def shutdown(self) -> None:
        self.publish_pending()
        self.publisher.shutdown()
