"""Each thing done once on a request's path (issue 36), counted through the real objects:

- stop strings: a request with stops is decoded by one `IncrementalDecoder`, the scheduler's (it
  must see the text to stop the request); the detokenizer passes that text on and decodes none of
  its ids. Driven through the server's two halves in process (`SchedulerServer` -> `BatchTokenIDOut`
  -> `DetokenizerManager`, the messages pickled as on the sockets), compared with the Engine;
- JSON schemas: the outlines backend's lowering to a regex runs once per request, at the front
  door, and the compile worker builds the index of that regex (through the real Engine).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from radixlm.runtime.config.server_args import ServerArgs
from radixlm.runtime.constrained import spec
from radixlm.runtime.detokenizer.detokenizer import REPLACEMENT_CHAR, IncrementalDecoder
from radixlm.runtime.detokenizer.detokenizer_process import DetokenizerManager
from radixlm.runtime.engine import Engine
from radixlm.runtime.ipc import messages as io
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.scheduler_process import SchedulerServer
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

PROMPT = "The capital of France is"
GREEDY = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}


class Halves:
    """The scheduler process's and the detokenizer process's objects, without their sockets."""

    def __init__(self, args: ServerArgs, tokenizer: Tokenizer):
        self.server = SchedulerServer(args)
        self.detokenizer = DetokenizerManager(tokenizer)
        self.num_rids = 0

    def run(self, input_ids: list[int], params: dict[str, Any]) -> list[io.StrOutput]:
        """One streamed request to the end: the StrOutputs the tokenizer manager would get."""
        self.num_rids += 1
        self.server.handle(io.TokenizedGenerateReq(f"r{self.num_rids}", tuple(input_ids),
                                                   SamplingParams.from_dict(params), stream=True))
        outputs: list[io.StrOutput] = []
        while self.server.scheduler.has_work:
            batch = self.server.step()
            if batch is not None:
                batch = io.decode(io.encode(batch))  # as it crosses the socket
                assert isinstance(batch, io.BatchTokenIDOut)
                outputs += self.detokenizer.handle_batch(batch).outputs
        return outputs

    def assert_clean(self) -> None:
        scheduler = self.server.scheduler
        scheduler.check_integrity()
        assert scheduler.flush_cache()
        assert scheduler.kv_pool.num_free == scheduler.kv_pool.max_total_num_tokens
        assert not self.detokenizer.decoders


@pytest.fixture(scope="module", params=[1, 3], ids=["stream_interval=1", "stream_interval=3"])
def halves(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Iterator[Halves]:
    # the settings of `tiny_engine`, so the outputs compare with the Engine's
    args = ServerArgs(model_path=str(tiny_model_dir), max_total_tokens=4096, random_seed=0, dtype="float32",
                      stream_interval=request.param)
    halves = Halves(args, Tokenizer(tiny_model_dir))
    yield halves
    halves.server.stack.grammar_backend.shutdown()
    halves.server.stack.runner.close()


@pytest.fixture
def counts(halves: Halves, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many IncrementalDecoders are made (anywhere) and how many decodes the detokenizer runs."""
    counted = {"decoders": 0, "detokenizer_decodes": 0}
    make = IncrementalDecoder.__init__
    tokenizer = halves.detokenizer.tokenizer
    decode = tokenizer.decode

    def counting_init(self: IncrementalDecoder, *args: Any, **kwargs: Any) -> None:
        counted["decoders"] += 1
        make(self, *args, **kwargs)

    def counting_decode(*args: Any, **kwargs: Any) -> str:
        counted["detokenizer_decodes"] += 1
        return decode(*args, **kwargs)

    monkeypatch.setattr(IncrementalDecoder, "__init__", counting_init)
    monkeypatch.setattr(tokenizer, "decode", counting_decode)
    return counted


def split_stop(tokenizer: Tokenizer, ids: list[int], text: str) -> tuple[str, int]:
    """A 4-character stop string of `text` that spans a token boundary (two characters before it,
    two after) and first occurs there, and where it starts."""
    for k in range(len(ids) // 3, len(ids)):
        head = tokenizer.decode(ids[:k])
        start = len(head) - 2
        stop = text[start : start + 4]
        if (start >= 0 and text.startswith(head) and not head.endswith(REPLACEMENT_CHAR) and len(stop) == 4
                and stop.strip() and text.find(stop) == start):
            return stop, start
    raise AssertionError(f"no stop string spans a token boundary of {text!r}")


def text_of(outputs: list[io.StrOutput]) -> str:
    return "".join(out.new_text for out in outputs)


@pytest.mark.parametrize("no_stop_trim", [False, True])
def test_a_stop_string_split_across_tokens_is_decoded_once(halves: Halves, counts: dict[str, int],
                                                            tiny_engine: Engine, no_stop_trim: bool) -> None:
    ids = tiny_engine.tokenizer.encode(PROMPT)
    free = tiny_engine.generate(input_ids=ids, sampling_params=GREEDY)
    stop, start = split_stop(tiny_engine.tokenizer, free["output_ids"], free["text"])
    params = {**GREEDY, "stop": [stop], "no_stop_trim": no_stop_trim}
    engine_out = tiny_engine.generate(input_ids=ids, sampling_params=params)
    counts["decoders"] = 0

    outputs = halves.run(ids, params)

    assert counts == {"decoders": 1, "detokenizer_decodes": 0}  # the scheduler's decoder, nothing else
    expected = free["text"][: start + len(stop) if no_stop_trim else start]
    assert text_of(outputs) == engine_out["text"] == expected
    assert outputs[-1].finish_reason == engine_out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    out_ids = [t for out in outputs for t in out.new_token_ids]
    assert out_ids == engine_out["output_ids"]
    assert len(out_ids) < GREEDY["max_new_tokens"]  # it stopped at the stop string, not at the budget
    streamed = ""
    for out in outputs:  # streaming never shows text past the stop string
        streamed += out.new_text
        assert expected.startswith(streamed)
    halves.assert_clean()


def test_max_new_tokens_still_ends_a_request_with_stops(halves: Halves, counts: dict[str, int],
                                                        tiny_engine: Engine) -> None:
    ids = tiny_engine.tokenizer.encode(PROMPT)
    params = {**GREEDY, "max_new_tokens": 5, "stop": ["\x00never\x00"]}
    engine_out = tiny_engine.generate(input_ids=ids, sampling_params=params)
    counts["decoders"] = 0

    outputs = halves.run(ids, params)

    assert counts == {"decoders": 1, "detokenizer_decodes": 0}
    assert outputs[-1].finish_reason == {"type": "length", "matched": 5}
    assert [t for out in outputs for t in out.new_token_ids] == engine_out["output_ids"]
    assert text_of(outputs) == engine_out["text"]
    halves.assert_clean()


def test_a_request_without_stops_is_decoded_by_the_detokenizer_only(halves: Halves, counts: dict[str, int],
                                                                     tiny_engine: Engine) -> None:
    ids = tiny_engine.tokenizer.encode(PROMPT)
    engine_out = tiny_engine.generate(input_ids=ids, sampling_params=GREEDY)
    counts["decoders"] = 0

    outputs = halves.run(ids, GREEDY)

    assert counts["decoders"] == 1 and counts["detokenizer_decodes"] > 0  # the detokenizer's decoder
    assert text_of(outputs) == engine_out["text"]
    halves.assert_clean()


# bounded, so that it finishes within max_new_tokens
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("whitespace_pattern", [None, ""])
def test_a_json_schema_is_lowered_once_per_request(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                   whitespace_pattern: str | None) -> None:
    """The outlines backend's lowering runs at the door, with the server's whitespace pattern, and
    the compile worker builds the index of that regex; the output follows the schema."""
    calls: list[tuple[Any, ...]] = []
    schema_to_regex = spec.schema_to_regex

    def counting(*args: Any) -> str:
        calls.append(args)
        return schema_to_regex(*args)

    monkeypatch.setattr(spec, "schema_to_regex", counting)
    with Engine(str(tiny_model_dir), max_total_tokens=4096, random_seed=0, dtype="float32",
                grammar_backend="outlines", constrained_json_whitespace_pattern=whitespace_pattern) as engine:
        out = engine.generate(prompt=PROMPT, sampling_params={"temperature": 0.0, "max_new_tokens": 60,
                                                              "json_schema": json.dumps(SCHEMA)})
        assert calls == [(SCHEMA, whitespace_pattern)]
        jsonschema.validate(json.loads(out["text"]), SCHEMA)
        compiled = next(iter(engine.grammar_backend._key_to_future.values())).result()
        assert compiled.regex == schema_to_regex(SCHEMA, whitespace_pattern)

        again = engine.generate(prompt=PROMPT, sampling_params={"temperature": 0.0, "max_new_tokens": 60,
                                                                "json_schema": json.dumps(SCHEMA)})
        assert len(calls) == 2 and again["text"] == out["text"]  # the second request: at its door only
