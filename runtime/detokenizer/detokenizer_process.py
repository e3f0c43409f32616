"""The detokenizer process: token ids from the scheduler -> text for the tokenizer manager.

One `IncrementalDecoder` per request, correct across multi-byte characters, for the requests
whose text the scheduler does not make. A request with stop strings or stop regexes is decoded in
the scheduler, which must see its text to stop it (free its KV at the stop); its messages carry
that text (`ReqOutput.new_text`, already trimmed at the stop), passed on here as it is, so its ids
are decoded once. Each `StrOutput` carries the text delta and the ids new since the request's
previous output; the tokenizer manager appends them.
"""

from __future__ import annotations

import logging
from multiprocessing.connection import Connection

import zmq

from radixlm.runtime.config.server_args import ServerArgs
from radixlm.runtime.detokenizer.detokenizer import IncrementalDecoder
from radixlm.runtime.ipc import messages as io
from radixlm.runtime.ipc.sockets import IpcPaths, exit_with_parent, pull_socket, push_socket
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class DetokenizerManager:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.decoders: dict[str, IncrementalDecoder] = {}

    def register(self, rid: str, settings: io.DecodeSettings) -> None:
        self.decoders[rid] = IncrementalDecoder(self.tokenizer, settings.sampling_params, settings.prompt_tail)

    def handle_batch(self, batch: io.BatchTokenIDOut) -> io.BatchStrOut:
        for rid, settings in batch.decode_settings.items():
            self.register(rid, settings)
        return io.BatchStrOut(tuple(self._handle_one(out) for out in batch.outputs))

    def _handle_one(self, out: io.ReqOutput) -> io.StrOutput:
        return io.StrOutput(
            rid=out.rid,
            new_text=self._decode(out) if out.new_text is None else out.new_text,
            new_token_ids=out.new_token_ids,
            finish_reason=out.finish_reason,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            cached_tokens=out.cached_tokens,
            logprobs=out.logprobs,
            spec=out.spec,
        )

    def _decode(self, out: io.ReqOutput) -> str:
        """The text of the ids new in `out`, by the request's decoder."""
        decoder = self.decoders.get(out.rid)
        if decoder is None:  # a request refused before registration: nothing to decode
            return ""
        reason = out.finish_reason
        new = list(out.new_token_ids)
        if reason is not None and reason["type"] == "stop" and isinstance(reason["matched"], int) and new:
            new = new[:-1]  # the EOS / stop token itself is not part of the text
        new_text = decoder.push(new)
        if reason is not None:
            new_text += decoder.finish()
            del self.decoders[out.rid]
        return new_text


def run_detokenizer_process(args: ServerArgs, paths: IpcPaths, ready: Connection) -> None:
    """Entry point of the detokenizer process (multiprocessing target)."""
    exit_with_parent()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s detokenizer %(levelname)s %(message)s")
    from radixlm.runtime.model.model_files import resolve_model_path

    tokenizer = Tokenizer(args.tokenizer_path or resolve_model_path(args.model_path))
    manager = DetokenizerManager(tokenizer)
    ctx = zmq.Context()
    recv = pull_socket(ctx, paths.detokenizer)
    to_tm = push_socket(ctx, paths.tokenizer_manager)
    ready.send(("ready", {}))
    while True:
        msg = io.decode(recv.recv())
        if isinstance(msg, io.BatchTokenIDOut):
            to_tm.send(io.encode(manager.handle_batch(msg)))
        else:
            logger.warning("detokenizer: unknown message %r", type(msg).__name__)
