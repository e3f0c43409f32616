"""The IPC messages (one codec, round trips) and the result shaping both doors share
(`RequestOutput`: deltas in, SGLang's /generate dicts out)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from radixlm.runtime.api.request_io import GenerateRequest
from radixlm.runtime.api.request_output import MIN_LOGPROB, RequestOutput, TokenTexts
from radixlm.runtime.constrained.lowered import LoweredGrammar
from radixlm.runtime.ipc import messages as io
from radixlm.runtime.sampling.sampling_params import SamplingParams

PARAMS = SamplingParams(max_new_tokens=7, temperature=0.5, stop=("\n",), seed=3)
ENTRIES = io.LogprobEntries(
    input_token_logprobs=((None, 1), (-0.5, 2)),
    output_token_logprobs=((-0.25, 9),),
    input_top_logprobs=(None, ((-0.5, 2), (-1.5, 3))),
    output_top_logprobs=(((-0.25, 9), (-2.0, 4)),),
)
MESSAGES = [
    io.TokenizedGenerateReq("r1", (1, 2, 3), PARAMS, True, 0, 2, True),
    io.TokenizedGenerateReq("r2", (1,), PARAMS, grammar=LoweredGrammar(  # the door's lowering, compiled as is
        "xgrammar", "regex", "a+", '{"rules": [["root", 0, -1]]}', (("any_whitespace", False),))),
    io.AbortReq("r1"),
    io.FlushCacheReq("f"),
    io.FlushCacheResp("f", True),
    io.GetInfoReq("i"),
    io.GetInfoResp("i", {"num_running_reqs": 0}),
    io.CacheTreeReq("t", 200),
    io.CacheTreeResp("t", {"tree": {"nodes": []}, "running": []}),
    io.BatchTokenIDOut(
        (io.ReqOutput("r1", (9,), None, 3, 1, 0, ENTRIES),),
        {"r1": io.DecodeSettings(PARAMS, (2, 3))},
    ),
    io.BatchStrOut((io.StrOutput("r1", "hi", (9,), {"type": "length", "matched": 1}, 3, 1, 0, ENTRIES),)),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg: object) -> None:
    assert io.decode(io.encode(msg)) == msg


def test_sampling_params_cross_as_the_validated_dataclass() -> None:
    """Decoding rebuilds the frozen SamplingParams without running its checks again (pickle
    restores the fields), so a request is validated once, at the door."""
    msg = io.decode(io.encode(MESSAGES[0]))
    assert isinstance(msg, io.TokenizedGenerateReq)
    assert type(msg.sampling_params) is SamplingParams and msg.sampling_params == PARAMS
    checks: list[str] = []
    original = SamplingParams.__post_init__

    def counting(self: SamplingParams) -> None:
        checks.append("checked")
        original(self)

    SamplingParams.__post_init__ = counting  # type: ignore[method-assign]
    try:
        pickle.loads(pickle.dumps(MESSAGES[0]))
    finally:
        SamplingParams.__post_init__ = original  # type: ignore[method-assign]
    assert checks == []


class CountingDecode:
    """A real decode (id -> a fixed text) that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.calls += 1
        return "".join(f"<{i}>" for i in ids)


def delta(text: str, ids: tuple[int, ...], out_entries: tuple[Any, ...], finish: dict[str, Any] | None = None,
          completion: int = 0) -> io.StrOutput:
    tops = tuple(((lp, tok), (lp - 1.0, tok + 1)) for lp, tok in out_entries)
    return io.StrOutput("r", text, ids, finish, 5, completion, 2,
                        io.LogprobEntries(output_token_logprobs=out_entries, output_top_logprobs=tops))


def request(stream: bool) -> GenerateRequest:
    return GenerateRequest(text="x", return_logprob=True, top_logprobs_num=2, return_text_in_logprobs=True,
                           stream=stream)


def test_stream_chunks_carry_new_entries_and_cumulative_text() -> None:
    decode = CountingDecode()
    out = RequestOutput.of("r", request(stream=True), TokenTexts(decode))
    out.add(delta("a", (5,), ((-0.1, 5),), completion=1))
    first = out.take_chunk()
    assert not out.has_update
    # two deltas before the reader comes back: coalesced into one chunk
    out.add(delta("b", (6,), ((-0.2, 6),), completion=2))
    out.add(delta("c", (5,), ((float("-inf"), 5),), {"type": "length", "matched": 3}, completion=3))
    second = out.take_chunk()
    assert first.new_text == "a" and first.result["text"] == "a" and first.result["output_ids"] == [5]
    assert first.meta_info["output_token_logprobs"] == [[-0.1, 5, "<5>"]]
    assert first.meta_info["output_token_logprobs_length"] == 1
    assert second.new_text == "bc" and second.result["text"] == "abc" and second.result["output_ids"] == [5, 6, 5]
    assert (first.new_pieces, second.new_pieces) == (("a",), ("b", "c"))  # each delta's text, as it came
    assert second.meta_info["output_token_logprobs"] == [[-0.2, 6, "<6>"], [MIN_LOGPROB, 5, "<5>"]]
    assert len(second.meta_info["output_top_logprobs"]) == 2
    assert second.meta_info["output_token_logprobs_length"] == 3 and second.is_finished
    assert decode.calls == 3  # ids 5, 6, 7 each decoded once (memoized), whatever their count


def test_a_request_not_streamed_gets_every_entry_at_the_end() -> None:
    out = RequestOutput.of("r", request(stream=False), TokenTexts(CountingDecode()))
    out.add(delta("a", (5,), ((-0.1, 5),), completion=1))
    out.add(delta("b", (6,), ((-0.2, 6),), {"type": "stop", "matched": 6}, completion=2))
    result = out.take_chunk().result
    assert result["text"] == "ab" and result["output_ids"] == [5, 6]
    assert [e[1] for e in result["meta_info"]["output_token_logprobs"]] == [5, 6]
    assert "output_token_logprobs_length" not in result["meta_info"]
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": 6}


def test_incremental_streaming_output_sends_only_new_text_and_ids() -> None:
    """SGLang's --incremental-streaming-output: chunks that never grow with the output."""
    out = RequestOutput.of("r", request(stream=True), TokenTexts(CountingDecode()), incremental=True)
    out.add(delta("a", (5,), ((-0.1, 5),), completion=1))
    first = out.take_chunk().result
    out.add(delta("bc", (6, 7), ((-0.2, 6), (-0.3, 7)), {"type": "length", "matched": 3}, completion=3))
    second = out.take_chunk().result
    assert (first["text"], first["output_ids"]) == ("a", [5])
    assert (second["text"], second["output_ids"]) == ("bc", [6, 7])
    assert second["meta_info"]["output_token_logprobs_length"] == 3
