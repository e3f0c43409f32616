"""SGLang's remote-API backends: Anthropic (through the official `anthropic` client) and VertexAI
(its REST API) against local stand-ins that speak those protocols (api_standins.py) and relay to
the tiny model's server; LiteLLM (a LiteLLM proxy's OpenAI-compatible API) and Crusoe (an
OpenAI-compatible API) against our own server. Each gives what the OpenAI backend gives on the
same greedy program, and refuses clearly what its API cannot do."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_standins import AnthropicStandIn, VertexStandIn
from conftest import ServerHandle, free_port

import radixlm as rl

KEY = "test-key-123"


@pytest.fixture(scope="module")
def reference(tiny_server: ServerHandle, tiny_model_name: str) -> Iterator[rl.Backend]:
    """The OpenAI backend on our server: what the remote backends must give on the same program."""
    backend = rl.OpenAI(tiny_model_name, base_url=tiny_server.url + "/v1", max_retries=0, timeout=120)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def anthropic_api(tiny_server: ServerHandle, tiny_model_name: str) -> Iterator[AnthropicStandIn]:
    standin = AnthropicStandIn(tiny_server.url, tiny_model_name, KEY)
    yield standin
    standin.close()


@pytest.fixture(scope="module")
def vertex_api(tiny_server: ServerHandle, tiny_model_name: str) -> Iterator[VertexStandIn]:
    standin = VertexStandIn(tiny_server.url, tiny_model_name, KEY)
    yield standin
    standin.close()


@rl.function
def chat(s: Any, **gen_kwargs: Any) -> None:
    s += rl.system("You are terse.")
    s += rl.user("Name a colour.")
    s += rl.assistant(rl.gen("a", max_tokens=8, temperature=0, **gen_kwargs))
    s += rl.user("Another one.")
    s += rl.assistant(rl.gen("b", max_tokens=6, temperature=0, **gen_kwargs))


def same_as_reference(backend: rl.Backend, reference: rl.Backend, **gen_kwargs: Any) -> rl.ProgramState:
    ours, theirs = chat.run(backend=backend, **gen_kwargs), chat.run(backend=reference, **gen_kwargs)
    assert (ours["a"], ours["b"]) == (theirs["a"], theirs["b"]) and ours.messages() == theirs.messages()
    streamed = chat.run(backend=backend, stream=True, **gen_kwargs)
    assert "".join(streamed.text_iter()) == ours.text()
    return ours


def test_anthropic(anthropic_api: AnthropicStandIn, reference: rl.Backend, tiny_model_name: str) -> None:
    backend = rl.Anthropic(tiny_model_name, api_key=KEY, base_url=anthropic_api.url, max_retries=0)
    state = same_as_reference(backend, reference)
    sent = anthropic_api.requests[-1]  # the SDK's request shape
    assert sent["system"] == "You are terse." and sent["max_tokens"] == 6 and sent["temperature"] == 0
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"] and sent["stream"] is True
    meta = state.get_meta_info("b")
    assert meta["id"].startswith("msg_") and meta["finish_reason"] == {"type": "length"}
    assert meta["completion_tokens"] == 6 and meta["prompt_tokens"] > meta["cached_tokens"] >= 0
    stopped = chat.run(backend=backend, stop=["e"])
    assert "e" not in stopped["a"] and anthropic_api.requests[-1]["stop_sequences"] == ["e"]
    if stopped.get_meta_info("a")["finish_reason"]["type"] == "stop":
        assert stopped.get_meta_info("a")["finish_reason"]["matched"] == "e"
    refuses_what_the_api_cannot_do(backend, "Anthropic")
    with pytest.raises(rl.BackendError, match="answered 401"):
        chat.run(backend=rl.Anthropic(tiny_model_name, api_key="wrong", base_url=anthropic_api.url, max_retries=0))
    down = rl.Anthropic(tiny_model_name, api_key=KEY, base_url=f"http://127.0.0.1:{free_port()}", max_retries=0)
    with pytest.raises(rl.BackendError, match="cannot reach the Anthropic API"):
        chat.run(backend=down)
    backend.shutdown()


def test_vertexai(vertex_api: VertexStandIn, reference: rl.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GCP_PROJECT_ID", "proj")
    monkeypatch.setenv("GCP_LOCATION", "europe-west4")
    model = "gemini-stand-in"  # the stand-in serves the tiny model under any name
    backend = rl.VertexAI(model, access_token=KEY, base_url=vertex_api.url)
    same_as_reference(backend, reference)
    sent = vertex_api.requests[-1]
    assert sent["path"] == f"/v1/projects/proj/locations/europe-west4/publishers/google/models/{model}:streamGenerateContent?alt=sse"
    assert sent["systemInstruction"] == {"parts": [{"text": "You are terse."}]}
    assert [c["role"] for c in sent["contents"]] == ["user", "model", "user"]
    assert sent["generationConfig"] == {"maxOutputTokens": 6, "temperature": 0}

    @rl.function
    def samples(s: Any) -> None:
        s += rl.user("Colours?")
        s += rl.assistant(rl.gen("x", max_tokens=5, n=2, temperature=1.0))

    state = samples.run(backend=backend)
    assert len(state["x"]) == 2 and vertex_api.requests[-1]["generationConfig"]["candidateCount"] == 2
    refuses_what_the_api_cannot_do(backend, "Vertex AI")
    monkeypatch.delenv("GCP_PROJECT_ID")
    with pytest.raises(ValueError, match="GCP_PROJECT_ID"):
        rl.VertexAI(model, access_token=KEY)
    with pytest.raises(rl.BackendError, match="answered 401"):
        chat.run(backend=rl.VertexAI(model, project="p", access_token="wrong", base_url=vertex_api.url))
    backend.shutdown()


def refuses_what_the_api_cannot_do(backend: rl.Backend, api: str) -> None:
    @rl.function
    def pick(s: Any) -> None:
        s += rl.user("Yes or no?")
        s += rl.assistant(rl.select("x", ["yes", "no"]))

    with pytest.raises(rl.NotSupportedError, match="select needs the choices' log-probabilities"):
        pick.run(backend=backend)
    with pytest.raises(rl.NotSupportedError, match=rf"the {api} API cannot express gen\(regex="):
        chat.run(backend=backend, regex="[ab]+")
    @rl.function
    def bare(s: Any) -> None:
        s += "x" + rl.gen("x", max_tokens=2)

    with pytest.raises(ValueError, match="inside an assistant role"):
        bare.run(backend=backend)


def test_litellm_through_an_openai_compatible_proxy(tiny_server: ServerHandle, reference: rl.Backend, tiny_model_name: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    same_as_reference(rl.LiteLLM(tiny_model_name, base_url=tiny_server.url + "/v1", max_retries=0), reference)
    monkeypatch.setenv("LITELLM_PROXY_API_BASE", tiny_server.url + "/v1")
    backend = rl.LiteLLM(tiny_model_name)
    assert backend.base_url == tiny_server.url + "/v1" and chat.run(backend=backend)["a"]


def test_crusoe_through_its_openai_compatible_api(tiny_server: ServerHandle, reference: rl.Backend, tiny_model_name: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRUSOE_API_KEY", raising=False)
    with pytest.raises(ValueError, match="CRUSOE_API_KEY"):
        rl.Crusoe(tiny_model_name)
    monkeypatch.setenv("CRUSOE_API_KEY", KEY)
    backend = rl.Crusoe(tiny_model_name, base_url=tiny_server.url + "/v1", max_retries=0)
    assert backend.client.api_key == KEY
    same_as_reference(backend, reference)
    assert "crusoecloud.com" in rl.Crusoe(tiny_model_name).base_url  # the default endpoint
