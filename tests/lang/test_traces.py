"""Program traces (`run(trace=True)`, `state.trace()`, JSON lines) on the tiny Engine: one entry
per gen / select / tool call, forks included, with what was sent and came back and the token
counts the backend reported (the HTTP backends: tests/server/test_lang_typed_http.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Literal

import pytest

import radixlm as rl
from radixlm.backend.engine import EngineBackend


@pytest.fixture(scope="module")
def backend(tiny_engine: Any) -> EngineBackend:
    return EngineBackend(tiny_engine)


def capital(country: Literal["France", "Peru"]) -> str:
    """The capital of a country."""
    return {"France": "Paris", "Peru": "Lima"}[country]


@rl.function
def plan(s: Any, topic: str) -> None:
    s += "Plan a trip about " + topic + ".\n"
    s += "Mode:" + rl.select("mode", ["train", "plane"])
    forks = s.fork(2)
    forks += lambda i: f"\nDay {i + 1}:"
    forks += rl.gen("day", max_tokens=4, temperature=0)
    forks.join()
    s += rl.user("Which capital?")
    s += rl.assistant(rl.gen("call", tools=[capital], tool_choice="required", max_tokens=48, temperature=0))


def test_a_traced_run_records_every_call(backend: EngineBackend) -> None:
    state = plan.run("Peru", backend=backend, trace=True)
    trace = state.trace()
    assert [(e.primitive, e.name) for e in trace][0] == ("select", "mode")
    assert sorted((e.branch, e.name) for e in trace if e.name == "day") == [("0", "day"), ("1", "day")]
    assert (trace[-1].primitive, trace[-1].branch) == ("tool_call", "")
    assert [e.index for e in trace] == list(range(len(trace))) == list(range(4))
    assert len({e.run_id for e in trace}) == 1 and {e.program for e in trace} == {"plan"}
    select = trace[0]
    assert select.sent["prompt"] == "Plan a trip about Peru.\nMode:"
    assert select.sent["choices"] == ["train", "plane"] and select.received == {"choice": state["mode"]}
    meta = state.get_meta_info("mode")
    assert (select.prompt_tokens, select.cached_tokens) == (meta["prompt_tokens"], meta["cached_tokens"])
    for entry in trace:
        if entry.name == "day":
            day = state["day"][int(entry.branch)]
            assert entry.received["text"] == day and entry.received["finish_reason"]["type"] == "length"
            assert entry.sent["prompt"].endswith(f"Day {int(entry.branch) + 1}:")
            assert entry.sent["sampling_params"] == {"max_new_tokens": 4, "temperature": 0}
            assert entry.completion_tokens == 4 and entry.prompt_tokens and entry.cached_tokens
        assert entry.latency_s >= 0 and entry.started_at > 0 and entry.error is None
    assert trace[-1].received["tool_call"] == state.messages()[-1]["content"]
    assert trace[-1].sent["tools"] == ["capital"]
    totals = trace.totals()
    assert totals["calls"] == 4 and totals["completion_tokens"] == sum(e.completion_tokens or 0 for e in trace)


def test_traces_as_json_lines(backend: EngineBackend, tmp_path: Path) -> None:
    states = plan.run_batch([{"topic": "Peru"}, {"topic": "France"}], backend=backend, trace=True)
    path = tmp_path / "traces.jsonl"
    assert rl.write_traces(states, path) == 8
    states[0].trace().write_jsonl(path)  # appends
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 12 and len({line["run_id"] for line in lines}) == 2
    assert lines[0] == json.loads(json.dumps(states[0].trace()[0].to_dict()))
    buffer = io.StringIO()
    states[1].trace().write_jsonl(buffer)
    assert buffer.getvalue() == states[1].trace().to_jsonl() and buffer.getvalue().count("\n") == 4


def test_a_failed_call_is_recorded_with_its_error(backend: EngineBackend) -> None:
    @rl.function
    def bad(s: Any) -> None:
        s += "x" + rl.gen("a", max_tokens=2, temperature=0) + rl.gen("b", regex="(unclosed", max_tokens=4)

    states = bad.run_batch([{}], backend=backend, trace=True)
    trace = states[0].trace()
    assert [e.name for e in trace] == ["a", "b"] and trace[0].error is None
    assert trace[1].error.startswith("BackendError") and "regex" in trace[1].error and trace[1].received == {}


def test_untraced_runs_keep_no_trace(backend: EngineBackend) -> None:
    @rl.function
    def hi(s: Any) -> None:
        s += "hi" + rl.gen("x", max_tokens=1)

    with pytest.raises(ValueError, match="trace=True"):
        hi.run(backend=backend).trace()
    rl.global_config.enable_tracing = True
    try:
        assert len(hi.run(backend=backend).trace()) == 1
    finally:
        rl.global_config.enable_tracing = False
