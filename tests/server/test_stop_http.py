"""Stop strings through the real server on the tiny model, with a stop string that spans a token
boundary: the output is cut before it (kept with no_stop_trim), generation ends there (fewer
tokens, the KV pool whole again), `finish_reason` names it, and no stream (/generate, the OpenAI
completions and chat streams) shows text past it. The scheduler decodes such a request and the
detokenizer passes its text on (tests/runtime/test_request_path_once.py counts that); this is
what the client sees of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerHandle
from radixlm_testing import stop_across_tokens
from test_native_api import sse_events, wait_idle

from radixlm.runtime.tokenizer.tokenizer import Tokenizer

PROMPT = "The capital of France is"
GREEDY = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}


def generate(server: ServerHandle, **params: Any) -> dict[str, Any]:
    response = httpx.post(server.url + "/generate", json={"text": PROMPT, "sampling_params": {**GREEDY, **params}},
                          timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.fixture(scope="module")
def free(tiny_server: ServerHandle) -> dict[str, Any]:
    """The output without stops: the reference."""
    return generate(tiny_server)


@pytest.fixture(scope="module")
def split_stop(free: dict[str, Any], tiny_model_dir: Path) -> tuple[str, int]:
    """A 4-character stop string of the free text spanning a token boundary (first occurring there),
    and where it starts."""
    return stop_across_tokens(Tokenizer(tiny_model_dir), free["output_ids"], free["text"])


def test_a_split_stop_string_ends_the_request_there(tiny_server: ServerHandle, free: dict[str, Any],
                                                    split_stop: tuple[str, int]) -> None:
    stop, start = split_stop
    cut = generate(tiny_server, stop=stop)
    assert cut["text"] == free["text"][:start]
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert cut["output_ids"] == free["output_ids"][: len(cut["output_ids"])]
    assert cut["meta_info"]["completion_tokens"] < GREEDY["max_new_tokens"]
    kept = generate(tiny_server, stop=[stop], no_stop_trim=True)
    assert kept["text"] == free["text"][: start + len(stop)]
    assert kept["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert kept["output_ids"] == cut["output_ids"]
    wait_idle(tiny_server)  # every KV slot back in the pool


def test_max_new_tokens_ends_a_request_whose_stop_never_comes(tiny_server: ServerHandle,
                                                              free: dict[str, Any]) -> None:
    out = generate(tiny_server, max_new_tokens=5, stop=["\x00never\x00"])
    assert out["meta_info"]["finish_reason"] == {"type": "length", "matched": 5}
    assert out["output_ids"] == free["output_ids"][:5] and free["text"].startswith(out["text"])


def test_generate_stream_never_shows_text_past_the_stop(tiny_server: ServerHandle, free: dict[str, Any],
                                                       split_stop: tuple[str, int]) -> None:
    stop, start = split_stop
    body = {"text": PROMPT, "sampling_params": {**GREEDY, "stop": [stop]}, "stream": True}
    chunks = sse_events(tiny_server, body)[:-1]
    assert all(free["text"][:start].startswith(c["text"]) for c in chunks)
    assert chunks[-1]["text"] == free["text"][:start]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def openai_stream(server: ServerHandle, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=120) as resp:
        assert resp.status_code == 200, resp.read().decode()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: ") :]))
    return events


def test_openai_streams_cut_at_the_stop(tiny_server: ServerHandle, tiny_model_name: str, free: dict[str, Any],
                                        split_stop: tuple[str, int]) -> None:
    stop, start = split_stop
    body = {"model": tiny_model_name, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stop": [stop]}
    events = openai_stream(tiny_server, "/v1/completions", {**body, "prompt": PROMPT})
    assert "".join(c["text"] for e in events for c in e["choices"]) == free["text"][:start]
    assert [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]] == ["stop"]
    # chat: its own prompt, so its reference is a chat run without the stop
    messages = [{"role": "user", "content": PROMPT}]
    chat_free = "".join(c["delta"].get("content") or "" for e in openai_stream(
        tiny_server, "/v1/chat/completions", {**body, "stop": None, "messages": messages}) for c in e["choices"])
    chat_stop = next((chat_free[i : i + 3] for i in range(len(chat_free) // 2, len(chat_free) - 3)
                      if chat_free[i : i + 3].strip()), None)
    if chat_stop is None:
        pytest.skip(f"the chat reference {chat_free!r} is too short for a stop string")
    chat = openai_stream(tiny_server, "/v1/chat/completions", {**body, "stop": [chat_stop], "messages": messages})
    assert "".join(c["delta"].get("content") or "" for e in chat for c in e["choices"]) == \
        chat_free[: chat_free.index(chat_stop)]
    assert [c["finish_reason"] for e in chat for c in e["choices"] if c["finish_reason"]] == ["stop"]
