"""Hostile input and security through the real server (tiny model, real processes, real HTTP).

One server for the module, started with an API key, a small KV pool and a 5 s grammar-compile
deadline. Three kinds of tests:
- a catalogue of hostile requests (invalid UTF-8, lone surrogates, deep nesting, NaN, huge and
  negative numbers, wrong types, empty and huge prompts, thousands of stop strings, catastrophic
  regexes, explosive and deeply nested JSON schemas, ...), each answered with the expected 4xx
  naming the problem, within a time bound;
- a hypothesis fuzz (derandomized: the same cases every run) of /generate, /v1/completions and
  /v1/chat/completions bodies generated from a handwritten description of their fields, good
  and bad values mixed, some bodies corrupted: never a 5xx, never slower than the bound, and the
  server still serves (and left nothing behind) afterwards;
- security: every registered route refuses a missing or wrong API key; the server listens on
  loopback only, its zmq sockets are ipc:// in a private directory; no request field makes the
  server read a file or fetch a URL.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import stat
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import jsonschema
import pytest
from conftest import ServerHandle, start_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixlm.runtime.bench.soak import process_tree
from radixlm.runtime.server.http_server import OPEN_PATHS

KEY = "hardening-key-7c1"
COMPILE_TIMEOUT_S = 5
# A hang guard, not a speed check: no answer may take this long (grammar compiles stop at their
# deadline, RADIXLM_GRAMMAR_COMPILE_TIMEOUT); elapsed times are reported in STATS, never asserted.
HANG_GUARD_S = 300.0
FUZZ_EXAMPLES = 600
STATS: Counter[str] = Counter()


def start_hardening_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                           *flags: str) -> ServerHandle:
    log = tmp_path_factory.mktemp("hardening") / "server.log"
    old = os.environ.get("RADIXLM_GRAMMAR_COMPILE_TIMEOUT")
    os.environ["RADIXLM_GRAMMAR_COMPILE_TIMEOUT"] = str(COMPILE_TIMEOUT_S)
    try:
        return start_server(tiny_model_dir, log, "--max-total-tokens", "2048", "--random-seed", "0",
                            "--api-key", KEY, *flags)
    finally:
        if old is None:
            del os.environ["RADIXLM_GRAMMAR_COMPILE_TIMEOUT"]
        else:
            os.environ["RADIXLM_GRAMMAR_COMPILE_TIMEOUT"] = old


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """A server on the default grammar backend (xgrammar)."""
    handle = start_hardening_server(tiny_model_dir, tmp_path_factory)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=HANG_GUARD_S) as c:
        yield c


def send(client: httpx.Client, path: str, body: Any = None, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[httpx.Response, float]:
    """POST `body` as JSON (NaN / Infinity / huge ints as Python writes them) or `raw` bytes; the
    response, fully read, and how long it took."""
    content = raw if raw is not None else json.dumps(body).encode()
    start = time.monotonic()
    resp = client.post(path, content=content, headers={"content-type": "application/json", **(headers or {})})
    elapsed = time.monotonic() - start
    STATS["requests"] += 1
    STATS[f"status {resp.status_code}"] += 1
    STATS["slowest_ms"] = max(STATS["slowest_ms"], int(elapsed * 1000))
    return resp, elapsed


def error_message(resp: httpx.Response) -> str:
    body = resp.json()
    assert isinstance(body.get("error", {}).get("message"), str) and body["error"]["message"], resp.text
    return str(body["error"]["message"])


def nested_arrays(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def nested_objects(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def gen(**params: Any) -> dict[str, Any]:
    return {"text": "hi", "sampling_params": {"max_new_tokens": 2, **params}}


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


EXPLOSIVE_REGEX = "(a|b)*a(a|b){24}"  # small and valid, but 2**24 DFA states: only the deadline stops it
HUGE = 10**30

# (id, path, body or raw bytes, expected status, a word the error message must contain)
CATALOGUE: list[tuple[str, str, Any, int, str]] = [
    # the body itself
    ("invalid-utf8", "/generate", b'{"text": "\xff\xfe hi"}', 400, "text: not valid Unicode"),
    ("invalid-utf8-outside-strings", "/generate", b'{"text": "hi"\xff}', 400, "not valid UTF-8 (byte 13)"),
    ("utf8-bom", "/generate", b'\xef\xbb\xbf{"text": "hi"}', 400, "byte order mark"),
    ("utf16-body", "/generate", '{"text": "hi"}'.encode("utf-16"), 400, "not valid UTF-8"),
    ("utf16-le-body", "/generate", '{"text": "hi"}'.encode("utf-16-le"), 400, "not valid JSON"),
    ("truncated-json", "/v1/completions", b'{"prompt": "hi", "max_tokens": ', 400, "not valid JSON"),
    ("empty-body", "/v1/chat/completions", b"", 400, "not valid JSON"),
    ("body-null", "/generate", b"null", 400, "JSON object"),
    ("body-list", "/v1/completions", b"[1, 2]", 400, "must be a JSON object"),
    ("nan", "/v1/completions", b'{"prompt": "hi", "max_tokens": 1, "temperature": NaN}', 400, "NaN"),
    ("infinity", "/generate", b'{"text": "hi", "sampling_params": {"top_p": -Infinity}}', 400, "Infinity"),
    ("1e400", "/generate", b'{"text": "hi", "sampling_params": {"temperature": 1e400}}', 400, "out of range"),
    ("deep-body", "/generate", b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
    ("deep-body-200", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "hi"}], "tools": ' + b"[" * 200 + b"]" * 200 + b"}", 400, "nested"),
    ("surrogate-text", "/generate", b'{"text": "a\\ud800b"}', 400, "surrogate"),
    ("surrogate-key", "/generate", b'{"text": "hi", "sampling_params": {"\\udfff": 1}}', 400, "surrogate"),
    ("surrogate-stop", "/v1/completions", b'{"prompt": "hi", "max_tokens": 1, "stop": ["\\udc00"]}', 400, "surrogate"),
    ("surrogate-rid", "/generate", b'{"text": "hi", "rid": "\\ud800"}', 400, "surrogate"),
    ("surrogate-chat", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', 400, "surrogate"),
    # prompts
    ("empty-ids-generate", "/generate", {"input_ids": []}, 400, "non-empty list"),  # "" starts from BOS/EOS
    ("empty-batch", "/generate", {"text": []}, 400, "non-empty list"),
    ("empty-ids", "/v1/completions", {"prompt": [], "max_tokens": 1}, 400, "empty"),
    ("negative-id", "/v1/completions", {"prompt": [5, -1], "max_tokens": 1}, 400, "token ids"),
    ("huge-id", "/generate", {"input_ids": [1, HUGE]}, 400, "token ids"),
    ("float-id", "/generate", {"input_ids": [1.5]}, 400, "token ids"),
    ("bool-id", "/generate", {"input_ids": [True]}, 400, "token ids"),
    ("ragged-ids", "/generate", {"input_ids": [[1, 2], 3]}, 400, "input_ids"),
    ("long-ids", "/generate", {"input_ids": [7] * 1_000_000}, 400, "context length"),
    ("long-text", "/generate", {"text": "x" * 3_000_000}, 400, "characters"),
    ("long-chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 1000}] * 3000}, 400,
     "characters"),
    ("long-prompt-tokens", "/generate", {"text": "hello " * 600}, 400, "context length"),
    ("batch-too-large", "/generate", {"text": ["a"] * 1025}, 400, "at most 1024 prompts"),
    ("openai-batch-too-large", "/v1/completions", {"prompt": ["a"] * 1025, "max_tokens": 1}, 400, "1024 prompts"),
    ("sequences-too-many", "/generate", {"text": ["a"] * 100, "sampling_params": {"n": 64}}, 400, "sequences"),
    ("openai-sequences", "/v1/completions", {"prompt": ["a"] * 100, "n": 64, "max_tokens": 1}, 400, "sequences"),
    # numbers out of range, wrong types
    ("huge-max-new-tokens", "/generate", gen(max_new_tokens=HUGE), 400, "context length"),
    ("max-new-tokens-past-context", "/generate", gen(max_new_tokens=600), 400, "context length"),
    ("huge-max-tokens", "/v1/completions", {"prompt": "hi", "max_tokens": 10**9}, 400, "context length"),
    ("huge-chat-max-tokens", "/v1/chat/completions", chat(max_tokens=10**9), 400, "context length"),
    ("negative-max-tokens", "/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
    ("negative-max-new-tokens", "/generate", gen(max_new_tokens=-5), 400, "max_new_tokens"),
    ("float-max-new-tokens", "/generate", gen(max_new_tokens=2.5), 400, "max_new_tokens"),
    ("string-max-tokens", "/v1/completions", {"prompt": "hi", "max_tokens": "2"}, 400, "max_tokens"),
    ("huge-n", "/v1/completions", {"prompt": "hi", "max_tokens": 1, "n": 10**9}, 400, "n"),
    ("huge-native-n", "/generate", gen(n=HUGE), 400, "sampling_params.n"),
    ("zero-n", "/v1/chat/completions", chat(n=0), 400, "n"),
    ("negative-temperature", "/v1/completions", {"prompt": "hi", "max_tokens": 1, "temperature": -1}, 400,
     "temperature"),
    ("huge-seed", "/generate", gen(seed=HUGE), 400, "seed"),
    ("huge-top-k", "/generate", gen(top_k=-7), 400, "top_k"),
    ("huge-top-logprobs", "/generate", {"text": "hi", "top_logprobs_num": HUGE}, 400, "top_logprobs_num"),
    ("huge-logprob-start", "/generate", {"text": "hi", "logprob_start_len": HUGE}, 400, "logprob_start_len"),
    ("openai-logprobs", "/v1/completions", {"prompt": "hi", "max_tokens": 1, "logprobs": 10**6}, 400, "logprobs"),
    ("min-over-max", "/generate", gen(min_new_tokens=10**6), 400, "min_new_tokens"),
    ("wrong-stream-type", "/generate", {"text": "hi", "stream": "yes"}, 400, "stream"),
    ("wrong-params-type", "/generate", {"text": "hi", "sampling_params": [1, 2]}, 400, "sampling_params"),
    ("wrong-rid-type", "/generate", {"text": "hi", "rid": 5}, 400, "rid"),
    ("long-rid", "/generate", {"text": "hi", "rid": "r" * 100_000}, 400, "rid"),
    ("unsupported-field", "/generate", {"text": "hi", "lora_path": "/etc/passwd"}, 400, "lora_path"),
    ("unsupported-param", "/generate", gen(logit_bias={str(i): 100 for i in range(50_000)}), 400, "logit_bias"),
    ("openai-logit-bias", "/v1/completions",
     {"prompt": "hi", "max_tokens": 1, "logit_bias": {str(i): 100 for i in range(50_000)}}, 400, "logit_bias"),
    ("bad-role", "/v1/chat/completions", {"messages": [{"role": "root", "content": "hi"}]}, 400, "role"),
    ("no-messages", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("image-part", "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     400, "text content"),
    ("bad-tool-call", "/v1/chat/completions",
     {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": 5}}]}]}, 400, "tool_calls"),
    ("bad-tools", "/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "bad name!"}}]), 400,
     "tools"),
    ("bad-tool-choice", "/v1/chat/completions", chat(tool_choice={"type": "function"}), 400, "tool_choice"),
    ("bad-response-format", "/v1/chat/completions", chat(response_format={"type": "xml"}), 400, "response_format"),
    ("unknown-model", "/v1/completions", {"prompt": "hi", "max_tokens": 1, "model": "gpt-5"}, 404, "not served"),
    ("abort-wrong-type", "/abort_request", {"rid": ["x"]}, 400, "rid"),
    # stop strings
    ("many-stops", "/generate", gen(stop=["x"] * 5000), 400, "stop"),
    ("long-stop", "/generate", gen(stop=["y" * 1_000_000]), 400, "stop"),
    ("many-stop-ids", "/generate", gen(stop_token_ids=list(range(100_000))), 400, "stop_token_ids"),
    ("huge-stop-id", "/generate", gen(stop_token_ids=[HUGE]), 400, "stop_token_ids"),
    ("empty-stop", "/v1/completions", {"prompt": "hi", "max_tokens": 1, "stop": [""]}, 400, "stop"),
    # grammars (the ones whose answer depends on the backend are in GRAMMAR_CATALOGUE)
    ("regex-syntax", "/generate", gen(regex="(unclosed"), 400, "regex"),
    ("regex-nested-repeat", "/generate", gen(regex="a{1000}{1000}"), 400, "regex"),
    ("regex-huge-count", "/generate", gen(regex="[a-z]{1,100000}"), 400, "too large"),
    ("regex-nested-counts", "/generate", gen(regex="((a{100}){100}){100}"), 400, "too large"),
    ("regex-too-long", "/generate", gen(regex="ab|" * 30_000 + "c"), 400, "too long"),
    ("schema-not-json", "/generate", gen(json_schema="{nope"), 400, "json_schema"),
    ("schema-200-deep", "/generate", gen(json_schema=json.dumps(nested_objects(200))), 400, "nested too deeply"),
    ("schema-deep-text", "/generate", gen(json_schema="[" * 50_000 + "]" * 50_000), 400, "nested too deeply"),
    ("schema-huge-bound", "/generate", gen(json_schema=json.dumps({"type": "integer", "maximum": 10**400})), 400,
     "1e30"),
    ("schema-too-long", "/generate", gen(json_schema=json.dumps({"enum": list(range(700_000))})), 400, "too long"),
    ("schema-file-ref", "/generate", gen(json_schema=json.dumps({"$ref": "file:///etc/passwd"})), 400, "$ref"),
    ("schema-unsupported", "/v1/chat/completions",
     chat(response_format={"type": "json_schema", "json_schema": {"schema": {"not": {}}}}), 400, "unsupported"),
    ("grammar-wrong-type", "/generate", gen(regex=["a"]), 400, "regex"),
    ("two-grammars", "/v1/completions", {"prompt": "hi", "max_tokens": 1, "regex": "a", "json_schema": {}}, 400,
     "only one"),
]


# Grammars one backend refuses and another serves: (id, path, body, outlines' (status, word),
# xgrammar's). The outlines backend builds a token DFA (bounded in size and by a compile deadline);
# xgrammar's context-free matcher serves nesting and huge bounds without building one. 200: served.
# A JSON schema outlines refuses goes to the next engine that enforces it (docs/json-schema.md), so
# the outlines server serves those too.
GRAMMAR_CATALOGUE: list[tuple[str, str, Any, tuple[int, str], tuple[int, str]]] = [
    ("regex-explosive", "/generate", gen(regex=EXPLOSIVE_REGEX, max_new_tokens=12),
     (400, f"longer than {COMPILE_TIMEOUT_S} s"), (200, "")),
    ("regex-lookbehind", "/generate", gen(regex="(?<=a)b"), (400, "invalid grammar"), (400, "lookbehind")),
    ("schema-nested-arrays", "/generate", gen(json_schema=json.dumps(nested_arrays(40)), max_new_tokens=90),
     (200, ""), (200, "")),
    ("schema-huge-max-length", "/generate", gen(json_schema=json.dumps({"type": "string", "maxLength": 10**12})),
     (200, ""), (200, "")),
    ("schema-deep-openai", "/v1/chat/completions",
     chat(response_format={"type": "json_schema", "json_schema": {"schema": nested_arrays(40)}}, max_tokens=90),
     (200, ""), (200, "")),
]


@pytest.fixture(scope="module")
def outlines_client(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """A server on the outlines backend with the short compile deadline."""
    handle = start_hardening_server(tiny_model_dir, tmp_path_factory, "--grammar-backend", "outlines")
    try:
        with httpx.Client(base_url=handle.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=HANG_GUARD_S) as c:
            yield c
    finally:
        handle.stop()


@pytest.mark.parametrize("backend", ["outlines", "xgrammar"])
@pytest.mark.parametrize(("path", "body", "outlines", "xgrammar"), [c[1:] for c in GRAMMAR_CATALOGUE],
                         ids=[c[0] for c in GRAMMAR_CATALOGUE])
def test_hostile_grammar_is_refused_or_served_by_each_backend(request: pytest.FixtureRequest, backend: str, path: str,
                                                             body: Any, outlines: tuple[int, str],
                                                             xgrammar: tuple[int, str]) -> None:
    """Refused with the reason, or served with an output under the grammar; never a hang or a 5xx."""
    status, needle = outlines if backend == "outlines" else xgrammar
    client = request.getfixturevalue("outlines_client" if backend == "outlines" else "client")
    resp, _ = send(client, path, body=body)
    assert resp.status_code == status, resp.text[:500]
    if status != 200:
        assert needle.lower() in error_message(resp).lower()
        return
    params = body.get("sampling_params") or {}
    text = resp.json()["text"] if path == "/generate" else resp.json()["choices"][0]["message"]["content"]
    if "regex" in params:
        assert re.fullmatch(params["regex"], text), text
    else:
        schema = params.get("json_schema") or body["response_format"]["json_schema"]["schema"]
        jsonschema.validate(json.loads(text), json.loads(schema) if isinstance(schema, str) else schema)


@pytest.mark.parametrize(("path", "body", "status", "needle"), [c[1:] for c in CATALOGUE], ids=[c[0] for c in CATALOGUE])
def test_hostile_request_gets_a_4xx_naming_the_problem(client: httpx.Client, path: str, body: Any, status: int,
                                                       needle: str) -> None:
    resp, _ = send(client, path, raw=body if isinstance(body, bytes) else None, body=body)
    assert resp.status_code == status, resp.text[:500]
    assert needle.lower() in error_message(resp).lower()


def test_oversized_bodies_get_413_without_being_read(client: httpx.Client) -> None:
    big = b'{"text": "' + b"a" * (33 * 1024 * 1024) + b'"}'
    resp, _ = send(client, "/generate", raw=big)
    assert resp.status_code == 413 and "larger than" in error_message(resp)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server counts as it reads
        yield b'{"text": "'
        for _ in range(40):
            yield b"a" * (1024 * 1024)
        yield b'"}'

    resp = client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413 and "larger than" in error_message(resp)


@pytest.mark.parametrize("regex", ["(a+)+$", "(a|aa)*b{1000}", "(x+x+)+y"])
def test_backtracking_regexes_are_harmless(client: httpx.Client, regex: str) -> None:
    """Catastrophic for a backtracking matcher, not for our DFAs: each compiles (quickly, or is
    stopped by the deadline) and constrains the output, or is refused with the reason (no output
    can match `$` as an anchor; 8 tokens cannot hold 1,000 b's); never a hang or a 5xx."""
    import re

    resp, _ = send(client, "/generate", gen(regex=regex, max_new_tokens=8))
    if resp.status_code == 200:
        assert re.fullmatch(regex, resp.json()["text"])
    else:
        reasons = ("longer than", "no output of this tokenizer can match it", "cannot hold the shortest output")
        assert resp.status_code == 400 and any(reason in error_message(resp) for reason in reasons)


def test_logprobs_of_masked_tokens_are_valid_json(client: httpx.Client) -> None:
    """Found by the fuzz: under a grammar, top logprobs list tokens the mask ruled out at -inf,
    which JSON cannot carry (500 / a broken stream). They are reported as -9999.0."""
    requests = [
        ("/generate", {"text": "n:", "sampling_params": {"regex": "(yes|no)", "max_new_tokens": 3},
                       "return_logprob": True, "top_logprobs_num": 10, "logprob_start_len": 0}),
        ("/generate", {"text": "n:", "sampling_params": {"regex": "(yes|no)", "max_new_tokens": 3}, "stream": True,
                       "return_logprob": True, "top_logprobs_num": 5}),
        ("/v1/completions", {"prompt": "0", "max_tokens": 8, "logprobs": 2, "json_schema": {
            "type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}, "required": ["a"]}}),
        ("/v1/chat/completions", chat(max_tokens=3, logprobs=True, top_logprobs=5,
                                      response_format={"type": "json_schema", "json_schema": {"schema": {"type": "boolean"}}})),
    ]
    for path, body in requests:
        resp, _ = send(client, path, body)
        assert resp.status_code == 200, resp.text[:300]
        text = resp.text
        assert "Infinity" not in text and "NaN" not in text
        if body.get("stream"):
            check_sse(resp)
            continue
        if path == "/generate":  # at most 6 tokens start "yes" or "no": some of the top 10 are masked
            assert any(lp == -9999.0 for row in resp.json()["meta_info"]["output_top_logprobs"] for lp, _, _ in row)


# ---------------------------------------------------------------- the fuzz
#
# Each body is a valid request (every field drawn from its good values) with up to two fields
# replaced by hostile values, so each hostile value meets the layers behind the first check; a
# few bodies are then corrupted as bytes. The description of the fields is below, per endpoint.

WEIRD_STRINGS = ["", "\ud800", "a\udfffb", "\x00", "\u202e", "😀", "<|im_end|>", "{{ 7*7 }}", "x" * 5000,
                 "../../etc/passwd", "file:///etc/passwd"]
EXTREME_INTS = [-(2**63) - 1, -(2**31), -1, 0, 2**31, 2**63, HUGE]
EXTREME_FLOATS = [math.nan, math.inf, -math.inf, -1.0, 1e-300, 1e308, 2.5]
GOOD_SCHEMAS: list[Any] = [
    {"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"},
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}, "required": ["a"]},
]
BAD_SCHEMAS: list[Any] = [
    {"$ref": "file:///etc/passwd"}, nested_arrays(40), nested_objects(100), {"type": "string", "maxLength": 10**12},
    {"type": "integer", "minimum": 10**400}, {"not": {}}, "{nope", "[" * 5000, [], 5,
]
BAD_REGEXES = ["(unclosed", "a{1000}{1000}", "[a-z]{1,100000}", EXPLOSIVE_REGEX, "(?<=a)b", "\\p{L}{3}", "(a+)+$"]

any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.sampled_from(WEIRD_STRINGS),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
weird_int = st.sampled_from(EXTREME_INTS)
weird_float = st.sampled_from(EXTREME_FLOATS)
weird_text = st.sampled_from(WEIRD_STRINGS) | st.text(max_size=24)
good_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=16)
small = st.integers(0, 3)
schema_junk = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["integer", "string", "boolean", "nope"])}),
    lambda inner: st.fixed_dictionaries({"type": st.just("array"), "items": inner})
    | st.fixed_dictionaries({"type": st.just("object"), "properties": st.dictionaries(st.text("ab", max_size=2), inner, max_size=3)}),
    max_leaves=5,
)
bad_schema = st.sampled_from(BAD_SCHEMAS) | schema_junk
bad_stop = st.one_of(st.lists(st.just("z"), min_size=33, max_size=40), st.just(["s" * 300]), st.just([""]),
                     st.lists(weird_text, max_size=3))


def bad(*kinds: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The hostile values of a field: its own kinds, and anything at all."""
    return st.one_of(*kinds, any_json)


@st.composite
def mutated(draw: st.DrawFn, good: dict[str, st.SearchStrategy[Any]], hostile: dict[str, st.SearchStrategy[Any]],
            required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A body of good values (the required fields and some optional ones), then 0-2 fields hostile."""
    body = draw(st.fixed_dictionaries({k: good[k] for k in required},
                                      optional={k: v for k, v in good.items() if k not in required}))
    for key in draw(st.lists(st.sampled_from(sorted(hostile)), max_size=2, unique=True)):
        body[key] = draw(hostile[key])
    return body


SAMPLING_GOOD: dict[str, st.SearchStrategy[Any]] = {
    "max_new_tokens": small, "min_new_tokens": st.integers(0, 1), "temperature": st.floats(0, 2),
    "top_p": st.floats(0.05, 1), "top_k": st.sampled_from([-1, 1, 5]), "min_p": st.floats(0, 0.5),
    "frequency_penalty": st.floats(-2, 2), "presence_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.5, 2), "stop": st.sampled_from(["\n", ["a", "the"]]),
    "stop_token_ids": st.lists(st.integers(0, 49_151), max_size=3), "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(), "seed": st.integers(-(2**63), 2**63 - 1), "no_stop_trim": st.booleans(),
    "n": st.integers(1, 3), "regex": st.sampled_from(["[0-9]{2}", "(yes|no)"]),
    "json_schema": st.sampled_from(GOOD_SCHEMAS).map(json.dumps),
}
SAMPLING_BAD: dict[str, st.SearchStrategy[Any]] = {
    "max_new_tokens": bad(weird_int, st.just(600)), "min_new_tokens": bad(weird_int),
    "temperature": bad(weird_float), "top_p": bad(weird_float), "top_k": bad(weird_int), "min_p": bad(weird_float),
    "frequency_penalty": bad(weird_float), "repetition_penalty": bad(weird_float), "stop": bad(bad_stop),
    "stop_token_ids": bad(st.lists(weird_int, min_size=1, max_size=2), st.just(list(range(300)))),
    "ignore_eos": bad(), "seed": bad(weird_int), "n": bad(weird_int, st.just(65)),
    "regex": bad(st.sampled_from(BAD_REGEXES)), "json_schema": bad(bad_schema.map(json.dumps), bad_schema),
    "stop_regex": bad(), "logit_bias": bad(), "ebnf": bad(st.just("root ::= 'a'")),
}
sampling_params = mutated(SAMPLING_GOOD, SAMPLING_BAD, ("max_new_tokens",))
token_ids = st.lists(st.integers(0, 49_151), min_size=1, max_size=6)
generate_body = mutated(
    {"text": good_text | st.lists(good_text, min_size=1, max_size=3), "sampling_params": sampling_params,
     "rid": st.uuids().map(str), "return_logprob": st.booleans(), "logprob_start_len": st.just(-1),
     "top_logprobs_num": st.integers(0, 3), "return_text_in_logprobs": st.booleans(), "stream": st.booleans()},
    {"text": bad(weird_text, st.lists(weird_text, max_size=3), st.just(["a"] * 1025)),
     "input_ids": bad(token_ids, st.lists(weird_int, min_size=1, max_size=3), st.lists(token_ids, max_size=2)),
     "sampling_params": bad(st.lists(sampling_params, max_size=3)), "rid": bad(st.just("r" * 300)),
     "return_logprob": bad(), "logprob_start_len": bad(weird_int), "top_logprobs_num": bad(weird_int),
     "stream": bad(), "bogus": bad()},
    ("text", "sampling_params"),
)
OPENAI_GOOD: dict[str, st.SearchStrategy[Any]] = {
    "model": st.just("default"), "n": st.integers(1, 3), "temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1),
    "stop": st.sampled_from(["\n", ["a", "b"]]), "seed": st.integers(0, 2**63 - 1), "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}), "presence_penalty": st.floats(-2, 2),
    "top_k": st.sampled_from([-1, 3]), "ignore_eos": st.booleans(), "stop_token_ids": st.lists(st.integers(0, 49_151), max_size=2),
    "regex": st.sampled_from(["[0-9]{2}", "(yes|no)"]), "user": good_text,
}
OPENAI_BAD: dict[str, st.SearchStrategy[Any]] = {
    "model": bad(st.sampled_from(["gpt-5", "/etc/passwd"])), "n": bad(weird_int), "temperature": bad(weird_float),
    "top_p": bad(weird_float), "stop": bad(bad_stop), "seed": bad(weird_int), "stream": bad(),
    "stream_options": bad(), "top_k": bad(weird_int), "stop_token_ids": bad(st.lists(weird_int, min_size=1, max_size=2)),
    "logit_bias": bad(st.dictionaries(st.text(max_size=3), st.integers(), max_size=3)),
    "regex": bad(st.sampled_from(BAD_REGEXES)), "json_schema": bad(bad_schema),
    "max_tokens": bad(weird_int, st.just(600)), "bogus": bad(),
}
completion_body = mutated(
    {**OPENAI_GOOD, "max_tokens": small, "prompt": good_text | st.lists(good_text, min_size=1, max_size=3) | token_ids,
     "logprobs": st.integers(0, 3), "echo": st.booleans(), "json_schema": st.sampled_from(GOOD_SCHEMAS)},
    {**OPENAI_BAD, "prompt": bad(weird_text, st.lists(weird_text, max_size=3), st.lists(weird_int, min_size=1, max_size=2),
                                 st.just([[]])),
     "logprobs": bad(weird_int), "echo": bad()},
    ("prompt", "max_tokens"),
)
good_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]), "content": good_text})
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}
chat_body = mutated(
    {**OPENAI_GOOD, "max_tokens": small, "messages": st.lists(good_message, min_size=1, max_size=3),
     "max_completion_tokens": small, "logprobs": st.booleans(), "top_logprobs": st.integers(0, 3),
     "tools": st.just([TOOL]), "tool_choice": st.sampled_from(["auto", "none"]),
     "response_format": st.sampled_from([{"type": "text"}] + [{"type": "json_schema", "json_schema": {"schema": g}}
                                                              for g in GOOD_SCHEMAS])},
    {**OPENAI_BAD,
     "messages": bad(st.just([]), st.lists(st.fixed_dictionaries({"role": bad(st.just("root")), "content": bad(weird_text)}),
                                           min_size=1, max_size=2),
                     st.just([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": 5}}]}]),
                     st.just([{"role": "user", "content": [{"type": "image_url", "image_url": "file:///etc/passwd"}]}])),
     "max_completion_tokens": bad(weird_int), "top_logprobs": bad(weird_int), "logprobs": bad(),
     "tools": bad(st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
         {"name": weird_text}, optional={"parameters": bad_schema})}), min_size=1, max_size=2)),
     "tool_choice": bad(st.just("required"), st.fixed_dictionaries({"type": st.just("function"),
                                                                   "function": st.fixed_dictionaries({"name": weird_text})})),
     "response_format": bad(st.just({"type": "xml"}), st.just({"type": "json_object"}),
                            bad_schema.map(lambda sch: {"type": "json_schema", "json_schema": {"schema": sch}}),
                            st.just({"type": "regex", "regex": EXPLOSIVE_REGEX}))},
    ("messages", "max_tokens"),
)
CORRUPTIONS = ["none"] * 8 + ["truncate", "invalid-utf8", "trailing-garbage", "wrapped-in-list"]


def corrupt(data: bytes, how: str) -> bytes:
    if how == "truncate":
        return data[: len(data) // 2]
    if how == "invalid-utf8":
        return data.replace(b'"', b'"\xc3\x28', 1)
    if how == "trailing-garbage":
        return data + b"}{"
    if how == "wrapped-in-list":
        return b"[" + data + b"]"
    return data


def check_sse(resp: httpx.Response) -> None:
    """A 200 stream: data lines of JSON, ending with [DONE]; errors in it are client errors."""
    lines = [line[len("data: "):] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]", resp.text[-300:]
    for line in lines[:-1]:
        event = json.loads(line)
        assert event.get("error", {}).get("code", 400) < 500, line


@settings(max_examples=FUZZ_EXAMPLES, suppress_health_check=list(HealthCheck))  # + the suite's profile
@given(st.one_of(st.tuples(st.just("/generate"), generate_body), st.tuples(st.just("/v1/completions"), completion_body),
                 st.tuples(st.just("/v1/chat/completions"), chat_body)),
       st.sampled_from(CORRUPTIONS))
def test_fuzz_never_5xx(client: httpx.Client, request_case: tuple[str, dict[str, Any]], how: str) -> None:
    path, body = request_case
    resp, elapsed = send(client, path, raw=corrupt(json.dumps(body).encode(), how))
    STATS[f"fuzz {path}"] += 1
    STATS["fuzz_ms"] += int(elapsed * 1000)
    assert resp.status_code < 500, f"{path} {json.dumps(body)[:800]!r} -> {resp.status_code} {resp.text[:300]}"
    if resp.status_code >= 400:
        error_message(resp)
    elif resp.headers.get("content-type", "").startswith("text/event-stream"):
        check_sse(resp)
    else:
        resp.json()


def test_fuzz_run_left_the_server_serving(server: ServerHandle, client: httpx.Client) -> None:
    """After everything above: healthy, serving plain and constrained requests, no request or KV
    slot left behind, and not one traceback in the server's log."""
    assert client.get("/health").status_code == 200
    plain, _ = send(client, "/generate", gen(max_new_tokens=4, temperature=0))
    assert plain.status_code == 200 and plain.json()["meta_info"]["completion_tokens"] == 4
    constrained, _ = send(client, "/generate", gen(regex="[0-9]{3}", max_new_tokens=8))
    assert constrained.status_code == 200 and len(constrained.json()["text"]) == 3
    answer, _ = send(client, "/v1/chat/completions", chat(max_tokens=3))
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["role"] == "assistant"
    deadline = time.monotonic() + 120  # a hang guard
    while True:
        info = client.get("/get_server_info").json()
        if info["num_running_reqs"] == info["num_waiting_reqs"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert info["num_running_reqs"] == info["num_waiting_reqs"] == 0
    assert client.post("/flush_cache").status_code == 200
    info = client.get("/get_server_info").json()
    assert info["kv_pool"]["free_tokens"] == info["max_total_num_tokens"]
    log = server.log()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]
    print(f"\nhardening: {STATS['requests']} requests, of which fuzz cases: "
          f"{sum(v for k, v in STATS.items() if k.startswith('fuzz /'))} "
          f"({', '.join(f'{k[5:]}: {v}' for k, v in sorted(STATS.items()) if k.startswith('fuzz /'))}); "
          f"statuses {dict(sorted((k[7:], v) for k, v in STATS.items() if k.startswith('status ')))}; "
          f"fuzz time {STATS['fuzz_ms'] / 1000:.1f} s; slowest answer {STATS['slowest_ms'] / 1000:.1f} s")


# ---------------------------------------------------------------- security


def registered_routes() -> list[tuple[str, str]]:
    """(path, method) of every route the app registers, from an app built with the same factory."""
    from radixlm.runtime.server.http_server import create_app

    app = create_app(SimpleNamespace(tokenizer=SimpleNamespace(chat_template=None)), api_key=KEY)  # type: ignore[arg-type]
    return sorted({(route.path, method) for route in app.routes for method in getattr(route, "methods", None) or ()})


def test_every_route_needs_the_api_key(server: ServerHandle) -> None:
    routes = registered_routes()
    paths = {path for path, _ in routes}
    assert {"/generate", "/v1/completions", "/v1/chat/completions", "/v1/models", "/metrics", "/flush_cache",
            "/get_server_info", "/server_info", "/abort_request", "/health_generate", "/get_model_info",
            "/health", "/openapi.json", "/docs"} <= paths
    wrong_keys = [None, "Bearer wrong", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", KEY, f"bearer{KEY}",
                  f"Basic {KEY}", f"Bearer  {KEY}", f"Bearer {KEY}\tx", ""]
    with httpx.Client(base_url=server.url, timeout=60) as anonymous:
        for path, method in routes + [("/no/such/route", "GET"), ("/health/", "GET"), ("/%67enerate", "POST")]:
            for auth in wrong_keys:
                headers = {} if auth is None else {"Authorization": auth}
                resp = anonymous.request(method, path, headers=headers, content=b"{}")
                if path in OPEN_PATHS:  # /health and the dashboard's page (it holds no data)
                    assert resp.status_code == 200, (method, path, auth)
                    continue
                assert resp.status_code == 401, (method, path, auth, resp.status_code)
                assert KEY not in resp.text
                if method != "HEAD":
                    assert "API key" in error_message(resp)
            for scheme in ("Bearer", "bearer", "BEARER"):  # the scheme is case-insensitive (RFC 9110)
                resp = anonymous.request(method, path, headers={"Authorization": f"{scheme} {KEY}"}, content=b"{}")
                assert resp.status_code != 401, (method, path, scheme)
                assert resp.status_code < 500, (method, path, resp.status_code, resp.text[:300])


def socket_inodes(pids: list[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def test_listens_on_loopback_only_and_zmq_is_private(server: ServerHandle) -> None:
    inodes = socket_inodes(process_tree(server.proc.pid))
    listening = []  # (address, port) of every TCP socket the server's processes listen on
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[9]) in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                listening.append((address, int(port, 16)))
    port = int(server.url.rsplit(":", 1)[1])
    assert listening == [("0100007F", port)], listening  # 127.0.0.1, little-endian hex; nothing else
    socket_paths = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and int(fields[6]) in inodes and "radixlm-ipc-" in fields[7]:
            socket_paths.append(Path(fields[7]))
    assert socket_paths, "no zmq ipc socket found"
    for path in socket_paths:
        info = os.stat(path.parent)
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid(), (path, oct(info.st_mode))


def test_no_request_field_reads_a_file_or_fetches_a_url(client: httpx.Client) -> None:
    """Schema references and path-like fields are refused with 400 (or 404 for `model`), never
    followed: a listener standing in for a remote schema host sees no connection."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        here = f"127.0.0.1:{listener.getsockname()[1]}"
        refs = [f"http://{here}/schema.json", f"https://{here}/s.json#/a", f"//{here}/x", "file:///etc/passwd",
                "/etc/passwd", "../../../../etc/passwd", "passwd#/x"]
        for ref in refs:
            ref_schema = {"type": "object", "properties": {"a": {"$ref": ref}}, "required": ["a"]}
            requests = [
                ("/generate", gen(json_schema=json.dumps(ref_schema))),
                ("/generate", gen(json_schema=json.dumps({"$ref": ref}))),
                ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "json_schema": ref_schema}),
                ("/v1/chat/completions", chat(response_format={"type": "json_schema", "json_schema": {"schema": ref_schema}})),
                ("/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "f", "parameters": ref_schema}}],
                                              tool_choice="required")),
            ]
            for path, body in requests:
                resp, _ = send(client, path, body)
                assert resp.status_code == 400 and "$ref" in error_message(resp), (path, ref, resp.text[:300])
        for name in ["/etc/passwd", "file:///etc/passwd", "../../etc/passwd", f"http://{here}/model"]:
            resp, _ = send(client, "/v1/chat/completions", chat(model=name))
            assert resp.status_code == 404 and "root:" not in resp.text
        for extra in [{"chat_template": "/etc/passwd"}, {"tokenizer_path": "/etc/passwd"}, {"lora_path": "/etc/passwd"},
                      {"model_path": "/etc/passwd"}]:
            for path, body in [("/generate", {"text": "hi", **extra}), ("/v1/completions", {"prompt": "hi", **extra}),
                               ("/v1/chat/completions", chat(**extra))]:
                resp, _ = send(client, path, body)
                assert resp.status_code == 400 and next(iter(extra)) in error_message(resp)
        with pytest.raises(BlockingIOError):
            listener.accept()


# Every string field of every request body /openapi.json documents (reached through objects,
# lists and unions; a list's first item stands for all), as raw bytes that are not UTF-8 (an
# encoded surrogate, ED A0 80; a stray continuation byte) and as a lone surrogate escape: a 400
# naming the field. The body around it need not be valid: text is checked before anything else.
def openapi_document() -> dict[str, Any]:
    """/openapi.json as the server builds it (the same factory; the test below compares)."""
    from radixlm.runtime.server.http_server import create_app

    app = create_app(SimpleNamespace(tokenizer=SimpleNamespace(chat_template=None)))  # type: ignore[arg-type]
    return app.openapi()


def string_fields(document: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, field) of every string a request body may hold, e.g. ("/generate", "sampling_params.stop[0]")."""
    components = document["components"]["schemas"]

    def walk(schema: dict[str, Any], where: str, seen: frozenset[str]) -> Iterator[str]:
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            if name not in seen:  # a recursive model is walked once
                yield from walk(components[name], where, seen | {name})
            return
        for option in schema.get("anyOf", []) + schema.get("oneOf", []):
            yield from walk(option, where, seen)
        kind = schema.get("type")
        if kind == "string" or "const" in schema and isinstance(schema["const"], str):
            yield where
        elif kind == "array" and isinstance(schema.get("items"), dict):
            yield from walk(schema["items"], f"{where}[0]", seen)
        for name, sub in schema.get("properties", {}).items():
            yield from walk(sub, f"{where}.{name}" if where else name, seen)

    fields = []
    for path, methods in document["paths"].items():
        body = methods.get("post", {}).get("requestBody")
        if body is not None:
            fields += [(path, f) for f in dict.fromkeys(walk(body["content"]["application/json"]["schema"], "", frozenset()))]
    return fields


def body_with(field: str, value: str) -> dict[str, Any]:
    """A JSON body that holds `value` at `field` (`messages[0].content[0].text`), nothing else."""
    steps = [int(s) if s.isdigit() else s for s in field.replace("[", ".").replace("]", "").split(".")]
    root: dict[str, Any] = {}
    node: Any = root
    for step, after in zip(steps, steps[1:] + [None]):
        child = value if after is None else [] if isinstance(after, int) else {}
        if isinstance(node, list):
            node.append(child)
        else:
            node[step] = child
        node = child
    return root


STRING_FIELDS = string_fields(openapi_document())
NOT_UNICODE = {"raw-surrogate": b"a\xed\xa0\x80b", "stray-byte": b"a\x80b", "escape": b"a\\ud800b"}


@pytest.mark.parametrize("how", sorted(NOT_UNICODE))
@pytest.mark.parametrize(("path", "field"), STRING_FIELDS, ids=[f"{p}:{f}" for p, f in STRING_FIELDS])
def test_a_string_that_is_not_unicode_is_a_400_naming_its_field(client: httpx.Client, path: str, field: str,
                                                                 how: str) -> None:
    raw = json.dumps(body_with(field, "@")).encode().replace(b"@", NOT_UNICODE[how])
    resp, _ = send(client, path, raw=raw, body=None)
    assert resp.status_code == 400, resp.text[:500]
    assert error_message(resp).startswith(f"{field}: not valid Unicode"), error_message(resp)
