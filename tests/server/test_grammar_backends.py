"""`--grammar-backend xgrammar` and `llguidance` end to end on the tiny model: EBNF through the
native API, both OpenAI endpoints (the real `openai` client, `extra_body`) and the language; JSON
schemas; the outlines backend answers 400 naming the backends that can serve EBNF; greedy output is
the same with jump-forward on and off. (Recursive schemas, token by token: tests/runtime/test_cfg_backends.py.)"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from conftest import ServerHandle, start_server

import radixlm as rl

YES_NO = 'root ::= "yes" | "no" | "maybe " [0-9] [0-9]?'
ANSWERS = {"yes", "no"} | {f"maybe {i}" for i in range(10)} | {f"maybe {i:02d}" for i in range(100)}
CHOICE_SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}},
    "required": ["color", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def cfg_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                    request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """A server on each context-free grammar backend."""
    log = tmp_path_factory.mktemp("server") / f"{request.param}.log"
    server = start_server(tiny_model_dir, log, "--max-total-tokens", "4096", "--random-seed", "0",
                          "--grammar-backend", request.param)
    yield server
    server.stop()


def _generate(url: str, **params: object) -> dict:
    resp = httpx.post(url + "/generate", json={"text": "Answer:", "sampling_params": params}, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_native_ebnf_output_is_in_the_language(cfg_server: ServerHandle) -> None:
    for seed in range(6):
        out = _generate(cfg_server.url, ebnf=YES_NO, temperature=1.0, seed=seed, max_new_tokens=16)
        assert out["text"] in ANSWERS, out["text"]
        assert out["meta_info"]["finish_reason"]["type"] == "stop"


# llama.cpp's GBNF as its grammars/*.gbnf files write it: comments, dashed rule names, escapes in
# character classes, bounded repetition; the second is llama.cpp's list grammar (free text per line)
GBNF = {
    "answers": (r'''# answers, one per line
root        ::= answer-line+
answer-line ::= "- " answer ws "\n"
answer      ::= "yes" | "no" | number
number      ::= "-"? [1-9] [0-9]{0,2}
ws          ::= [ \t]?
''', r"(- (yes|no|-?[1-9][0-9]{0,2})[ \t]?\n)+"),
    "list": (r'''root ::= item+

# Excludes various line break characters
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
''', "(- [^\r\n\x0b\x0c\x85\u2028\u2029]+\n)+"),
}


@pytest.mark.parametrize("name", sorted(GBNF))
def test_gbnf_as_llama_cpp_writes_it(cfg_server: ServerHandle, name: str) -> None:
    """Served by both context-free backends; the list grammar's free-text lines run until the
    budget closes them (a last "\n"), still in the language."""
    grammar, pattern = GBNF[name]
    for seed in range(3):
        out = _generate(cfg_server.url, ebnf=grammar, temperature=1.0, seed=seed, max_new_tokens=24)
        assert re.fullmatch(pattern, out["text"]), out["text"]
        if name == "list":
            assert out["meta_info"]["finish_reason"] == {"type": "length", "matched": 24, "closed_by_budget": True}


def test_native_json_schema_output_validates(cfg_server: ServerHandle) -> None:
    for seed in range(4):
        out = _generate(cfg_server.url, json_schema=json.dumps(CHOICE_SCHEMA), temperature=1.0, seed=seed,
                        max_new_tokens=64)
        jsonschema.validate(json.loads(out["text"]), CHOICE_SCHEMA)


def test_an_unsupported_schema_is_refused_by_the_doors_lowering(cfg_server: ServerHandle) -> None:
    """The door's check is the backend's lowering (which the request then carries to the compile
    worker): an unsupported schema is a 400 with `backends.validate`'s message."""
    from radixlm.runtime.constrained import backends
    from radixlm.runtime.constrained.errors import GrammarError

    name = httpx.get(cfg_server.url + "/get_server_info", timeout=60).json()["grammar_backend"]
    unsupported = json.dumps({"type": "integer", "not": {"multipleOf": 3}})  # no engine, no exact rewrite
    with pytest.raises(GrammarError) as refused:
        backends.validate(name, "json_schema", unsupported)
    resp = httpx.post(cfg_server.url + "/generate",
                      json={"text": "x", "sampling_params": {"json_schema": unsupported}}, timeout=60)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == f"sampling_params.json_schema: {refused.value}"


def test_openai_endpoints_take_ebnf_in_the_body(cfg_server: ServerHandle) -> None:
    client = openai.OpenAI(base_url=cfg_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Well?"}],
                                          max_tokens=16, temperature=1.0, seed=1, extra_body={"ebnf": YES_NO})
    assert chat.choices[0].message.content in ANSWERS
    completion = client.completions.create(model=model, prompt="Well?", max_tokens=16, temperature=1.0, seed=2,
                                           extra_body={"ebnf": YES_NO})
    assert completion.choices[0].text in ANSWERS


def test_a_bad_grammar_is_a_400_and_the_server_keeps_serving(cfg_server: ServerHandle) -> None:
    resp = httpx.post(cfg_server.url + "/generate",
                      json={"text": "x", "sampling_params": {"ebnf": "root ::= ("}}, timeout=60)
    assert resp.status_code == 400
    assert "sampling_params.ebnf: invalid ebnf grammar" in resp.text
    assert _generate(cfg_server.url, ebnf=YES_NO, max_new_tokens=8)["text"] in ANSWERS


def test_language_gen_with_ebnf(cfg_server: ServerHandle) -> None:
    @rl.function
    def answer(s: rl.ProgramState) -> None:
        s += "Is it? " + rl.gen("a", ebnf=YES_NO, max_tokens=16, temperature=1.0)

    state = answer.run(backend=rl.RuntimeEndpoint(cfg_server.url))
    assert state["a"] in ANSWERS


def test_outlines_backend_refuses_ebnf_naming_xgrammar(tiny_outlines_server: ServerHandle) -> None:
    resp = httpx.post(tiny_outlines_server.url + "/generate",
                      json={"text": "x", "sampling_params": {"ebnf": YES_NO}}, timeout=60)
    assert resp.status_code == 400
    assert ("the outlines grammar backend cannot serve ebnf grammars; start the server with --grammar-backend "
            "xgrammar or llguidance") in resp.text


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_greedy_output_is_the_same_with_jump_forward_on_and_off(tiny_model_dir: Path, backend: str) -> None:
    from radixlm.runtime.engine import Engine

    outputs = []
    for disable in (False, True):
        with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=2048, grammar_backend=backend,
                    disable_jump_forward=disable) as engine:
            params = {"json_schema": json.dumps(CHOICE_SCHEMA), "max_new_tokens": 64, "temperature": 0.0}
            out = engine.generate(prompt=["Colors:", "Pick one:"], sampling_params=params)
            outputs.append([o["text"] for o in out])
            if not disable:
                assert engine.scheduler.num_jump_forward_tokens > 0  # the keys are forced text
    assert outputs[0] == outputs[1]
    for text in outputs[0]:
        jsonschema.validate(json.loads(text), CHOICE_SCHEMA)


# Structural tags on the random model: triggers that end many of its tokens ("s", "e"), so calls
# open often; every opened structure is complete and valid, the budget closing the last one
SMALL = {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 99},
                                          "w": {"type": "string", "maxLength": 5}},
         "required": ["v", "w"], "additionalProperties": False}
PAIR = {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2}
STRUCTURES = {"structures": [{"begin": 's{"n": ', "schema": SMALL, "end": "}!"},
                             {"begin": "e<", "schema": PAIR, "end": ">"}],
              "triggers": ["s", "e"]}


def _structures(text: str, tag: dict) -> list[object]:
    """The values of the structures in `text`, each checked: begin, a valid JSON value, end."""
    values, pos, decoder = [], 0, json.JSONDecoder()
    while True:
        hits = [(i, t) for t in tag["triggers"] if (i := text.find(t, pos)) >= 0]
        if not hits:
            return values
        start = min(hits)[0]
        (structure,) = [s for s in tag["structures"] if text.startswith(s["begin"], start)]
        value, end = decoder.raw_decode(text, start + len(structure["begin"]))
        jsonschema.validate(value, structure["schema"])
        assert text.startswith(structure["end"], end), text
        values.append(value)
        pos = end + len(structure["end"])


def test_native_structural_tag_opens_only_complete_structures(cfg_server: ServerHandle) -> None:
    found = 0
    for seed in range(16):
        out = _generate(cfg_server.url, structural_tag=json.dumps(STRUCTURES), temperature=1.0, seed=seed,
                        max_new_tokens=32)
        found += len(_structures(out["text"], STRUCTURES))
    assert found >= 3  # the random model writes "s" and "e" often: the triggers fire


def test_openai_response_format_structural_tag(cfg_server: ServerHandle) -> None:
    client = openai.OpenAI(base_url=cfg_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    found = 0
    for seed in range(8):
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Go"}], max_tokens=24, temperature=1.0, seed=seed,
            response_format={"type": "structural_tag", **STRUCTURES})  # type: ignore[arg-type,misc]
        found += len(_structures(chat.choices[0].message.content or "", STRUCTURES))
        completion = client.completions.create(model=model, prompt="Go", max_tokens=24, temperature=1.0,
                                               seed=seed, extra_body={"structural_tag": STRUCTURES})
        found += len(_structures(completion.choices[0].text, STRUCTURES))
    assert found >= 2


def test_outlines_backend_refuses_structural_tags(tiny_outlines_server: ServerHandle) -> None:
    resp = httpx.post(tiny_outlines_server.url + "/generate",
                      json={"text": "x", "sampling_params": {"structural_tag": json.dumps(STRUCTURES)}}, timeout=60)
    assert resp.status_code == 400
    assert "cannot serve structural_tag grammars; start the server with --grammar-backend xgrammar" in resp.text


def test_outlines_backend_lowers_at_the_door_and_serves_what_it_lowered(tiny_outlines_server: ServerHandle) -> None:
    """The outlines backend's schema -> regex runs once, at the door (the scheduler compiles the
    regex the request carries): an unsupported schema is a 400 with the door's message, a supported
    one is served and its output validates."""
    from radixlm.runtime.constrained import backends
    from radixlm.runtime.constrained.errors import GrammarError

    unsupported = json.dumps({"not": {"multipleOf": 3}})  # no engine, no exact rewrite
    with pytest.raises(GrammarError) as refused:
        backends.validate("outlines", "json_schema", unsupported)
    resp = httpx.post(tiny_outlines_server.url + "/generate",
                      json={"text": "x", "sampling_params": {"json_schema": unsupported}}, timeout=60)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == f"sampling_params.json_schema: {refused.value}"
    for seed in range(3):
        out = httpx.post(tiny_outlines_server.url + "/generate", timeout=120, json={
            "text": "Answer:", "sampling_params": {"json_schema": json.dumps(CHOICE_SCHEMA), "temperature": 1.0,
                                                   "seed": seed, "max_new_tokens": 48}}).json()
        jsonschema.validate(json.loads(out["text"]), CHOICE_SCHEMA)
