"""The scheduler process's outputs under --stream-interval (`scheduler.output_stream`): a request's
first token and its end go out at once, a streaming request's ids every `stream_interval` tokens,
a non-streaming request's only at its end; no id or logprob entry is lost or reordered. Driven
in-process through `SchedulerServer` (the scheduler process without its sockets) on the tiny model."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from radixlm.runtime.config.server_args import ServerArgs
from radixlm.runtime.ipc import messages as io
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.scheduler_process import SchedulerServer

PROMPT = tuple(range(100, 140))
NEW_TOKENS = 10


def run(server: SchedulerServer, reqs: list[io.TokenizedGenerateReq],
        abort_first: str | None = None) -> dict[str, list[io.ReqOutput]]:
    """Every message each request got, in order, until all finished."""
    for req in reqs:
        server.handle(req)
    if abort_first is not None:
        server.handle(io.AbortReq(abort_first))
    got: dict[str, list[io.ReqOutput]] = defaultdict(list)
    settings_for: set[str] = set()
    while server.scheduler.has_work:
        batch = server.step()
        if batch is None:
            continue
        for out in batch.outputs:
            got[out.rid].append(out)
        for rid in batch.decode_settings:
            assert not got[rid][:-1], "decode settings travel with a request's first message"
            settings_for.add(rid)
    assert server.output_stream.num_tracked_reqs == 0  # nothing held, nothing left behind
    assert settings_for == {r.rid for r in reqs}
    return got


def request(rid: str, stream: bool, return_logprob: bool = False) -> io.TokenizedGenerateReq:
    params = SamplingParams.from_dict({"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True})
    return io.TokenizedGenerateReq(rid, PROMPT, params, return_logprob=return_logprob, logprob_start_len=0, stream=stream)


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path) -> dict[int, SchedulerServer]:
    """stream_interval -> a scheduler server on the tiny model."""
    return {n: SchedulerServer(ServerArgs(model_path=str(tiny_model_dir), max_total_tokens=2048, stream_interval=n,
                                          random_seed=0)) for n in (1, 4)}


def test_every_step_is_sent_at_interval_one_and_a_non_streaming_request_waits_for_its_end(
        servers: dict[int, SchedulerServer]) -> None:
    got = run(servers[1], [request("s", stream=True), request("n", stream=False)])
    assert [len(m.new_token_ids) for m in got["s"]] == [1] * NEW_TOKENS
    assert [len(m.new_token_ids) for m in got["n"]] == [1, NEW_TOKENS - 1]
    assert [m.finish_reason is not None for m in got["n"]] == [False, True]
    assert sum((m.new_token_ids for m in got["s"]), ()) == sum((m.new_token_ids for m in got["n"]), ())


def test_a_streaming_request_gets_its_first_token_then_every_interval_then_its_end(
        servers: dict[int, SchedulerServer]) -> None:
    every_step = run(servers[1], [request("a", stream=True, return_logprob=True)])["a"]
    got = run(servers[4], [request("b", stream=True, return_logprob=True)])["b"]
    assert [len(m.new_token_ids) for m in got] == [1, 4, 4, 1]
    assert [m.completion_tokens for m in got] == [1, 5, 9, 10]
    assert [m.finish_reason is not None for m in got] == [False, False, False, True]
    ids = sum((m.new_token_ids for m in got), ())
    assert ids == sum((m.new_token_ids for m in every_step), ())
    # each message carries the logprob entries of its ids, in order
    for m in got:
        assert m.logprobs is not None
        assert [t for _, t in m.logprobs.output_token_logprobs] == list(m.new_token_ids)
    assert sum(len(m.logprobs.input_token_logprobs) for m in got if m.logprobs) == len(PROMPT)


def test_an_aborted_request_is_reported_once_and_holds_nothing(servers: dict[int, SchedulerServer]) -> None:
    got = run(servers[4], [request("gone", stream=True), request("kept", stream=False)], abort_first="gone")
    assert len(got["gone"]) == 1 and got["gone"][0].finish_reason is not None
    assert got["gone"][0].finish_reason["type"] == "abort"
    assert [len(m.new_token_ids) for m in got["kept"]] == [1, NEW_TOKENS - 1]


def test_a_stream_interval_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="stream_interval must be >= 1"):
        ServerArgs(stream_interval=0)
