"""Constrained output that parses whatever the budget, through the real server: the OpenAI client
with small `max_tokens` (the default model, as a user would try it), streaming and not, and the
native API's `closed_by_budget` and its 400 for a budget below the shortest output."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from radixlm.runtime.bench import workloads as wl

TREE = {"type": "object", "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["name", "children"]}
FORMATS = [
    {"type": "json_object"},
    {"type": "json_schema", "json_schema": {"name": "tree", "schema": TREE}},
    {"type": "json_schema", "json_schema": {"name": "person", "schema": wl.W4_SCHEMA}},
]


@pytest.fixture(scope="module")
def client(default_server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=default_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def check(response_format: dict, content: str) -> None:
    value = json.loads(content)
    if response_format["type"] == "json_schema":
        schema = response_format["json_schema"]["schema"]
        jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(value)


@pytest.mark.parametrize("max_tokens", [24, 64, 96])
@pytest.mark.parametrize("index", range(len(FORMATS)), ids=["json_object", "recursive", "w4"])
def test_chat_json_parses_at_any_max_tokens(client: openai.OpenAI, index: int, max_tokens: int) -> None:
    response_format = FORMATS[index]
    messages = [{"role": "user", "content": "Describe a family tree of three generations as JSON, in detail."}]
    out = client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens, temperature=1.0,
                                         seed=index, response_format=response_format)  # type: ignore[arg-type]
    choice = out.choices[0]
    assert choice.finish_reason in ("stop", "length") and out.usage is not None
    assert out.usage.completion_tokens <= max_tokens
    check(response_format, choice.message.content or "")
    stream = client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens, temperature=1.0,
                                            seed=index, response_format=response_format,  # type: ignore[arg-type]
                                            stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    check(response_format, text)


def test_native_api_refuses_too_small_budgets_and_reports_closed_by_budget(default_server: Any) -> None:
    params = {"temperature": 1.0, "seed": 1, "json_schema": json.dumps(TREE)}
    body = {"text": "A family tree as JSON:", "sampling_params": {**params, "max_new_tokens": 3}}
    refused = httpx.post(default_server.url + "/generate", json=body, timeout=300)
    assert refused.status_code == 400
    found = re.search(r"max_new_tokens=3 cannot hold the shortest output this grammar allows \((\d+) tokens\)",
                      refused.json()["error"]["message"])
    assert found, refused.text
    minimum = int(found.group(1))
    body["sampling_params"]["max_new_tokens"] = minimum
    out = httpx.post(default_server.url + "/generate", json=body, timeout=300).json()
    assert out["meta_info"]["finish_reason"] == {"type": "length", "matched": minimum, "closed_by_budget": True}
    check(FORMATS[1], out["text"])
