"""The OpenAI-compatible API through the official `openai` client against the real server."""

from __future__ import annotations

import httpx
import openai
import pytest
from conftest import ServerHandle


@pytest.fixture(scope="module")
def client(tiny_server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def model_id(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_models(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert len(models) == 1 and models[0].id


def test_completions(client: openai.OpenAI) -> None:
    model = model_id(client)
    out = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.object == "text_completion" and len(out.choices) == 1
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 8 and out.usage.prompt_tokens > 0
    again = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert again.choices[0].text == out.choices[0].text
    assert again.usage.prompt_tokens_details.cached_tokens >= out.usage.prompt_tokens - 1
    many = client.completions.create(model=model, prompt=["a", "b"], max_tokens=4, n=2, temperature=0)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    lp = client.completions.create(model=model, prompt="Hi", max_tokens=3, temperature=0, logprobs=2,
                                   extra_body={"ignore_eos": True})
    assert len(lp.choices[0].logprobs.token_logprobs) == 3 and len(lp.choices[0].logprobs.top_logprobs[0]) == 2
    text = out.choices[0].text
    stop = next(text[i : i + 3] for i in range(2, len(text) - 3) if text[i : i + 3].strip())
    stopped = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0,
                                        stop=[stop], extra_body={"ignore_eos": True})
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(stop)]


def test_completions_stream(client: openai.OpenAI) -> None:
    model = model_id(client)
    full = client.completions.create(model=model, prompt="Stream this", max_tokens=10, temperature=0,
                                     extra_body={"ignore_eos": True})
    chunks = list(client.completions.create(model=model, prompt="Stream this", max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat(client: openai.OpenAI) -> None:
    model = model_id(client)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    out = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0, seed=1,
                                         extra_body={"ignore_eos": True})
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 6
    two = client.chat.completions.create(model=model, messages=messages, max_completion_tokens=6, temperature=0,
                                         n=2, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    assert len(two.choices) == 2 and two.choices[0].message.content == out.choices[0].message.content
    assert len(two.choices[0].logprobs.content) == 6 and len(two.choices[0].logprobs.content[0].top_logprobs) == 2
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == out.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 6


def test_chat_errors(client: openai.OpenAI, tiny_server: ServerHandle) -> None:
    model = model_id(client)
    with pytest.raises(openai.BadRequestError, match="regex"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "regex", "regex": "(unclosed"})
    with pytest.raises(openai.BadRequestError, match="json_schema"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": "nope"}})
    with pytest.raises(openai.BadRequestError, match="name"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                       tools=[{"type": "function", "function": {"parameters": {}}}])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], temperature=-1)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    resp = httpx.post(tiny_server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "wat": 1})
    assert resp.status_code == 400 and "wat" in resp.json()["error"]["message"]


def test_response_format_constrains_the_output(client: openai.OpenAI) -> None:
    import json
    import re

    import jsonschema

    model = model_id(client)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
              "required": ["city", "n"], "additionalProperties": False}
    messages = [{"role": "user", "content": "Give me JSON."}]
    out = client.chat.completions.create(
        model=model, messages=messages, max_tokens=60, temperature=1.0,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}},
    )
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)
    obj = client.chat.completions.create(model=model, messages=messages, max_tokens=60, temperature=0,
                                         response_format={"type": "json_object"})
    text = obj.choices[0].message.content
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # a random model may run out of tokens inside the object; it is still an object so far
        assert obj.choices[0].finish_reason == "length" and text.lstrip().startswith("{")
    rx = client.chat.completions.create(model=model, messages=messages, max_tokens=20, temperature=1.0,
                                        response_format={"type": "regex", "regex": "[0-9]{3}-[a-z]{2}"})
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", rx.choices[0].message.content)
    comp = client.completions.create(model=model, prompt="Number:", max_tokens=10, temperature=1.0,
                                     extra_body={"regex": "[1-9][0-9]?"})
    assert re.fullmatch("[1-9][0-9]?", comp.choices[0].text)
