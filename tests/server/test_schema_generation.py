"""Generation under real-world-style JSON schemas through the real server (tiny random model,
the default `--grammar-backend xgrammar`): a sample of both schema corpora, each output
validated with `jsonschema` (format checker on); the engine the door chose, and what it served by
a stricter rewrite, are in the native meta_info and the OpenAI response; a schema no engine enforces is refused with 400 naming the
keyword; a small schema of each JSONSchemaBench-style set (`schema_sets`) generate valid
outputs or are refused naming a keyword. (Every schema's compile at the door:
tests/runtime/test_schema_engines.py, the sets' at the door: tests/runtime/test_schema_sets.py.)"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
from conftest import ServerHandle
from jsonschema import FormatChecker
from jsonschema.validators import validator_for

from radixlm.runtime.bench import hard_schema_corpus, schema_corpus, schema_sets

# one schema of each hard family, and two of the first corpus
SAMPLE = hard_schema_corpus.corpus()[::26] + schema_corpus.corpus()[::100]


def _errors(schema: dict[str, Any], instance: object) -> list[str]:
    return [e.message for e in validator_for(schema)(schema, format_checker=FormatChecker()).iter_errors(instance)]


def test_sampled_schemas_give_valid_outputs(tiny_server: ServerHandle) -> None:
    engines = set()
    for n, entry in enumerate(SAMPLE):
        resp = httpx.post(tiny_server.url + "/generate", timeout=300, json={
            "text": "JSON:", "sampling_params": {"json_schema": json.dumps(entry.schema), "max_new_tokens": 160,
                                                 "temperature": 1.0, "seed": n}})
        assert resp.status_code == 200, (entry.name, resp.text)
        out = resp.json()
        assert out["meta_info"]["finish_reason"]["type"] in ("stop", "length"), (entry.name, out["meta_info"])
        assert not _errors(entry.schema, json.loads(out["text"])), (entry.name, out["text"])
        engines.add(out["meta_info"]["grammar_backend"])
    assert engines == {"xgrammar", "llguidance"}


def test_a_sample_of_each_schema_set_gives_valid_outputs(tiny_server: ServerHandle) -> None:
    num_served = 0
    for name, entries in schema_sets.load_sets().items():
        small = [e for e in entries if len(json.dumps(e.schema)) <= 4000]
        for n, entry in enumerate(small[len(small) // 2 : len(small) // 2 + 1]):
            resp = httpx.post(tiny_server.url + "/generate", timeout=300, json={
                "text": "JSON:", "sampling_params": {"json_schema": json.dumps(entry.schema), "max_new_tokens": 160,
                                                     "temperature": 1.0, "seed": n}})
            if resp.status_code == 400:  # refused, naming what no engine enforces
                assert "does not enforce" in resp.text, (name, entry.name, resp.text)
                continue
            assert resp.status_code == 200, (name, entry.name, resp.text)
            assert not _errors(entry.schema, json.loads(resp.json()["text"])), (name, entry.name, resp.json()["text"])
            num_served += 1
    assert num_served >= 6


def test_openai_response_names_the_engine(tiny_server: ServerHandle, tiny_model_name: str) -> None:
    client = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="none")
    schema = {"type": "object", "properties": {"x-a": {"type": "integer"}},
              "patternProperties": {"^x-": {"type": "integer"}}, "required": ["x-a", "b"], "additionalProperties": False,
              "dependentRequired": {"x-a": ["b"]}}
    schema["properties"]["b"] = {"enum": [1, "two", None]}
    completion = client.chat.completions.create(
        model=tiny_model_name, messages=[{"role": "user", "content": "json"}], max_tokens=40, seed=0,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert completion.model_extra["grammar_backend"] == "llguidance"
    assert completion.model_extra["schema_stricter"] == ["dependentRequired"]  # `b` always required
    assert not _errors(schema, json.loads(completion.choices[0].message.content or ""))


def test_meta_info_names_what_a_stricter_rewrite_narrowed(tiny_server: ServerHandle) -> None:
    """`schema_stricter` beside the engine: the keywords served by a form that may leave out valid
    outputs (`contains`: the first item); absent where every rewrite was exact (`uniqueItems`: kept
    at sampling time)."""
    for schema, stricter in (({"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5}}, ["contains"]),
                             ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, None),
                             ({"type": "array", "items": {"type": "integer"}, "maxItems": 2}, None)):
        resp = httpx.post(tiny_server.url + "/generate", timeout=60, json={
            "text": "JSON:", "sampling_params": {"json_schema": json.dumps(schema), "max_new_tokens": 24,
                                                 "temperature": 0}})
        assert resp.status_code == 200, resp.text
        meta = resp.json()["meta_info"]
        assert meta["grammar_backend"] == "xgrammar" and meta.get("schema_stricter") == stricter, meta
        assert not _errors(schema, json.loads(resp.json()["text"]))


def test_a_schema_no_engine_enforces_is_refused_naming_the_keyword(tiny_server: ServerHandle) -> None:
    resp = httpx.post(tiny_server.url + "/generate", timeout=60, json={
        "text": "JSON:", "sampling_params": {"json_schema": json.dumps({"type": "integer", "not": {"multipleOf": 3}})}})
    assert resp.status_code == 400 and "does not enforce 'not'" in resp.text, resp.text
