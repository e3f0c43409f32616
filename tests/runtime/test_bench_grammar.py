"""The grammar bench (radixlm.runtime.bench.grammar): its compile-time schemas are what the table
says they are (valid JSON schemas; 4 fields; 20 leaf fields nested in 4 objects; 200 properties; a
recursive `$ref`); its mask timing and coverage functions, run on a few corpus schemas with every
backend, give a table of the right shape (a row per backend, counts within bounds, the walks are
the corpus examples' tokens); failures become footnoted cells; its flags make the config. No
timing is asserted."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from radixlm.runtime.bench import grammar as bench
from radixlm.runtime.bench.grammar import (
    BackendRow,
    Coverage,
    Failure,
    GrammarBenchConfig,
    Percentiles,
    schemas,
)
from radixlm.runtime.bench.schema_corpus import corpus
from radixlm.runtime.constrained import backends
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

# corpus schemas every backend compiles in well under a second (outlines takes seconds on some)
QUICK_SCHEMAS = ("order_with_line_items", "invoice_summary", "calendar_event_simple")
REASONS = {"refused", "timeout", "request error", "aborted", "invalid output"}


def _leaves(schema: dict[str, Any]) -> int:
    props = schema.get("properties", {})
    return sum(_leaves(p) if p.get("type") == "object" else 1 for p in props.values())


def test_the_schemas_are_the_ones_the_table_names() -> None:
    table = schemas()
    for schema in table.values():
        jsonschema.Draft202012Validator.check_schema(schema)
    assert _leaves(table["4-field"]) == 4
    nested = table["20-field nested"]
    assert _leaves(nested) == 20 and sum(p.get("type") == "object" for p in nested["properties"].values()) == 4
    assert len(table["200-property"]["properties"]) == 200
    assert table["recursive tree"]["properties"]["children"]["items"] == {"$ref": "#"}
    tree = {"name": "a", "children": [{"name": "b", "children": [{"name": "c", "children": []}]}]}
    jsonschema.validate(tree, table["recursive tree"])


@pytest.fixture(scope="module")
def measured(default_model_dir: Path, tiny_model_dir: Path) -> dict[str, Any]:
    """Mask timing at batch 2 over the quick schemas (one walk) and coverage of 3 schemas with one
    seed on the tiny model, for every backend: what the table's parts 2 and 4 run."""
    tokenizer, vocab_size = Tokenizer(default_model_dir), ModelConfig.from_dir(default_model_dir).vocab_size
    entries = [e for e in corpus() if e.name in QUICK_SCHEMAS]
    name_to_backend = {name: backends.create(name, tokenizer, vocab_size, num_workers=1, enable_jump_forward=True,
                                             whitespace_pattern=None) for name in backends.GRAMMAR_BACKENDS}
    try:
        batch = bench.batch_walks(name_to_backend, tokenizer, entries, 2, 60.0)
        masks = {name: bench.mask_times(batch.name_to_compiled[name], batch.walks, vocab_size, 1)
                 for name in name_to_backend}
    finally:
        for backend in name_to_backend.values():
            backend.shutdown()
    coverages = {name: bench.measure_coverage(name, tiny_model_dir, entries, (0,), 64, 60.0)
                 for name in backends.GRAMMAR_BACKENDS}
    return {"tokenizer": tokenizer, "vocab_size": vocab_size, "entries": entries, "batch": batch, "masks": masks, "coverages": coverages}


def test_the_batch_walks_the_corpus_examples_on_every_backend(measured: dict[str, Any]) -> None:
    batch, entries, tokenizer = measured["batch"], measured["entries"], measured["tokenizer"]
    assert [e.name for e in batch.entries] == [e.name for e in entries[:2]] and batch.num_skipped == 0
    assert batch.walks == [tokenizer.encode_plain(json.dumps(e.example)) for e in entries[:2]]
    for name, mask in measured["masks"].items():
        assert len(batch.name_to_compiled[name]) == 2
        assert isinstance(mask, Percentiles) and mask.num_states == 2
        assert mask.num_samples == max(len(ids) for ids in batch.walks)  # a step per token of the longest
        assert math.isfinite(mask.p50_us) and math.isfinite(mask.p99_us)


def test_a_walk_the_grammar_refuses_is_an_error(measured: dict[str, Any]) -> None:
    closing_bracket = measured["tokenizer"].encode_plain("]")
    for compiled in measured["batch"].name_to_compiled.values():  # an object cannot start with "]"
        with pytest.raises(ValueError):
            bench.mask_times(compiled[:1], [closing_bracket], measured["vocab_size"], 1)


def test_coverage_counts_are_within_bounds(measured: dict[str, Any]) -> None:
    coverages = measured["coverages"]
    assert set(coverages) == set(backends.GRAMMAR_BACKENDS)
    for coverage in coverages.values():
        assert isinstance(coverage, Coverage) and coverage.num_schemas == 3
        assert coverage.num_compiled == 3  # the quick schemas compile everywhere
        assert 0 <= coverage.num_valid <= coverage.num_compiled <= coverage.num_schemas
        assert len(coverage.failures) == coverage.num_schemas - coverage.num_valid
        assert {reason for _, reason, _ in coverage.failures} <= REASONS - {"refused", "timeout"}
        assert sum(coverage.failure_counts().values()) == len(coverage.failures)


def test_the_table_has_a_row_per_backend_and_footnotes_its_failures(measured: dict[str, Any]) -> None:
    config = GrammarBenchConfig(batch_size=2)
    refused = Failure("refused", "cannot compile the json_schema grammar (regex '\\{...'): out of memory")
    rows = [BackendRow(name, compile_secs={**{n: 0.5 for n in schemas()}, "recursive tree": refused},
                       mask_batch=measured["masks"][name], coverage=measured["coverages"][name])
            for name in backends.GRAMMAR_BACKENDS]
    rows[-1] = BackendRow(rows[-1].name, w4=Failure("error", "RuntimeError: boom"))
    lines = bench.format_table(rows, config, details=True)
    header, table = lines[0], lines[2:5]
    assert len(table) == 3 and lines[5] == ""
    assert [line.split(" | ")[0] for line in table] == [f"| {name}" for name in backends.GRAMMAR_BACKENDS]
    assert all(line.count("|") == header.count("|") for line in table)
    assert "refused [1]" in table[0] and "error [3]" in table[2]
    assert "[1] outlines, compile recursive tree: refused: cannot compile the json_schema grammar: out of memory" in lines
    assert "[3] llguidance, W4: error: RuntimeError: boom" in lines


def test_the_flags_make_the_config() -> None:
    parser = argparse.ArgumentParser()
    bench.add_cli_args(parser, prefix="grammar-")
    args = parser.parse_args(["--grammar-quick", "--grammar-corpus-limit", "2", "--grammar-seeds", "4,5",
                              "--grammar-parts", "mask,coverage"])
    config = bench.config_from_args(args, prefix="grammar-", repeats=7)
    assert config == dataclasses.replace(bench.QUICK, corpus_limit=2, seeds=(4, 5), parts=("mask", "coverage"),
                                         repeats=7)
    assert bench.config_from_args(parser.parse_args([]), prefix="grammar-") == GrammarBenchConfig()
    assert GrammarBenchConfig().backend_names == backends.GRAMMAR_BACKENDS
    with pytest.raises(ValueError, match="unknown grammar table parts"):
        bench.config_from_args(parser.parse_args(["--grammar-parts", "masks"]), prefix="grammar-")
