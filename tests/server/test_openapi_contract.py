"""The typed contract (issue 19, points 1 and 2; issue 38, point 6): /openapi.json documents every
operation's request body, parameters and responses with typed schemas and the right media types,
and schemathesis, driven by that document against the tiny-model server, finds no server error, no
response that breaks it (status code, content type, headers, body schema; SSE events included), no
body the schema refuses that the server takes, no body the schema allows that an operation
without semantic checks refuses, and a 405 with the full `Allow` header for undocumented methods.

The long run (>= 10,000 requests) is `python -m radixlm.runtime.bench.fuzz`; this one is bounded:
EXAMPLES per operation and generation mode, seed pinned."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import ServerHandle

from radixlm.runtime.bench.fuzz import format_runs, fuzz
from radixlm.runtime.config.limits import MAX_CACHE_TREE_NODES

EXAMPLES = 15  # per operation and mode (`python -m radixlm.runtime.bench.fuzz` runs thousands)


@pytest.fixture(scope="module")
def document(tiny_server: ServerHandle) -> dict[str, Any]:
    resp = httpx.get(f"{tiny_server.url}/openapi.json", timeout=60)
    assert resp.status_code == 200
    return resp.json()


def resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def body_schemas(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(operation, where, schema) of every documented request and response body."""
    out = []
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            label = f"{method.upper()} {path}"
            for media, content in op.get("requestBody", {}).get("content", {}).items():
                out.append((label, f"request {media}", content.get("schema", {})))
            for status, response in op["responses"].items():
                for media, content in response.get("content", {}).items():
                    out.append((label, f"{status} {media}", content.get("schema", {})))
    return out


def test_no_body_is_untyped(document: dict[str, Any]) -> None:
    untyped = [(label, where) for label, where, schema in body_schemas(document)
               if not {k: v for k, v in resolve(document, schema).items() if k not in ("title", "description")}]
    assert untyped == []


def test_every_operation_documents_its_bodies_and_errors(document: dict[str, Any]) -> None:
    ops = {f"{m.upper()} {p}": op for p, methods in document["paths"].items() for m, op in methods.items()}
    assert set(ops) >= {"POST /generate", "POST /v1/completions", "POST /v1/chat/completions", "POST /abort_request",
                        "GET /v1/models", "GET /get_model_info", "GET /get_server_info", "GET /health", "GET /metrics",
                        "POST /separate_reasoning", "GET /cache_tree", "GET /dashboard", "POST /traces", "GET /traces"}
    for label in ("POST /generate", "POST /v1/completions", "POST /v1/chat/completions", "POST /abort_request",
                  "POST /separate_reasoning", "POST /traces"):
        op = ops[label]
        assert op["requestBody"]["required"] is True
        assert set(op["requestBody"]["content"]) == {"application/json"}
        error = op["responses"]["400"]["content"]["application/json"]["schema"]
        assert error == {"$ref": "#/components/schemas/ErrorResponse"}
        assert "422" not in op["responses"]  # FastAPI's validation error is our 400
    for label in ("POST /generate", "POST /v1/completions", "POST /v1/chat/completions"):
        assert set(ops[label]["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
        event = ops[label]["responses"]["200"]["content"]["text/event-stream"]["schema"]
        assert event["properties"]["data"]["anyOf"][0] == {"const": "[DONE]"}
    assert set(ops["GET /metrics"]["responses"]["200"]["content"]) == {"text/plain"}
    (max_nodes,) = ops["GET /cache_tree"]["parameters"]
    assert max_nodes["name"] == "max_nodes" and max_nodes["in"] == "query"
    assert (max_nodes["schema"]["minimum"], max_nodes["schema"]["maximum"]) == (1, MAX_CACHE_TREE_NODES)
    assert ops["GET /cache_tree"]["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CacheTree"}
    assert set(ops["GET /dashboard"]["responses"]["200"]["content"]) == {"text/html"}
    assert "content" not in ops["GET /health"]["responses"]["200"]  # no body, not JSON
    schemas = document["components"]["schemas"]
    assert schemas["GenerateReqInput"]["additionalProperties"] is False  # unknown fields: documented as refused
    assert schemas["SamplingParamsInput"]["properties"]["top_p"]["exclusiveMinimum"] == 0.0
    assert {"HTTPValidationError", "ValidationError"}.isdisjoint(schemas)
    parsers = schemas["SeparateReasoningReqInput"]["properties"]["reasoning_parser"]["enum"]
    assert "deepseek-r1" in parsers and "qwen3" in parsers
    assert set(schemas["ChatDelta"]["properties"]) >= {"content", "reasoning_content"}


def test_the_served_document_is_the_one_the_factory_builds(document: dict[str, Any]) -> None:
    from test_hardening_input import openapi_document

    assert document == openapi_document()


def test_schemathesis_finds_no_server_error_and_no_broken_response(tiny_server: ServerHandle) -> None:
    runs = fuzz(tiny_server.url, EXAMPLES, seed=0)
    table = "\n".join(format_runs(runs))
    failures = [f"{run.label} [{run.mode}]: {failure}" for run in runs for failure in run.failures]
    assert failures == [], table + "\n\n" + "\n\n".join(failures[:5])
    positive = {run.label: run for run in runs if run.mode == "positive"}
    assert len(positive) == len({run.label for run in runs if run.mode != "methods"}) >= 12
    methods = {run.label: run for run in runs if run.mode == "methods"}  # OPTIONS and PATCH on every path
    assert "* /traces" in methods and all(run.statuses == {405: 2} for run in methods.values()), table
    assert all(run.num_requests >= 1 for run in positive.values()), table
    bodies = [run for run in runs if run.label.startswith("POST /") and run.label != "POST /flush_cache"]
    assert all(run.num_requests >= EXAMPLES // 2 for run in bodies), table  # both modes really sent bodies
    assert any(200 in run.statuses for run in positive.values() if run.label == "POST /v1/chat/completions"), table


def test_an_integral_float_is_an_integer_and_a_string_is_not(tiny_server: ServerHandle) -> None:
    """JSON has one number type: 2.0 is taken as 2 for an integer field (JSON Schema agrees); 2.5,
    "2" and true are refused, naming the field."""
    url = tiny_server.url
    ok = httpx.post(f"{url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2.0, "ignore_eos": True}},
                    timeout=60)
    assert ok.status_code == 200, ok.text
    assert ok.json()["meta_info"]["completion_tokens"] == 2
    chat = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                            "max_tokens": 3.0, "ignore_eos": True, "n": 1.0}, timeout=60)
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["completion_tokens"] == 3
    for value, says in ((2.5, "must be an integer"), ("2", "must be an integer"), (True, "must be an integer")):
        bad = httpx.post(f"{url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": value}}, timeout=60)
        assert bad.status_code == 400
        assert bad.json()["error"]["message"].startswith(f"sampling_params.max_new_tokens {says}"), bad.text
    bad = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": "3"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("max_tokens must be an integer")


def test_a_vanishing_repetition_penalty_under_a_grammar_is_served(tiny_server: ServerHandle) -> None:
    """Found by the long fuzz run: repetition_penalty 5e-324 (valid, in (0, 2]) is 0 in float32;
    penalized logits became inf and masked ones NaN, the sampler picked a token the grammar
    refuses, and the scheduler process died. Now the logits stay finite and the output valid."""
    for extra in ({"json_schema": {"type": "array", "items": {"type": "integer"}}}, {"temperature": 0.5}):
        resp = httpx.post(f"{tiny_server.url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 5e-324, "max_tokens": 24,
            "min_tokens": 8, **extra})
        assert resp.status_code == 200, resp.text
    assert httpx.get(f"{tiny_server.url}/health", timeout=60).status_code == 200
