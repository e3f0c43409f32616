"""`python -m radixlm.runtime.bench.grammar`: the grammar table (issue 13, point 6), one markdown
row per grammar backend (outlines, xgrammar, llguidance), then a legend and footnotes. Also printed
by `python -m radixlm.runtime.bench --grammar`, after the other tables.

1. compile: seconds to compile each of `schemas()` (a 4-field object; a 20-field nested one, 4
   objects of 4 fields plus 4 scalars; a 200-property one, every other property required; a
   recursive tree, `children: {items: {$ref: "#"}}`) with the default model's tokenizer, one
   compile each after a warm-up compile (a compiled grammar is cached). A compile that fails or
   gives no answer within --deadline is "refused" / "timeout", its reason in a footnote.
2. mask: microseconds of `fill_vocab_masks` per decode step (p50/p99) along real outputs. Batch 1:
   W4's schema, walking one W4 answer (`json.dumps`, default separators) token by token, --walks
   times. Batch N (--batch-size, 32): the first N corpus schemas (`schema_corpus`) that every
   backend compiles and whose minimal example every backend accepts, one state each, stepped in
   lock-step through their examples (a state whose example is done leaves the batch); the time of
   the whole batch's masks per step.
3. W4 (the main bench's workload, its code: `extraction.run_extraction`): s/request on the default model
   (median of --repeats runs, greedy, W4's schema), valid outputs /16; jump-forward's saving: the
   s/request with jump-forward off over on, and the tokens it appended per request.
4. coverage: each corpus schema compiled (within --deadline) by an in-process Engine on a tiny
   random-weight model, then 3 requests (seeds 0, 1, 2; temperature 1.0; 256 new tokens) in one
   batch per 32 schemas; a schema is covered when it compiles and every output validates
   (`jsonschema.Draft202012Validator` with a `FormatChecker`). Footnotes count each failure reason.

A smoke run: `--quick` (1 walk, batch 4, 1 repeat, 6 corpus schemas, 1 seed, 64 new tokens), or
any of --parts, --corpus-limit, --seeds. Each backend's measurements run under their own guard: a
backend that crashes shows "error" in its cells, the others go on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np

from radixlm.runtime.bench import workloads as wl
from radixlm.runtime.bench.results import ResultTables, table_rows
from radixlm.runtime.bench.schema_corpus import CorpusSchema, corpus
from radixlm.runtime.config.envs import set_process_defaults

set_process_defaults()  # before torch loads (the runtime's modules load it; imported where used, so the
# main bench, which imports this module for its flags, loads torch only when it needs it)

if TYPE_CHECKING:
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

_LEAVES: list[dict[str, Any]] = [{"type": "string", "maxLength": 20}, {"type": "integer"}, {"type": "boolean"},
                                 {"type": "number"}]
PARTS = ("compile", "mask", "w4", "coverage")
COVERAGE_PROMPT = wl.chatml("Reply with one JSON object.")
COVERAGE_CHUNK = 32  # schemas compiled, then generated, at a time: within the compile cache (64 entries)
MAX_HUNG_COMPILES = 3  # coverage: compiles in a row without an answer, then the backend is given up
_NO_ANSWER = "no answer within"
T = TypeVar("T")


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


def schemas() -> dict[str, dict[str, Any]]:
    nested = {f"group{g}": _object({f"f{g}_{i}": _LEAVES[i] for i in range(4)}, [f"f{g}_{i}" for i in range(4)])
              for g in range(4)}
    nested.update({f"top{i}": _LEAVES[i] for i in range(4)})
    return {
        "4-field": _object({"name": _LEAVES[0], "age": _LEAVES[1], "ok": _LEAVES[2], "score": _LEAVES[3]},
                           ["name", "age", "ok", "score"]),
        "20-field nested": _object(nested, list(nested)),
        "200-property": _object({f"p{i}": _LEAVES[i % 4] for i in range(200)}, [f"p{i}" for i in range(0, 200, 2)]),
        "recursive tree": _object({"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
                                  ["name", "children"]),
    }


# ---------------------------------------------------------------- results


class Failure(NamedTuple):
    """A cell without a figure: `kind` is refused or timeout (a compile), or error (the bench's
    own measurement crashed)."""

    kind: str
    reason: str


class Percentiles(NamedTuple):
    p50_us: float
    p99_us: float
    num_samples: int  # decode steps timed
    num_states: int  # grammar states per step (the batch size)


class W4Figures(NamedTuple):
    s_per_request: float  # median over the repeats, jump-forward on
    num_valid: int
    num_cases: int
    jump_forward_off_ratio: float  # s/request with jump-forward off / on
    jump_forward_tokens_per_request: float


class Coverage(NamedTuple):
    num_schemas: int
    num_compiled: int
    num_valid: int  # compiled, and every output validates
    # (schema, reason, message) per schema not covered, in corpus order; reasons: refused, timeout
    # (the compile), request error (the front door), aborted, invalid output (a request)
    failures: list[tuple[str, str, str]]

    def failure_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(reason for _, reason, _ in self.failures).items()))


@dataclass(frozen=True)
class BackendRow:
    """One backend's figures; None: the part did not run."""

    name: str
    compile_secs: dict[str, float | Failure] | Failure | None = None
    mask_single: Percentiles | Failure | None = None
    mask_batch: Percentiles | Failure | None = None
    w4: W4Figures | Failure | None = None
    coverage: Coverage | Failure | None = None


@dataclass(frozen=True)
class GrammarBenchConfig:
    backends: tuple[str, ...] = ()  # (): all of server_args.GRAMMAR_BACKENDS
    parts: tuple[str, ...] = PARTS
    deadline_s: float = 120.0
    walks: int = 5
    batch_size: int = 32
    repeats: int = 3
    dtype: str = "auto"
    corpus_limit: int | None = None  # None: all 200 schemas
    seeds: tuple[int, ...] = (0, 1, 2)
    max_new_tokens: int = 256

    @property
    def backend_names(self) -> tuple[str, ...]:
        from radixlm.runtime.config.server_args import GRAMMAR_BACKENDS

        return self.backends or GRAMMAR_BACKENDS


QUICK = GrammarBenchConfig(walks=1, batch_size=4, repeats=1, corpus_limit=6, seeds=(0,), max_new_tokens=64)


def _guarded(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | Failure:
    """fn(*args, **kwargs), or the Failure of its exception: one backend's crash is a cell, not the
    end of the table."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        return Failure("error", f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------- 1. compile


class Compiled(NamedTuple):
    grammar: Any  # the backend's compiled grammar (`.new_state()`)
    secs: float


def compile_schema(backend: Any, schema: object, deadline_s: float) -> Compiled | Failure:
    """One schema compiled by `backend` (a `backends.create` backend), waited for up to the deadline.
    outlines kills its own index builds past RADIXLM_GRAMMAR_COMPILE_TIMEOUT: a timeout too."""
    from radixlm.runtime.constrained.errors import GrammarError

    start = time.perf_counter()
    try:
        grammar = backend.get("json_schema", json.dumps(schema)).result(timeout=deadline_s)
    except FutureTimeout:
        return Failure("timeout", f"{_NO_ANSWER} {deadline_s:g} s")
    except GrammarError as e:
        return Failure("timeout" if "took longer than" in str(e) else "refused", str(e))
    return Compiled(grammar, time.perf_counter() - start)


def compile_times(backend: Any, deadline_s: float) -> dict[str, float | Failure]:
    """Seconds per schema of `schemas()`, after a warm-up compile (the vocabulary built once)."""
    warm_up = compile_schema(backend, _object({"x": _LEAVES[1]}, ["x"]), deadline_s)
    if isinstance(warm_up, Failure):
        return {name: warm_up for name in schemas()}
    times: dict[str, float | Failure] = {}
    for name, schema in schemas().items():
        result = compile_schema(backend, schema, deadline_s)
        times[name] = result if isinstance(result, Failure) else result.secs
    return times


# ---------------------------------------------------------------- 2. mask


def mask_times(compiled: Sequence[Any], walks: Sequence[Sequence[int]], vocab_size: int, num_walks: int) -> Percentiles:
    """Per decode step, the time of `fill_vocab_masks` for every state whose walk is not done (state
    i walks `walks[i]` through `compiled[i]`, accepting each token after its mask), `num_walks`
    times from fresh states. ValueError if a grammar refuses a token of its walk."""
    import torch

    rows = torch.zeros(len(compiled), vocab_size, dtype=torch.bool)
    samples: list[int] = []
    for _ in range(num_walks):
        states = [grammar.new_state() for grammar in compiled]
        for step in range(max(len(ids) for ids in walks)):
            live = [i for i, ids in enumerate(walks) if step < len(ids)]
            start = time.perf_counter_ns()
            for i in live:
                states[i].fill_vocab_masks(rows[i : i + 1], [])
            samples.append(time.perf_counter_ns() - start)
            for i in live:
                states[i].accept_token(walks[i][step])
    p50, p99 = np.percentile(samples, [50, 99]) / 1000
    return Percentiles(float(p50), float(p99), len(samples), len(compiled))


def _accepts(grammar: Any, ids: Sequence[int]) -> bool:
    from radixlm.runtime.constrained.errors import GrammarError

    try:
        state = grammar.new_state()
        for token_id in ids:
            state.accept_token(token_id)
    except (ValueError, GrammarError):
        return False
    return True


class BatchWalks(NamedTuple):
    entries: list[CorpusSchema]
    walks: list[list[int]]  # each entry's example, tokenized
    name_to_compiled: dict[str, list[Any]]  # backend -> each entry's compiled grammar
    num_skipped: int  # schemas passed over: refused, timed out or not walking on some backend


def batch_walks(name_to_backend: dict[str, Any], tokenizer: Tokenizer, entries: Sequence[CorpusSchema],
                batch_size: int, deadline_s: float) -> BatchWalks:
    """The first `batch_size` of `entries` that every backend compiles and whose example every
    backend's grammar accepts (`json.dumps` layout, `encode_plain` tokens)."""
    picked = BatchWalks([], [], {name: [] for name in name_to_backend}, 0)
    for entry in entries:
        if len(picked.entries) == batch_size:
            break
        ids = tokenizer.encode_plain(json.dumps(entry.example))
        name_to_grammar = {}
        for name, backend in name_to_backend.items():
            result = compile_schema(backend, entry.schema, deadline_s)
            if isinstance(result, Failure) or not _accepts(result.grammar, ids):
                break
            name_to_grammar[name] = result.grammar
        if len(name_to_grammar) < len(name_to_backend):
            picked = picked._replace(num_skipped=picked.num_skipped + 1)
            continue
        picked.entries.append(entry)
        picked.walks.append(ids)
        for name, grammar in name_to_grammar.items():
            picked.name_to_compiled[name].append(grammar)
    return picked


def _mask_single(backend: Any, tokenizer: Tokenizer, vocab_size: int, config: GrammarBenchConfig) -> Percentiles | Failure:
    result = compile_schema(backend, wl.W4_SCHEMA, config.deadline_s)
    if isinstance(result, Failure):
        return result
    answer = tokenizer.encode_plain(json.dumps(wl.w4_cases()[0]["truth"]))
    return mask_times([result.grammar], [answer], vocab_size, config.walks)


def _compile_and_mask(config: GrammarBenchConfig, tokenizer: Tokenizer, vocab_size: int,
                      name_to_fields: dict[str, dict[str, Any]]) -> None:
    """Parts 1 and 2, on standalone backends (one compile worker each) alive together: the batch's
    schemas are those all of them compile."""
    from radixlm.runtime.constrained import backends

    name_to_backend: dict[str, Any] = {}
    try:
        for name in config.backend_names:
            backend = _guarded(backends.create, name, tokenizer, vocab_size, num_workers=1,
                               enable_jump_forward=True, whitespace_pattern=None)
            if isinstance(backend, Failure):
                if "compile" in config.parts:
                    name_to_fields[name]["compile_secs"] = backend
                if "mask" in config.parts:
                    name_to_fields[name].update(mask_single=backend, mask_batch=backend)
            else:
                name_to_backend[name] = backend
        for name, backend in name_to_backend.items():
            if "compile" in config.parts:
                name_to_fields[name]["compile_secs"] = _guarded(compile_times, backend, config.deadline_s)
            if "mask" in config.parts:
                name_to_fields[name]["mask_single"] = _guarded(_mask_single, backend, tokenizer, vocab_size, config)
        if "mask" in config.parts and name_to_backend:
            batch = _guarded(batch_walks, name_to_backend, tokenizer, corpus(), config.batch_size, config.deadline_s)
            for name in name_to_backend:
                name_to_fields[name]["mask_batch"] = batch if isinstance(batch, Failure) else _guarded(
                    mask_times, batch.name_to_compiled[name], batch.walks, vocab_size, config.walks)
    finally:
        for backend in name_to_backend.values():
            backend.shutdown()


# ---------------------------------------------------------------- 3. W4


def measure_w4(name: str, dtype: str, repeats: int) -> W4Figures:
    """W4 through the main bench's own code, on engines with grammar backend `name`."""
    from radixlm.runtime.bench.__main__ import Ours
    from radixlm.runtime.bench.extraction import TASKS, run_extraction

    system = Ours(dtype, grammar_backend=name)
    try:
        runs = []
        for _ in range(repeats):
            system.flush()
            runs.append(run_extraction(system, TASKS["W4"], "json_schema", system.counters))
        off = run_extraction(system, TASKS["W4"], "json_schema, jump-forward off", system.counters)
    finally:
        system.shutdown()
    s_per_request = statistics.median(r["W4 json_schema s/request"] for r in runs)
    return W4Figures(s_per_request, int(runs[-1]["W4 json_schema valid /16"]), len(wl.w4_cases()),
                     off["W4 json_schema, jump-forward off s/request"] / s_per_request,
                     runs[-1]["W4 json_schema jump-forward tokens /request"])


# ---------------------------------------------------------------- 4. coverage

Outcome = tuple[str, str] | None  # a schema's failure (reason, message), None: covered


def measure_coverage(name: str, model_path: Path, entries: Sequence[CorpusSchema], seeds: Sequence[int],
                     max_new_tokens: int, deadline_s: float) -> Coverage:
    """Part 4 for one backend: an Engine on `model_path` compiles each schema (its own grammar
    backend, so the requests find it compiled), then runs `seeds` requests per compiled schema.
    A compile past the deadline still holds its worker (only outlines' can be killed): after
    MAX_HUNG_COMPILES in a row, the schemas left count as timeouts without being tried."""
    from radixlm.runtime.engine import Engine

    engine = Engine(str(model_path), grammar_backend=name, random_seed=0)
    name_to_outcome: dict[str, Outcome] = {}
    num_hung = 0  # compiles in a row without an answer by the deadline
    try:
        for start in range(0, len(entries), COVERAGE_CHUNK):
            compiled = []
            for entry in entries[start : start + COVERAGE_CHUNK]:
                if num_hung >= MAX_HUNG_COMPILES:
                    name_to_outcome[entry.name] = ("timeout", f"not tried: {num_hung} compiles in a row hung")
                    continue
                result = compile_schema(engine.grammar_backend, entry.schema, deadline_s)
                num_hung = num_hung + 1 if isinstance(result, Failure) and result.reason.startswith(_NO_ANSWER) else 0
                if isinstance(result, Failure):
                    name_to_outcome[entry.name] = (result.kind, result.reason)
                else:
                    compiled.append(entry)
            name_to_outcome.update(_generate(engine, compiled, seeds, max_new_tokens))
    finally:
        engine.shutdown()
    failures = [(entry.name, *outcome) for entry in entries if (outcome := name_to_outcome[entry.name]) is not None]
    num_not_compiled = sum(reason in ("refused", "timeout") for _, reason, _ in failures)
    return Coverage(len(entries), len(entries) - num_not_compiled, len(entries) - len(failures), failures)


def _generate(engine: Any, entries: Sequence[CorpusSchema], seeds: Sequence[int],
              max_new_tokens: int) -> dict[str, Outcome]:
    """Every (schema, seed) request in one batch, each schema's outcome. A batch the front door
    refuses is run again schema by schema, so the refusal lands on its own schema."""
    from radixlm.runtime.api.request_io import RequestError

    if not entries:
        return {}
    params = [{"max_new_tokens": max_new_tokens, "temperature": 1.0, "seed": seed,
               "json_schema": json.dumps(entry.schema)} for entry in entries for seed in seeds]
    try:
        results = engine.generate(prompt=[COVERAGE_PROMPT] * len(params), sampling_params=params)
    except RequestError as e:
        if len(entries) == 1:
            return {entries[0].name: ("request error", str(e))}
        return {k: v for entry in entries for k, v in _generate(engine, [entry], seeds, max_new_tokens).items()}
    assert isinstance(results, list)
    outcomes: dict[str, Outcome] = {}
    for i, entry in enumerate(entries):
        judged = [_judge(entry.schema, r) for r in results[i * len(seeds) : (i + 1) * len(seeds)]]
        outcomes[entry.name] = next((o for o in judged if o is not None), None)
    return outcomes


def _judge(schema: dict[str, Any], result: dict[str, Any]) -> Outcome:
    import jsonschema

    finish = result["meta_info"]["finish_reason"] or {}
    if finish.get("type") == "abort":
        return "aborted", str(finish.get("message"))
    try:
        value = json.loads(result["text"])
    except json.JSONDecodeError as e:
        return "invalid output", f"not JSON ({e}): {result['text'][:80]!r}"
    # the schema's own draft (`$schema`; 2020-12 without one): draft-04's boolean bounds, draft-07's item lists
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = next(validator(schema, format_checker=jsonschema.FormatChecker())
                 .iter_errors(value), None)
    return None if error is None else ("invalid output", error.message[:120])


# ---------------------------------------------------------------- the table


def run_table(config: GrammarBenchConfig, coverage_model_path: Path | None = None) -> list[BackendRow]:
    """Every part of `config.parts`, each backend's apart. Coverage runs on `coverage_model_path`,
    by default a tiny random-weight Llama written to a temporary directory."""
    from radixlm.runtime.config.server_args import GRAMMAR_BACKENDS
    from radixlm.runtime.model.model_config import ModelConfig
    from radixlm.runtime.model.model_files import resolve_model_path
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

    unknown = [name for name in config.backend_names if name not in GRAMMAR_BACKENDS]
    if unknown:
        raise ValueError(f"unknown grammar backends: {', '.join(unknown)}; they are {', '.join(GRAMMAR_BACKENDS)}")
    path = resolve_model_path(None)
    tokenizer, vocab_size = Tokenizer(path), ModelConfig.from_dir(path).vocab_size
    name_to_fields: dict[str, dict[str, Any]] = {name: {} for name in config.backend_names}
    if "compile" in config.parts or "mask" in config.parts:
        _compile_and_mask(config, tokenizer, vocab_size, name_to_fields)
    if "w4" in config.parts:
        for name in config.backend_names:
            name_to_fields[name]["w4"] = _guarded(measure_w4, name, config.dtype, config.repeats)
    if "coverage" in config.parts:
        entries = corpus()[: config.corpus_limit]
        with tempfile.TemporaryDirectory(prefix="radixlm-grammar-bench-") as tmp:
            if coverage_model_path is None:
                from radixlm.runtime.bench.stream_cost import write_tiny_long_model

                coverage_model_path = write_tiny_long_model(Path(tmp))
            for name in config.backend_names:
                name_to_fields[name]["coverage"] = _guarded(measure_coverage, name, coverage_model_path, entries,
                                                            config.seeds, config.max_new_tokens, config.deadline_s)
    return [BackendRow(name, **name_to_fields[name]) for name in config.backend_names]


def format_table(rows: Sequence[BackendRow], config: GrammarBenchConfig, details: bool = False) -> list[str]:
    """The markdown table, its legend and footnotes (each Failure cell's reason, the coverage
    failure counts; with `details`, every schema not covered and why), as lines."""
    notes: list[str] = []

    def cell(value: object, where: str, render: Callable[[Any], str]) -> str:
        if value is None:
            return "-"
        if isinstance(value, Failure):
            notes.append(f"[{len(notes) + 1}] {where}: {value.kind}: {_short(value.reason, 300)}")
            return f"{value.kind} [{len(notes)}]"
        return render(value)

    names = list(schemas())
    header = ["backend", *(f"compile {n} (s)" for n in names), "mask b1 p50/p99 (µs)",
              f"mask b{config.batch_size} p50/p99 (µs)", "W4 s/req", "W4 valid", "JF off/on", "JF tok/req",
              "corpus compiled", "corpus covered"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for row in rows:
        compile_secs = row.compile_secs
        compile_cells = [cell(compile_secs if not isinstance(compile_secs, dict) else compile_secs.get(n),
                              f"{row.name}, compile {n}", lambda s: f"{s:.3f}") for n in names]
        w4 = row.w4
        w4_cells = [cell(w4, f"{row.name}, W4", lambda w: f"{w.s_per_request:.2f}")]
        w4_cells += ["-"] * 3 if not isinstance(w4, W4Figures) else [
            f"{w4.num_valid}/{w4.num_cases}", f"{w4.jump_forward_off_ratio:.2f}x", f"{w4.jump_forward_tokens_per_request:.1f}"]
        cov = row.coverage
        cov_cells = [cell(cov, f"{row.name}, coverage", lambda c: f"{c.num_compiled}/{c.num_schemas}")]
        cov_cells.append("-" if not isinstance(cov, Coverage) else
                         f"{cov.num_valid}/{cov.num_schemas} ({100 * cov.num_valid / max(cov.num_schemas, 1):.0f}%)")
        masks = [cell(row.mask_single, f"{row.name}, mask b1", _percentiles),
                 cell(row.mask_batch, f"{row.name}, mask b{config.batch_size}", _percentiles)]
        lines.append("| " + " | ".join([row.name, *compile_cells, *masks, *w4_cells, *cov_cells]) + " |")
    for row in rows:
        if not isinstance(row.coverage, Coverage) or not row.coverage.failures:
            continue
        counts = ", ".join(f"{reason} {n}" for reason, n in row.coverage.failure_counts().items())
        firsts = {reason: f"{schema}: {_short(message, 160)}" for schema, reason, message in reversed(row.coverage.failures)}
        notes.append(f"coverage failures, {row.name}: {counts} (first of each: "
                     + "; ".join(f"{reason}: {firsts[reason]}" for reason in sorted(firsts)) + ")")
        if details:
            notes += [f"    {schema}: {reason}: {_short(message, 200)}" for schema, reason, message in row.coverage.failures]
    return lines + ["", *_legend(config), *notes]


def _short(message: str, limit: int) -> str:
    """A failure message without the regex outlines quotes in it (the reason follows it), cut to `limit`."""
    message = re.sub(r" \(regex '.*'\)(?=: )", "", message.replace("\n", " "), count=1)
    return message if len(message) <= limit else message[: limit - 3] + "..."


def _percentiles(p: Percentiles) -> str:
    return f"{p.p50_us:.0f}/{p.p99_us:.0f}" + ("" if p.num_states == 1 else f" (x{p.num_states})")


def _legend(config: GrammarBenchConfig) -> list[str]:
    seeds = ", ".join(map(str, config.seeds))
    return [
        f"compile: one compile after a warm-up, --deadline {config.deadline_s:g} s (outlines also stops its own "
        "index builds at RADIXLM_GRAMMAR_COMPILE_TIMEOUT). mask: fill_vocab_masks per decode step, "
        f"walks: {config.walks}; b1 along a W4 answer, b{config.batch_size} along corpus examples in lock-step "
        "(xN: N states per step).",
        f"W4: default model, greedy, median of {config.repeats} runs; JF off/on: s/request with jump-forward "
        "off over on; JF tok/req: tokens jump-forward appended per request. corpus: schemas compiled within the "
        f"deadline; covered: compiled and all {len(config.seeds)} outputs valid (tiny random model, seeds {seeds}, "
        f"temperature 1.0, {config.max_new_tokens} new tokens, Draft 2020-12 + FormatChecker).",
    ]


# ---------------------------------------------------------------- command line


def add_cli_args(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The table's flags, each `--{prefix}name` (the main bench adds them as --grammar-*); unset
    ones take the defaults of GrammarBenchConfig, or QUICK's with --{prefix}quick."""
    p = f"--{prefix}"
    parser.add_argument(f"{p}quick", action="store_true", help="a smoke run: " + ", ".join(
        f"{f.name}={getattr(QUICK, f.name)}" for f in dataclasses.fields(QUICK)
        if getattr(QUICK, f.name) != f.default))
    parser.add_argument(f"{p}backends", help="comma-separated grammar backends (default: all)")
    parser.add_argument(f"{p}parts", help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument(f"{p}deadline", type=float, help="seconds a compile may take (default 120)")
    parser.add_argument(f"{p}walks", type=int, help="mask timing: walks along the outputs (default 5)")
    parser.add_argument(f"{p}batch-size", type=int, help="mask timing: the batch's schemas (default 32)")
    parser.add_argument(f"{p}corpus-limit", type=int, help="coverage: the first N corpus schemas (default all)")
    parser.add_argument(f"{p}seeds", help="coverage: comma-separated request seeds (default 0,1,2)")
    parser.add_argument(f"{p}max-new-tokens", type=int, help="coverage: tokens per request (default 256)")


def config_from_args(args: argparse.Namespace, prefix: str = "", **fixed: Any) -> GrammarBenchConfig:
    """The config of `add_cli_args`' flags; `fixed` gives fields the caller sets (repeats, dtype)."""
    def flag(name: str) -> Any:
        return getattr(args, (prefix + name).replace("-", "_"))

    given: dict[str, Any] = {
        "backends": flag("backends") and tuple(flag("backends").split(",")),
        "parts": flag("parts") and tuple(flag("parts").split(",")),
        "deadline_s": flag("deadline"), "walks": flag("walks"), "batch_size": flag("batch-size"),
        "corpus_limit": flag("corpus-limit"), "max_new_tokens": flag("max-new-tokens"),
        "seeds": flag("seeds") and tuple(int(s) for s in flag("seeds").split(",")),
        **fixed,
    }
    config = dataclasses.replace(QUICK if flag("quick") else GrammarBenchConfig(),
                                 **{k: v for k, v in given.items() if v is not None})
    unknown = [part for part in config.parts if part not in PARTS]
    if unknown:
        raise ValueError(f"unknown grammar table parts: {', '.join(unknown)}; they are {', '.join(PARTS)}")
    return config


def print_table(config: GrammarBenchConfig, details: bool = False, results: ResultTables | None = None) -> None:
    from radixlm.runtime.bench.grammar_json import row_to_json  # it imports this module

    start = time.perf_counter()
    rows = run_table(config)
    table_rows(results, "grammar", "grammar backends", **dataclasses.asdict(config)).extend(map(row_to_json, rows))
    print("\n## grammar backends")
    print("\n".join(format_table(rows, config, details)))
    print(f"(measured in {time.perf_counter() - start:.0f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixlm.runtime.bench.grammar", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    parser.add_argument("--repeats", type=int, help="W4: runs, the median reported (default 3)")
    parser.add_argument("--dtype", help="W4: the default model's dtype (default auto)")
    parser.add_argument("--details", action="store_true", help="list every schema not covered, and why")
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args, **{k: v for k, v in (("repeats", args.repeats), ("dtype", args.dtype))
                                           if v is not None})
    except ValueError as e:
        parser.error(str(e))
    print_table(config, args.details)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
