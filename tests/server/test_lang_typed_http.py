"""The language's typed outputs, `n`, `stop_regex` and traces over HTTP: RuntimeEndpoint (the
native API) and OpenAI (the official client) against the real server on the tiny model (the
in-process Engine: tests/lang/test_typed_outputs.py, test_traces.py)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any, Literal, TypedDict

import httpx
import pydantic
import pytest
from conftest import ServerHandle

import radixlm as rl


class City(pydantic.BaseModel):
    name: Literal["Paris", "Lima", "Oslo"]
    population_millions: int = pydantic.Field(ge=0, le=40)


@dataclasses.dataclass
class Weather:
    sky: Literal["clear", "cloudy"]
    windy: bool


class Answer(TypedDict):
    verdict: Literal["yes", "no"]


@pytest.fixture(scope="module", params=["runtime_endpoint", "openai"])
def backend(request: pytest.FixtureRequest, tiny_server: ServerHandle) -> Iterator[rl.Backend]:
    if request.param == "runtime_endpoint":
        backend: rl.Backend = rl.RuntimeEndpoint(tiny_server.url)
    else:
        model = httpx.get(tiny_server.url + "/v1/models").json()["data"][0]["id"]
        backend = rl.OpenAI(model_name=model, base_url=tiny_server.url + "/v1", max_retries=0, timeout=120)
    yield backend
    backend.shutdown()


@rl.function
def describe(s: Any, kind: Any, n: int = 1) -> None:
    s += rl.user("Describe it as JSON.")
    s += rl.assistant(rl.gen("x", json_schema=kind, max_tokens=64, n=n, temperature=0.8, seed=2))


@pytest.mark.parametrize("kind", [City, Weather, Answer])
def test_typed_outputs(backend: rl.Backend, kind: Any) -> None:
    state = describe.run(kind, backend=backend, trace=True)
    value, raw = state["x"], state.get_meta_info("x")["raw_text"]
    assert state.messages()[-1]["content"] == raw
    if kind is City:
        assert value == City.model_validate_json(raw)
    elif kind is Weather:
        assert value == Weather(**json.loads(raw))
    else:
        assert value == json.loads(raw) and value["verdict"] in ("yes", "no")
    entry = state.trace()[0]
    assert json.loads(entry.sent["sampling_params"]["json_schema"])["title"] == kind.__name__
    if isinstance(backend, rl.OpenAI):  # the chat API was sent messages, not text
        assert entry.sent["messages"] == [{"role": "user", "content": "Describe it as JSON."}]
    else:
        assert entry.sent["prompt"] == state.text()[: -len(raw + "<|im_end|>\n")]
    assert entry.completion_tokens == state.get_meta_info("x")["completion_tokens"] and entry.prompt_tokens


def test_n_samples(backend: rl.Backend) -> None:
    state = describe.run(Answer, 3, backend=backend)
    values, metas = state["x"], state.get_meta_info("x")
    assert len(values) == 3 and [json.loads(m["raw_text"]) for m in metas] == values
    assert state.messages()[-1]["content"] == metas[0]["raw_text"]  # the text continues with the first


def test_stop_regex(backend: rl.Backend) -> None:
    @rl.function
    def letters(s: Any, stop_regex: Any) -> None:
        s += rl.user("Letters please.")
        s += rl.assistant(rl.gen("x", regex="[ab]{24}", stop_regex=stop_regex, temperature=1.0, seed=4))

    if isinstance(backend, rl.OpenAI):
        with pytest.raises(rl.NotSupportedError, match="stop_regex.*native backend"):
            letters.run("b", backend=backend)
        return
    full = letters.run(None, backend=backend)["x"]
    pattern = f"{full[5]}(a|b){full[7]}"  # matches at 5 at the latest
    state = letters.run(pattern, backend=backend, trace=True)
    reason = state.get_meta_info("x")["finish_reason"]
    assert reason["type"] == "stop" and full.startswith(state["x"] + reason["matched"])
    assert len(state["x"]) <= 5 and re.fullmatch(pattern, reason["matched"])
    assert state.trace()[0].sent["sampling_params"]["stop_regex"] == [pattern]
