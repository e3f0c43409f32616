"""Unit tests of the request limits (runtime/config/limits.py) and the bounded grammar compile: regex and
JSON-schema size bounds, the schema-size estimate, the killable index builder, and the
security-relevant defaults (loopback host, private socket directory)."""

from __future__ import annotations

import json
import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import outlines_core
import pytest
from outlines_core.json_schema import build_regex_from_schema
from test_constrained import SCHEMAS

from radixlm.runtime.api.request_io import copy_seed
from radixlm.runtime.config.limits import (
    MAX_REGEX_POSITIONS,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_REGEX_CHARS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    json_depth,
)
from radixlm.runtime.config.server_args import ServerArgs
from radixlm.runtime.constrained import GrammarBackend, GrammarError, validate
from radixlm.runtime.constrained.index_worker import IndexWorker
from radixlm.runtime.constrained.regex_syntax import check_regex_syntax, regex_positions
from radixlm.runtime.constrained.schema_size import estimate_regex_chars
from radixlm.runtime.ipc.sockets import IpcPaths
from radixlm.runtime.sampling.sampling_params import InvalidSamplingParams, SamplingParams

BYTE_VOCABULARY = outlines_core.Vocabulary(0, {bytes([b]): [b + 1] for b in range(256)})
EXPLOSIVE_REGEX = "(a|b)*a(a|b){24}"  # 2**24 DFA states, yet only ~80 positions


def nested_arrays(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def nested_objects(depth: int, num_optional: int = 1) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {f"p{i}": schema for i in range(num_optional)}}
    return schema


# ---------------------------------------------------------------- regexes


@pytest.mark.parametrize(("pattern", "positions"), [
    ("a{3}b", 4), ("(ab){2,5}", 10), ("a*", 1), ("(?:x{10}){10}", 100), ("(?i)ab", 2),
    ("[]a]{3}", 3), (r"[^\]x]{4}", 4), (r"\p{L}{5}", 5), ("(?P<n>a{4})|b{7}", 11), ("(((", 0),
    ("(a|aa)*b{1000}", 1003),
])
def test_regex_positions(pattern: str, positions: int) -> None:
    assert regex_positions(pattern, 10**9) == positions


@pytest.mark.parametrize("pattern", ["a{1000}{1000}", "[a-z]{1,100000}", "(x{200}){200}", "x{99999999999999999999}"])
def test_oversized_regexes_are_refused_without_compiling(pattern: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outlines_core, "Index", _no_compile)
    with pytest.raises(GrammarError, match="too large"):
        validate("regex", pattern)


def test_long_regex_text_is_refused() -> None:
    with pytest.raises(GrammarError, match="too long"):
        validate("regex", "a|" * 40_000 + "a")


def test_rust_only_syntax_passes_the_check_without_a_dfa_build() -> None:
    """The old fallback built the regex's DFA to judge Rust syntax: exponential for the last one
    (2**30 states: it would not finish)."""
    for pattern in [r"\p{Greek}+", r"[\p{L}\d]{2}", r"(?<year>[0-9]{4})", r"\x{263A}", r"(\p{L}|b)*a(\p{L}|b){30}"]:
        assert check_regex_syntax(pattern) == pattern
    with pytest.raises(GrammarError, match="unterminated"):
        check_regex_syntax(r"(\p{L}")


def _no_compile(*args: object, **kwargs: object) -> None:
    raise AssertionError("a refused grammar must not be compiled into a token index")


# ---------------------------------------------------------------- JSON schemas


def test_schema_size_estimate_bounds_the_real_regex() -> None:
    schemas = list(SCHEMAS) + [nested_arrays(6), nested_objects(3, 4), nested_objects(6), {},
                               {"type": "object", "additionalProperties": {"type": "array"}}]
    for schema in schemas:
        try:
            real = len(build_regex_from_schema(json.dumps(schema)))
        except ValueError:
            continue  # outlines-core refuses it; the estimate does not matter
        assert estimate_regex_chars(schema, 10**9) >= real, schema


@pytest.mark.parametrize(("schema", "message"), [
    (nested_arrays(40), "too complex"),  # 2**40 copies of the leaf: would exhaust memory
    (nested_objects(5, 4), "too complex"),  # optional properties: x10 per level (a 7 MB regex)
    ({"$defs": {f"d{j}": {"type": "object", "properties": {f"p{i}": {"$ref": f"#/$defs/d{j + 1}"} for i in range(40)}}
                for j in range(5)}, "$ref": "#/$defs/d0"}, "too complex"),  # references fanning out
    (nested_objects(200), "nested too deeply"),
    ('{"a":' * 5000 + "1" + "}" * 5000, "nested too deeply"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # json.loads alone would hit RecursionError
    ('{"enum": [' + "1," * 2_200_000 + "1]}", "too long"),  # over MAX_SCHEMA_CHARS (4 MiB)
    ({"type": "string", "maxLength": 10**12}, "too large"),
    ({"type": "array", "minItems": 10**9, "items": {"type": "integer"}}, "too large"),
    ({"type": "integer", "minimum": 10**400}, r"within \+-1e30"),
    ({"type": "number", "maximum": 1e308}, r"within \+-1e30"),
])
def test_oversized_schemas_are_refused_without_compiling(schema: object, message: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outlines_core, "Index", _no_compile)
    with pytest.raises(GrammarError, match=message):
        validate("json_schema", schema)


@pytest.mark.parametrize("ref", [
    "file:///etc/passwd", "http://127.0.0.1:9/schema.json", "https://example.com/s.json#/a", "/etc/passwd",
    "../secret.json", "other.json#/defs/a", 5,
])
def test_only_local_refs_are_accepted(ref: object) -> None:
    with pytest.raises(GrammarError, match=r"unsupported \$ref"):
        validate("json_schema", {"type": "object", "properties": {"a": {"$ref": ref}}})
    validate("json_schema", {"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"})


def test_schema_depth_limit_counts_json_nesting() -> None:
    assert json_depth(1, 10) == 0 and json_depth([], 10) == 1 and json_depth({"a": [{}]}, 10) == 3
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    assert json_depth(deep, 100) == 101  # iterative: no RecursionError
    validate("json_schema", nested_objects(MAX_SCHEMA_DEPTH // 2 - 1))


# ---------------------------------------------------------------- the killable index builder


def test_index_worker_kills_a_build_past_its_deadline() -> None:
    worker = IndexWorker(timeout_s=2.0, max_memory_bytes=2 * 1024**3)
    try:
        assert len(worker.build("[0-9]{3}", BYTE_VOCABULARY).get_transitions()) == 4
        [child] = worker.pids
        with pytest.raises(ValueError, match="longer than 2 s"):
            worker.build(EXPLOSIVE_REGEX, BYTE_VOCABULARY)
        assert not Path(f"/proc/{child}").exists(), "the stuck builder still runs"
        with pytest.raises(ValueError, match="NFA"):  # outlines-core's own errors come back as they are
            worker.build("(?<=a)b", BYTE_VOCABULARY)
        index = worker.build("[0-9]{2}", BYTE_VOCABULARY)  # a fresh child
        assert outlines_core.Guide(index).get_tokens()
    finally:
        worker.close()
    assert worker.pids == []


def test_index_worker_builds_in_parallel_and_a_slow_build_fails_alone() -> None:
    # The slow build never ends by itself: only its deadline stops it. The deadline is long enough
    # that the fast build (a second child, a 3-digit regex) finishes first on any machine unless it
    # waits for the slow one: the order of events is the check, not a number of seconds.
    worker = IndexWorker(timeout_s=15.0, max_memory_bytes=2 * 1024**3, max_builders=2)
    try:
        with ThreadPoolExecutor(2) as pool:  # kept alive: children die with the thread that started them
            slow = pool.submit(worker.build, EXPLOSIVE_REGEX, BYTE_VOCABULARY)
            while not worker.pids:  # the slow build has its child
                time.sleep(0.01)
            fast = pool.submit(worker.build, "[0-9]{3}", BYTE_VOCABULARY)
            assert len(fast.result(timeout=60).get_transitions()) == 4
            assert not slow.done(), "the fast build waited for the slow one"
            assert len(worker.pids) == 2
            # its deadline stops it, or on a fast machine its 2 GiB cap first (the child aborts):
            # either way it fails alone
            with pytest.raises(ValueError, match="longer than 15 s|building its token index died"):
                slow.result(timeout=60)
            assert len(worker.pids) == 1  # only the slow build's child is gone
            [survivor] = worker.pids
            index = pool.submit(worker.build, "[a-c]{2}", BYTE_VOCABULARY).result(timeout=60)
            assert outlines_core.Guide(index).get_tokens()
            assert worker.pids == [survivor]  # reused, not restarted
    finally:
        worker.close()
    assert worker.pids == []


def test_index_worker_memory_cap_fails_the_build_not_the_machine() -> None:
    worker = IndexWorker(timeout_s=60.0, max_memory_bytes=256 * 1024**2)
    try:
        with pytest.raises(ValueError, match="died|memory|longer"):
            worker.build("(a|b)*a(a|b){22}", BYTE_VOCABULARY)
        assert worker.build("x", BYTE_VOCABULARY) is not None
    finally:
        worker.close()


def test_grammar_backend_refuses_a_grammar_that_compiles_too_long(tokenizer) -> None:
    backend = GrammarBackend(tokenizer, tokenizer.vocab_size, compile_timeout_s=2.0)
    try:
        validate("regex", EXPLOSIVE_REGEX)  # small and well-formed: only the build can tell
        with pytest.raises(GrammarError, match="longer than 2 s"):
            backend.get("regex", EXPLOSIVE_REGEX).result(timeout=60)
        assert backend.get("regex", "[0-9]{2}").result(timeout=60).index is not None
    finally:
        backend.shutdown()


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path):
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

    return Tokenizer(default_model_dir)


# ---------------------------------------------------------------- sampling parameters and copies


def test_stop_limits() -> None:
    SamplingParams(stop=["x"] * MAX_STOP_STRINGS)
    SamplingParams(stop=["x" * MAX_STOP_STRING_CHARS])
    with pytest.raises(InvalidSamplingParams, match="limit"):
        SamplingParams(stop=["x"] * (MAX_STOP_STRINGS + 1))
    with pytest.raises(InvalidSamplingParams, match="limit"):  # its prefixes would take O(len**2) memory
        SamplingParams(stop=["x" * 1_000_000])
    with pytest.raises(InvalidSamplingParams, match="stop_token_ids"):
        SamplingParams(stop_token_ids=list(range(100_000)))


def test_copy_seeds_stay_in_the_int64_range() -> None:
    top = 2**63 - 1
    assert copy_seed(5, 2) == 7 and copy_seed(top, 0) == top and copy_seed(top, 1) == -(2**63)
    assert copy_seed("x", 1) == "x"
    SamplingParams(seed=copy_seed(top, 3))


def test_limits_constants_are_consistent() -> None:
    assert MAX_REGEX_POSITIONS < MAX_SCHEMA_REGEX_CHARS


# ---------------------------------------------------------------- security defaults


def test_server_binds_loopback_by_default() -> None:
    import argparse

    from radixlm.runtime.config.server_args import add_cli_args, from_cli_args

    assert ServerArgs().host == "127.0.0.1"
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    assert from_cli_args(parser.parse_args([])).host == "127.0.0.1"


def test_ipc_sockets_live_in_a_private_directory() -> None:
    paths = IpcPaths.create()
    try:
        mode = os.stat(paths.root).st_mode
        assert stat.S_ISDIR(mode) and stat.S_IMODE(mode) == 0o700
        assert os.stat(paths.root).st_uid == os.getuid()
        for endpoint in (paths.scheduler, paths.detokenizer, paths.tokenizer_manager):
            assert endpoint.startswith(f"ipc://{paths.root}/")
    finally:
        paths.remove()
