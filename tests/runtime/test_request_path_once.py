"""Each thing done once on a request's path (issue 36), counted through the real objects:

- stop strings: a request with stops is decoded by one `IncrementalDecoder`, the scheduler's (it
  must see the text to stop the request); the detokenizer passes that text on and decodes none of
  its ids. Driven through the server's two halves in process (`SchedulerServer` -> `BatchTokenIDOut`
  -> `DetokenizerManager`, the messages pickled as on the sockets), compared with the Engine;
- grammars: on every grammar backend installed, each kind the front door lowers (regex, JSON
  schema, EBNF, structural tag) is lowered once per request, at the door, and the compile worker
  compiles that form as it is (outlines: the regex's index; xgrammar: the `xgr.Grammar`, crossing
  as its serialization; llguidance: the grammar text) into what it compiled from the spec before
  (xgrammar: the same bytes); the output is in the grammar's language (through the real Engine).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from grammar_backends_testing import backend_engine
from radixlm_testing import stop_across_tokens

from radixlm.runtime.config.server_args import ServerArgs
from radixlm.runtime.constrained import backends, spec
from radixlm.runtime.constrained.backends import GRAMMAR_BACKENDS, KINDS
from radixlm.runtime.constrained.lowered import LoweredGrammar
from radixlm.runtime.detokenizer.detokenizer import IncrementalDecoder
from radixlm.runtime.detokenizer.detokenizer_process import DetokenizerManager
from radixlm.runtime.engine import Engine
from radixlm.runtime.ipc import messages as io
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.scheduler_process import SchedulerServer
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

PROMPT = "The capital of France is"
GREEDY = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}


class Halves:
    """The scheduler process's and the detokenizer process's objects, without their sockets."""

    def __init__(self, args: ServerArgs, tokenizer: Tokenizer):
        self.server = SchedulerServer(args)
        self.detokenizer = DetokenizerManager(tokenizer)
        self.num_rids = 0

    def run(self, input_ids: list[int], params: dict[str, Any]) -> list[io.StrOutput]:
        """One streamed request to the end: the StrOutputs the tokenizer manager would get."""
        self.num_rids += 1
        self.server.handle(io.TokenizedGenerateReq(f"r{self.num_rids}", tuple(input_ids),
                                                   SamplingParams.from_dict(params), stream=True))
        outputs: list[io.StrOutput] = []
        while self.server.scheduler.has_work:
            batch = self.server.step()
            if batch is not None:
                batch = io.decode(io.encode(batch))  # as it crosses the socket
                assert isinstance(batch, io.BatchTokenIDOut)
                outputs += self.detokenizer.handle_batch(batch).outputs
        return outputs

    def assert_clean(self) -> None:
        scheduler = self.server.scheduler
        scheduler.check_integrity()
        assert scheduler.flush_cache()
        assert scheduler.kv_pool.num_free == scheduler.kv_pool.max_total_num_tokens
        assert not self.detokenizer.decoders


@pytest.fixture(scope="module", params=[1, 3], ids=["stream_interval=1", "stream_interval=3"])
def halves(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Iterator[Halves]:
    # the settings of `tiny_engine`, so the outputs compare with the Engine's
    args = ServerArgs(model_path=str(tiny_model_dir), max_total_tokens=4096, random_seed=0, dtype="float32",
                      stream_interval=request.param)
    halves = Halves(args, Tokenizer(tiny_model_dir))
    yield halves
    halves.server.stack.grammar_backend.shutdown()
    halves.server.stack.runner.close()


@pytest.fixture
def counts(halves: Halves, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many IncrementalDecoders are made (anywhere) and how many decodes the detokenizer runs."""
    counted = {"decoders": 0, "detokenizer_decodes": 0}
    make = IncrementalDecoder.__init__
    tokenizer = halves.detokenizer.tokenizer
    decode = tokenizer.decode

    def counting_init(self: IncrementalDecoder, *args: Any, **kwargs: Any) -> None:
        counted["decoders"] += 1
        make(self, *args, **kwargs)

    def counting_decode(*args: Any, **kwargs: Any) -> str:
        counted["detokenizer_decodes"] += 1
        return decode(*args, **kwargs)

    monkeypatch.setattr(IncrementalDecoder, "__init__", counting_init)
    monkeypatch.setattr(tokenizer, "decode", counting_decode)
    return counted


def text_of(outputs: list[io.StrOutput]) -> str:
    return "".join(out.new_text for out in outputs)


@pytest.mark.parametrize("no_stop_trim", [False, True])
def test_a_stop_string_split_across_tokens_is_decoded_once(halves: Halves, counts: dict[str, int],
                                                            tiny_engine: Engine, no_stop_trim: bool) -> None:
    ids = tiny_engine.tokenizer.encode(PROMPT)
    free = tiny_engine.generate(input_ids=ids, sampling_params=GREEDY)
    stop, start = stop_across_tokens(tiny_engine.tokenizer, free["output_ids"], free["text"])
    params = {**GREEDY, "stop": [stop], "no_stop_trim": no_stop_trim}
    engine_out = tiny_engine.generate(input_ids=ids, sampling_params=params)
    counts["decoders"] = 0

    outputs = halves.run(ids, params)

    assert counts == {"decoders": 1, "detokenizer_decodes": 0}  # the scheduler's decoder, nothing else
    expected = free["text"][: start + len(stop) if no_stop_trim else start]
    assert text_of(outputs) == engine_out["text"] == expected
    assert outputs[-1].finish_reason == engine_out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    out_ids = [t for out in outputs for t in out.new_token_ids]
    assert out_ids == engine_out["output_ids"]
    assert len(out_ids) < GREEDY["max_new_tokens"]  # it stopped at the stop string, not at the budget
    streamed = ""
    for out in outputs:  # streaming never shows text past the stop string
        streamed += out.new_text
        assert expected.startswith(streamed)
    halves.assert_clean()


def test_max_new_tokens_still_ends_a_request_with_stops(halves: Halves, counts: dict[str, int],
                                                        tiny_engine: Engine) -> None:
    ids = tiny_engine.tokenizer.encode(PROMPT)
    params = {**GREEDY, "max_new_tokens": 5, "stop": ["\x00never\x00"]}
    engine_out = tiny_engine.generate(input_ids=ids, sampling_params=params)
    counts["decoders"] = 0

    outputs = halves.run(ids, params)

    assert counts == {"decoders": 1, "detokenizer_decodes": 0}
    assert outputs[-1].finish_reason == {"type": "length", "matched": 5}
    assert [t for out in outputs for t in out.new_token_ids] == engine_out["output_ids"]
    assert text_of(outputs) == engine_out["text"]
    halves.assert_clean()


def test_a_request_without_stops_is_decoded_by_the_detokenizer_only(halves: Halves, counts: dict[str, int],
                                                                     tiny_engine: Engine) -> None:
    ids = tiny_engine.tokenizer.encode(PROMPT)
    engine_out = tiny_engine.generate(input_ids=ids, sampling_params=GREEDY)
    counts["decoders"] = 0

    outputs = halves.run(ids, GREEDY)

    assert counts["decoders"] == 1 and counts["detokenizer_decodes"] > 0  # the detokenizer's decoder
    assert text_of(outputs) == engine_out["text"]
    halves.assert_clean()


# Grammars, each bounded so that the output ends well within max_new_tokens
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{1,6}-[0-9]{2}"
EBNF = 'root ::= "(" num ("," num)? ")"\nnum ::= [0-9] [0-9]?'  # GBNF: xgrammar's dialect, and llguidance reads it
EBNF_LANGUAGE = r"\(\d\d?(,\d\d?)?\)"
STRUCTURE_END = " ok."
DOOR_KINDS = ("regex", "json_schema", "ebnf", "structural_tag")  # the kinds a request's sampling_params carry
# Each backend's one lowering function, through which both the door's check and a worker's
# lowering of a spec that came without the door's go; wrapped, not replaced, to count its calls.
LOWERINGS = {
    "outlines": ("radixlm.runtime.constrained.spec", "spec_to_regex"),
    "xgrammar": ("radixlm.runtime.constrained.xgrammar_backend", "xgrammar_grammar"),
    "llguidance": ("radixlm.runtime.constrained.llguidance_backend", "grammar_text"),
}
LIBRARIES = {"outlines": "outlines_core", "xgrammar": "xgrammar", "llguidance": "llguidance"}
INSTALLED = [name for name in GRAMMAR_BACKENDS if importlib.util.find_spec(LIBRARIES[name]) is not None]
# xgrammar's compiles of a spec (the worker compiled a lowered grammar with `compile_grammar` only)
XGRAMMAR_SPEC_COMPILES = ("compile_json_schema", "compile_regex", "compile_structural_tag", "compile_lark")


@pytest.fixture(scope="module")
def engine(request: pytest.FixtureRequest, tiny_engine: Engine, tiny_model_dir: Path) -> Iterator[Engine]:
    """An Engine on the grammar backend `request.param` (the suite's tiny engine for the default)."""
    with backend_engine(request.param, tiny_engine, tiny_model_dir) as engine:
        yield engine


class Counted:
    """The calls of the backend's lowering function, and what the scheduler asks its backend for
    (`get_lowered`: the door's lowering, with the future it got; `get`: a spec to lower)."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch):
        self.lowerings: list[tuple[Any, ...]] = []
        self.lowered: list[tuple[LoweredGrammar, Future[Any]]] = []
        self.gets: list[tuple[Any, ...]] = []
        module_name, name = LOWERINGS[engine.server_args.grammar_backend]
        module = importlib.import_module(module_name)
        self.lower = getattr(module, name)
        backend = engine.grammar_backend
        get, get_lowered = backend.get, backend.get_lowered

        def counting_lower(*args: Any) -> Any:
            self.lowerings.append(args)
            return self.lower(*args)

        def counting_get(*args: Any) -> Future[Any]:
            self.gets.append(args)
            return get(*args)

        def counting_get_lowered(lowered: LoweredGrammar) -> Future[Any]:
            future = get_lowered(lowered)
            self.lowered.append((lowered, future))
            return future

        monkeypatch.setattr(module, name, counting_lower)
        monkeypatch.setattr(backend, "get", counting_get)
        monkeypatch.setattr(backend, "get_lowered", counting_get_lowered)


def grammar_of(kind: str, engine: Engine) -> str:
    """A request's spec of `kind`. The structural tag's trigger is the model's first greedy token,
    so its structure opens at once and the output is one structure's JSON, then free text."""
    if kind == "regex":
        return REGEX
    if kind == "json_schema":
        return json.dumps(SCHEMA)
    if kind == "ebnf":
        return EBNF
    trigger = engine.generate(prompt=PROMPT, sampling_params={"temperature": 0.0, "max_new_tokens": 1})["text"]
    assert trigger.strip() and trigger.isprintable(), f"the tiny model's first token {trigger!r} makes no trigger"
    return json.dumps({"structures": [{"begin": trigger, "schema": SCHEMA, "end": STRUCTURE_END}], "triggers": [trigger]})


def assert_in_language(kind: str, grammar: str, text: str) -> None:
    if kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "json_schema":
        jsonschema.validate(json.loads(text), SCHEMA)
    elif kind == "ebnf":
        assert re.fullmatch(EBNF_LANGUAGE, text), text
    else:  # after each trigger: its structure's JSON and end
        (trigger,) = json.loads(grammar)["triggers"]
        num_structures, pos = 0, text.find(trigger)
        while pos != -1:
            value, end = json.JSONDecoder().raw_decode(text, pos + len(trigger))
            jsonschema.validate(value, SCHEMA)
            assert text.startswith(STRUCTURE_END, end), text
            num_structures += 1
            pos = text.find(trigger, end + len(STRUCTURE_END))
        assert text.startswith(trigger) and num_structures >= 1, text


def assert_compiled_as_before(engine: Engine, kind: str, normalized: str, lowered: LoweredGrammar,
                              compiled: Any, lower: Any) -> None:
    """`compiled` is the lowered form compiled as it is, and what the worker compiled from the
    spec before (`lower`: the unwrapped lowering function)."""
    backend = engine.grammar_backend
    if backend.backend_name == "outlines":
        assert compiled.regex == lowered.form == lower(kind, normalized, engine.server_args.constrained_json_whitespace_pattern)
    elif backend.backend_name == "llguidance":
        assert compiled.grammar == lowered.form == lower(kind, normalized)
    else:  # the compiled grammar's bytes (its token masks included) equal those of xgrammar's compile of the spec
        from radixlm.runtime.constrained.structural_tag import xgrammar_format
        from radixlm.runtime.constrained.xgrammar_backend import xgrammar_schema

        if kind == "json_schema":
            before = backend._json_compiler.compile_json_schema(xgrammar_schema(normalized),
                                                                any_whitespace=backend.any_whitespace)
        elif kind == "regex":
            before = backend._compiler.compile_regex(normalized)
        elif kind == "structural_tag":
            before = backend._compiler.compile_structural_tag(xgrammar_format(normalized, xgrammar_schema))
        else:
            before = backend._compiler.compile_grammar(normalized)
        assert compiled.compiled.serialize_json() == before.serialize_json()


def count_xgrammar_compiles(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """xgrammar's compiles from now on, by any backend: (method, its first argument)."""
    calls: list[tuple[str, Any]] = []
    if "xgrammar" not in INSTALLED:
        return calls
    import xgrammar as xgr

    for method in ("compile_grammar", *XGRAMMAR_SPEC_COMPILES):
        compile_method = getattr(xgr.GrammarCompiler, method)

        def counting(self: Any, *args: Any, _method: str = method, _compile: Any = compile_method, **kwargs: Any) -> Any:
            calls.append((_method, args[0]))
            return _compile(self, *args, **kwargs)

        monkeypatch.setattr(xgr.GrammarCompiler, method, counting)
    return calls


ENGINE_KINDS = [(name, kind) for name in INSTALLED for kind in DOOR_KINDS if kind in KINDS[name]]


@pytest.mark.parametrize(("engine", "kind"), ENGINE_KINDS, indirect=["engine"], ids=[f"{n}-{k}" for n, k in ENGINE_KINDS])
def test_a_grammar_is_lowered_once_per_request(engine: Engine, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend's lowering runs at the door, once per distinct spec; the scheduler hands the
    backend that lowering (never the spec), and the worker compiles it as it is, into what it
    compiled from the spec before; a second request with the same spec takes the door's lowering
    of the first and shares its compile."""
    backends.lowered_at_door.cache_clear()  # the door lowers this test's spec anew
    backend = engine.grammar_backend
    grammar = grammar_of(kind, engine)
    normalized = backend._normalize(kind, grammar)
    assert (kind, normalized) not in backend._key_to_future  # this test's request compiles it
    counted = Counted(engine, monkeypatch)
    xgrammar_calls = count_xgrammar_compiles(monkeypatch)
    params = {"temperature": 0.0, "max_new_tokens": 60, kind: grammar}

    out = engine.generate(prompt=PROMPT, sampling_params=params)

    assert len(counted.lowerings) == 1 and not counted.gets and len(counted.lowered) == 1
    lowered, future = counted.lowered[0]
    assert (lowered.backend, lowered.kind, lowered.normalized) == (backend.backend_name, kind, normalized)
    assert lowered.settings == backend.lowering_settings
    assert_in_language(kind, grammar, out["text"])
    if backend.backend_name == "xgrammar":  # one compile, of the door's grammar
        assert [(method, arg.serialize_json()) for method, arg in xgrammar_calls] == [("compile_grammar", lowered.form)]
    else:
        assert not xgrammar_calls

    again = engine.generate(prompt=PROMPT, sampling_params=params)

    assert len(counted.lowerings) == 1 and not counted.gets  # the second request: the door's lowering reused
    assert counted.lowered[1][0] is lowered and counted.lowered[1][1] is future and again["text"] == out["text"]
    assert len(xgrammar_calls) == (1 if backend.backend_name == "xgrammar" else 0)
    assert_compiled_as_before(engine, kind, normalized, lowered, future.result(), counted.lower)


@pytest.mark.parametrize("engine", INSTALLED, indirect=True)
def test_a_backend_compiles_only_its_own_lowering(engine: Engine) -> None:
    """A lowering of another backend, or of this one with other settings, is refused."""
    backend = engine.grammar_backend
    other = next(name for name in GRAMMAR_BACKENDS if name != backend.backend_name)
    with pytest.raises(ValueError, match=f"lowered by the {other} backend"):
        backend.get_lowered(LoweredGrammar(other, "regex", "a", "a", backend.lowering_settings))
    if backend.lowering_settings:
        changed = tuple((setting, "changed") for setting, _ in backend.lowering_settings)
        with pytest.raises(ValueError, match=f"lowered by the {backend.backend_name} backend with"):
            backend.get_lowered(LoweredGrammar(backend.backend_name, "regex", "a", "a", changed))


def test_outlines_lowers_a_json_schema_with_the_servers_whitespace_pattern(tiny_model_dir: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The outlines backend's lowering runs at the door with the server's whitespace pattern (not
    the default, which `test_a_grammar_is_lowered_once_per_request` runs), and the compile worker
    builds the index of that regex; the output follows the schema."""
    whitespace_pattern = ""
    calls: list[tuple[Any, ...]] = []
    schema_to_regex = spec.schema_to_regex

    def counting(*args: Any) -> str:
        calls.append(args)
        return schema_to_regex(*args)

    monkeypatch.setattr(spec, "schema_to_regex", counting)
    backends.lowered_at_door.cache_clear()
    with Engine(str(tiny_model_dir), max_total_tokens=4096, random_seed=0, dtype="float32",
                grammar_backend="outlines", constrained_json_whitespace_pattern=whitespace_pattern) as engine:
        out = engine.generate(prompt=PROMPT, sampling_params={"temperature": 0.0, "max_new_tokens": 60,
                                                              "json_schema": json.dumps(SCHEMA)})
        assert calls == [(SCHEMA, whitespace_pattern)]
        jsonschema.validate(json.loads(out["text"]), SCHEMA)
        compiled = next(iter(engine.grammar_backend._key_to_future.values())).result()
        assert compiled.regex == schema_to_regex(SCHEMA, whitespace_pattern)
