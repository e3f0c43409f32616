"""The language's OpenAI backend (radixlm.OpenAI, through the official client) against the real
server on the tiny random model, checked against the native API on the same prompts."""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, Literal

import httpx
import jsonschema
import pytest
from conftest import ServerHandle, free_port

import radixlm as rl
from radixlm.ir import CHOICES_METHODS

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
          "required": ["city", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def chat(tiny_server: ServerHandle, tiny_model_name: str) -> Iterator[rl.Backend]:
    backend = rl.OpenAI(tiny_model_name, base_url=tiny_server.url + "/v1", max_retries=0, timeout=120)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def completion(tiny_server: ServerHandle, tiny_model_name: str) -> Iterator[rl.Backend]:
    backend = rl.OpenAI(tiny_model_name, base_url=tiny_server.url + "/v1", is_chat_model=False, max_retries=0, timeout=120)
    yield backend
    backend.shutdown()


@rl.function
def ask(s: Any, question: str, **gen_kwargs: Any) -> None:
    s += rl.system("Be brief.")
    s += rl.user(question)
    s += rl.assistant(rl.gen("answer", **gen_kwargs))


def native_generate(server: ServerHandle, prompt: str, **params: Any) -> dict[str, Any]:
    response = httpx.post(server.url + "/generate", json={"text": prompt, "sampling_params": params}, timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json())


def prompt_before(state: rl.ProgramState, backend: rl.Backend, var: str) -> str:
    """The state's text before the assistant message that holds `var` (the gen's prompt)."""
    text, tail = state.text(), state[var] + backend.chat_template.suffix("assistant")
    assert text.endswith(tail)
    return text[: len(text) - len(tail)]


def test_chat_gen_matches_native_generate_and_stops(chat: rl.Backend, tiny_server: ServerHandle) -> None:
    state = ask.run("Say hi", max_tokens=12, temperature=0, ignore_eos=True, backend=chat)
    answer = state["answer"]
    meta = state.get_meta_info("answer")
    assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 12 and meta["prompt_tokens"] > 0
    assert state.messages()[-1] == {"role": "assistant", "content": answer}
    # the state's text is the server's own chat rendering: the native API continues it identically
    native = native_generate(tiny_server, prompt_before(state, chat, "answer"), max_new_tokens=12, temperature=0,
                             ignore_eos=True)
    assert native["text"] == answer
    stop = next(answer[i : i + 3] for i in range(2, len(answer) - 3) if answer[i : i + 3].strip())
    stopped = ask.run("Say hi", max_tokens=12, temperature=0, stop=stop, backend=chat)
    assert stopped["answer"] == answer[: answer.index(stop)]
    assert stopped.get_meta_info("answer")["finish_reason"]["type"] == "stop"


def test_gen_logprobs(chat: rl.Backend, completion: rl.Backend) -> None:
    for backend in (chat, completion):
        state = ask.run("Hi", max_tokens=4, temperature=0, ignore_eos=True, return_logprob=True, top_logprobs_num=2,
                        backend=backend)
        meta = state.get_meta_info("answer")
        assert len(meta["output_token_logprobs"]) == 4 and all(lp <= 0 for lp, _, _ in meta["output_token_logprobs"])
        assert all(len(top) == 2 for top in meta["output_top_logprobs"])


def test_completion_model_sends_the_state_text(completion: rl.Backend, tiny_server: ServerHandle) -> None:
    @rl.function
    def story(s: Any) -> None:
        s += "Once upon a time" + rl.gen("more", max_tokens=8, temperature=0, ignore_eos=True)

    state = story.run(backend=completion)
    assert state["more"] == native_generate(tiny_server, "Once upon a time", max_new_tokens=8, temperature=0,
                                            ignore_eos=True)["text"]


def test_json_schema_and_regex_constrain_the_output(chat: rl.Backend, completion: rl.Backend) -> None:
    state = ask.run("JSON please", json_schema=json.dumps(SCHEMA), max_tokens=60, temperature=1.0, backend=chat)
    jsonschema.validate(json.loads(state["answer"]), SCHEMA)
    state = ask.run("A code", regex=r"[0-9]{3}-[a-z]{2}", max_tokens=20, temperature=1.0, backend=chat)
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", state["answer"])
    state = ask.run("A number", dtype=int, max_tokens=20, temperature=1.0, backend=completion)
    assert re.fullmatch(r"[-+]?[0-9]{1,18}", state["answer"])
    state = ask.run("JSON please", json_schema=json.dumps(SCHEMA), max_tokens=60, temperature=1.0, backend=completion)
    jsonschema.validate(json.loads(state["answer"]), SCHEMA)


def test_streaming_equals_non_streaming(chat: rl.Backend, completion: rl.Backend) -> None:
    for backend in (chat, completion):
        whole = ask.run("Stream", max_tokens=10, temperature=0, ignore_eos=True, backend=backend)
        streamed = ask.run("Stream", max_tokens=10, temperature=0, ignore_eos=True, stream=True, backend=backend)
        pieces = list(streamed.text_iter("answer"))
        assert "".join(pieces) == whole["answer"] and streamed["answer"] == whole["answer"]
        assert streamed.text() == whole.text()
        meta = streamed.get_meta_info("answer")
        assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 10


@rl.function
def pick(s: Any, method: str) -> None:
    s += rl.system("Answer with a colour.")
    s += rl.user("What colour is the sky?")
    s += rl.assistant(rl.select("colour", choices=["red", "green", "light blue"], choices_method=method))


def test_select_scores_as_the_native_backend(chat: rl.Backend, tiny_server: ServerHandle) -> None:
    native = rl.RuntimeEndpoint(tiny_server.url)
    try:
        for method in CHOICES_METHODS:
            ours, theirs = pick.run(method, backend=chat), pick.run(method, backend=native)
            assert ours["colour"] in ("red", "green", "light blue")
            assert ours["colour"] == theirs["colour"] and ours.text() == theirs.text()
            a, b = ours.get_meta_info("colour"), theirs.get_meta_info("colour")
            assert a["scores"] == pytest.approx(b["scores"], abs=1e-3)
            assert [len(x) for x in a["input_token_logprobs"]] == [len(x) for x in b["input_token_logprobs"]]
    finally:
        native.shutdown()


def test_select_without_prompt_logprobs_is_a_clear_error(chat: rl.Backend, tiny_server: ServerHandle,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    unknown = rl.OpenAI("no-such-model", base_url=tiny_server.url + "/v1", max_retries=0)
    with pytest.raises(rl.BackendError, match="select needs the prompt's log-probabilities.*no-such-model"):
        pick.run("token_length_normalized", backend=unknown)
    # a server that answers completions but ignores echo / prompt logprobs
    no_echo = SimpleNamespace(choices=[SimpleNamespace(index=i, text="red", logprobs=None) for i in range(3)], usage=None)
    monkeypatch.setattr(chat.client.completions, "create", lambda **kwargs: no_echo)  # type: ignore[attr-defined]
    with pytest.raises(rl.BackendError, match="select needs the prompt's log-probabilities"):
        pick.run("token_length_normalized", backend=chat)


def get_weather(city: Literal["Paris", "Rome"], unit: Literal["c", "f"] = "c") -> dict[str, Any]:
    """The weather in a city."""
    return {"city": city, "temperature": 21, "unit": unit}


@rl.function
def agent(s: Any, tool_choice: Any) -> None:
    s += rl.system("You can look up the weather.")
    s += rl.user("Weather in Paris?")
    s += rl.assistant(rl.gen("call", tools=[get_weather], tool_choice=tool_choice, max_tokens=48, temperature=0))
    s.run_tool("call")
    s += rl.assistant(rl.gen("answer", max_tokens=4, temperature=0))


@pytest.mark.parametrize("tool_choice", ["required", "get_weather"])
def test_tool_call_and_its_result_round_trip(chat: rl.Backend, tool_choice: str) -> None:
    state = agent.run(tool_choice, backend=chat)
    call = state["call"]
    assert isinstance(call, rl.ToolCall) and call.name == "get_weather" and call.arguments["city"] in ("Paris", "Rome")
    assert f"<tool_call>{call.to_json()}</tool_call>" in state.text()
    _, _, assistant, tool, _ = state.messages()
    assert assistant["tool_calls"][0]["id"] == call.id
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == call.arguments
    assert tool["role"] == "tool" and tool["tool_call_id"] == call.id
    assert json.loads(tool["content"]) == get_weather(**call.arguments)
    assert isinstance(state["answer"], str)  # the server took the replayed call and its result


def test_gen_outside_an_assistant_message_is_a_clear_error(chat: rl.Backend, completion: rl.Backend) -> None:
    @rl.function
    def in_user(s: Any) -> None:
        s += rl.user("Hi " + rl.gen("x", max_tokens=2))

    @rl.function
    def bare(s: Any) -> None:
        s += "Q: " + rl.gen("x", max_tokens=2)

    @rl.function
    def after_text(s: Any) -> None:
        s += rl.user("Hi")
        s += rl.assistant("Sure, " + rl.gen("x", max_tokens=2))

    with pytest.raises(ValueError, match="inside an assistant role.*in a 'user' role"):
        in_user.run(backend=chat)
    with pytest.raises(ValueError, match="inside an assistant role.*outside any role"):
        bare.run(backend=chat)
    with pytest.raises(ValueError, match="must open its assistant message"):
        after_text.run(backend=chat)
    assert bare.run(backend=completion)["x"] is not None  # a completion model takes free text
    with pytest.raises(ValueError, match="needs a chat model"):
        agent.run("required", backend=completion)


def test_server_endpoints(chat: rl.Backend) -> None:
    assert rl.flush_cache(chat) is True
    assert rl.get_server_info(chat)  # our native endpoint at the base URL's root
    assert chat.chat_template.name != "chatml"  # the server's published role wrappers


def test_server_without_native_endpoints() -> None:
    class NoRoutes(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_error(404)

        def do_POST(self) -> None:  # noqa: N802
            self.send_error(404)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NoRoutes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backend = rl.OpenAI("m", base_url=f"http://127.0.0.1:{server.server_port}/v1", max_retries=0)
        assert backend.flush_cache() is False and backend.get_server_info() == {}
        assert backend.chat_template.name == "chatml"
        with pytest.raises(rl.BackendError, match="answered 404"):
            ask.run("Hi", max_tokens=2, backend=backend)
    finally:
        server.shutdown()


def test_down_server_is_a_clear_connection_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    backend = rl.OpenAI("m", base_url=url, max_retries=0, timeout=5)
    with pytest.raises(rl.BackendError, match=f"cannot reach the OpenAI-compatible server at {re.escape(url)}"):
        ask.run("Hi", max_tokens=2, backend=backend)
    with pytest.raises(rl.BackendError, match="cannot reach"):
        backend.flush_cache()


def test_openai_is_imported_only_by_the_backend() -> None:
    code = (
        "import sys, radixlm\n"
        "print('openai' in sys.modules)\n"
        "sys.modules['openai'] = None\n"
        "try:\n    radixlm.OpenAI('m')\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.splitlines() == ["False", "radixlm.OpenAI needs the openai package: pip install radixlm[openai]"]
