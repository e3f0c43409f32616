"""The document says what the server enforces (issue 38, point 6): each mismatch schemathesis found
between /openapi.json and the tiny-model server, checked from both sides, the document's schema
(validated with `jsonschema`, as a client generator would read it) and the server's answer."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema
import pytest
from conftest import ServerHandle


@pytest.fixture(scope="module")
def document(tiny_server: ServerHandle) -> dict[str, Any]:
    return httpx.get(f"{tiny_server.url}/openapi.json", timeout=60).json()


def is_valid(document: dict[str, Any], name: str, body: Any) -> bool:
    """Whether `body` is valid by the document's component `name`."""
    schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    return jsonschema.Draft202012Validator(schema).is_valid(body)


def post(server: ServerHandle, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


GEN = {"sampling_params": {"max_new_tokens": 1}}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.mark.parametrize(("body", "ok"), [
    ({"text": "hi"}, True), ({"input_ids": [1, 2]}, True), ({"text": None, "input_ids": [1, 2]}, True),
    ({"text": "hi", "input_ids": [1, 2]}, False), ({}, False), ({"text": None}, False),
    ({"text": []}, False), ({"input_ids": []}, False), ({"input_ids": [[1], []]}, False),
])
def test_generate_takes_exactly_one_of_text_and_input_ids(document: dict[str, Any], tiny_server: ServerHandle,
                                                         body: dict[str, Any], ok: bool) -> None:
    assert is_valid(document, "GenerateReqInput", {**body, **GEN}) is ok
    resp = post(tiny_server, "/generate", {**body, **GEN})
    assert resp.status_code == (200 if ok else 400), resp.text


def test_an_empty_completion_prompt_is_taken_and_an_empty_list_is_not(document: dict[str, Any],
                                                                     tiny_server: ServerHandle) -> None:
    """"" starts from the start-of-text token (as OpenAI takes it); [] says no prompt at all."""
    for prompt, ok in (("", True), ([""], True), ([], False), ([[]], False)):
        body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True}
        assert is_valid(document, "CompletionRequest", body) is ok, prompt
        resp = post(tiny_server, "/v1/completions", body)
        assert resp.status_code == (200 if ok else 400), resp.text
        if ok:  # one prompt of one token
            assert (resp.json()["usage"]["prompt_tokens"], resp.json()["usage"]["completion_tokens"]) == (1, 2)


def test_response_format_with_extra_properties_is_refused(document: dict[str, Any], tiny_server: ServerHandle) -> None:
    schema = {"type": "object"}
    for response_format, where in (({"type": "json_object", "extra": 1}, "response_format: ['extra']"),
                                   ({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "extra": 1}},
                                    "response_format.json_schema: ['extra']")):
        for path, name, base in (("/v1/chat/completions", "ChatRequest", CHAT),
                                 ("/v1/completions", "CompletionRequest", {"prompt": "hi", "max_tokens": 1})):
            body = {**base, "response_format": response_format}
            assert not is_valid(document, name, body)
            resp = post(tiny_server, path, body)
            assert resp.status_code == 400 and resp.json()["error"]["message"] == f"unknown field(s) in {where}"
    resp = post(tiny_server, "/v1/chat/completions", {**CHAT, "response_format": {"type": "xml"}})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith("response_format must be an object whose type is text, ")
    ok = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    assert is_valid(document, "ChatRequest", ok) and post(tiny_server, "/v1/chat/completions", ok).status_code == 200


def test_trace_counts_have_a_documented_minimum(document: dict[str, Any], tiny_server: ServerHandle) -> None:
    call = {"program": "p", "run_id": "r", "branch": "", "index": 0, "primitive": "gen", "latency_s": 0.1,
            "started_at": 1.0}
    for field in ("prompt_tokens", "cached_tokens", "completion_tokens"):
        for value, ok in ((0, True), (-1, False)):
            body = {"entries": [{**call, field: value}]}
            assert is_valid(document, "TracesInput", body) is ok
            assert post(tiny_server, "/traces", body).status_code == (200 if ok else 400)


def test_refused_sglang_fields_document_the_values_taken(document: dict[str, Any], tiny_server: ServerHandle) -> None:
    """A field of SGLang's that this server does not support is documented with the values it
    takes (its defaults), so a client reading the document knows `true` is refused."""
    for value, ok in ((False, True), (True, False)):
        body = {"text": "hi", **GEN, "return_hidden_states": value}
        assert is_valid(document, "GenerateReqInput", body) is ok
        assert post(tiny_server, "/generate", body).status_code == (200 if ok else 400)


@pytest.mark.parametrize("path", ["/flush_cache", "/traces", "/generate"])
def test_an_undocumented_method_gets_405_with_every_method_served(document: dict[str, Any],
                                                                  tiny_server: ServerHandle, path: str) -> None:
    documented = {m.upper() for m in document["paths"][path]}
    for method in ("OPTIONS", "PUT", "DELETE"):
        resp = httpx.request(method, f"{tiny_server.url}{path}", timeout=60)
        assert resp.status_code == 405
        assert {m.strip() for m in resp.headers["allow"].split(",")} == documented
        assert resp.json()["error"]["message"] == f"{method} is not served at {path}; it serves {resp.headers['allow']}"


def test_cache_salt_separates_the_prefix_cache(document: dict[str, Any], tiny_server: ServerHandle) -> None:
    """`cache_salt` (documented, as in SGLang and vLLM) is taken by all three routes, and requests
    with different salts, or none, share no cached prefix; the same salt shares it."""
    prompt = list(range(1000, 1040))  # 40 tokens no other test sends

    def cached(body: dict[str, Any]) -> int:
        resp = post(tiny_server, "/generate", {"input_ids": prompt, **GEN, **body})
        assert resp.status_code == 200, resp.text
        return int(resp.json()["meta_info"]["cached_tokens"])

    assert cached({"cache_salt": "a"}) == 0
    assert cached({"cache_salt": "a"}) >= 32  # the same salt: its prefix is reused
    assert cached({"cache_salt": "b"}) == 0  # another salt sees none of it
    assert cached({}) == 0  # nor does an unsalted request
    assert cached({"cache_salt": "b"}) >= 32 and cached({}) >= 32
    batch = post(tiny_server, "/generate", {"input_ids": [prompt, prompt], "cache_salt": ["a", "c"], **GEN})
    assert [m["meta_info"]["cached_tokens"] >= 32 for m in batch.json()] == [True, False], batch.text
    for path, name, base in (("/v1/chat/completions", "ChatRequest", CHAT),
                             ("/v1/completions", "CompletionRequest", {"prompt": prompt, "max_tokens": 1})):
        assert is_valid(document, name, {**base, "cache_salt": "s"})
        usage = [post(tiny_server, path, {**base, "cache_salt": salt}).json()["usage"] for salt in ("s", "s", "t")]
        assert [u["prompt_tokens_details"]["cached_tokens"] > 0 for u in usage] == [False, True, False], (path, usage)
