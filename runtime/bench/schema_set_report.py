"""`python -m radixlm.runtime.bench.schema_set_report`: the JSONSchemaBench-style sets
(`schema_sets`) through each engine alone and through the server's front door, as markdown.

1. Per set: schemas; the share each engine compiles alone (its own lowering of the schema as
   written, `backends.lower_on`: no rewrite, no fallback; "compiles" says nothing of whether it
   enforces every keyword, see docs/json-schema.md's keyword table); the share the front door
   serves (`backends.validate` with `--grammar-backend xgrammar`, the default) and by which
   engine; with `--generate`, the share of served schemas whose outputs all validate
   (`jsonschema`, the schema's own draft, format checker on) when generated on `--model-path`
   (default: the default model; any weights do, the grammar decides validity), one request per
   served schema through an in-process Engine's front door: "v/n", each failure listed.
2. Per keyword: of the schemas (all sets) that use it, the share each engine compiles alone and
   the share the door serves.

`--limit N` takes every k-th schema of a set so that at most N are measured (the sets hold ~1,700
schemas; the whole run takes minutes, mostly xgrammar's lowering of the larger SchemaStore ones).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from radixlm.runtime.bench.schema_corpus import CorpusSchema
from radixlm.runtime.constrained.errors import GrammarError

ENGINES = ("xgrammar", "llguidance", "outlines")
KEYWORDS = ("$ref", "allOf", "anyOf", "oneOf", "not", "if", "const", "enum", "pattern", "format", "patternProperties",
            "additionalProperties", "propertyNames", "dependentRequired", "dependencies", "uniqueItems", "contains",
            "prefixItems", "minProperties", "minItems", "minLength", "multipleOf")


class Outcome(NamedTuple):
    engine_to_ok: dict[str, bool]  # each engine alone: lowered the schema as written
    door: str | None  # the engine the door chose, None: refused
    keywords: frozenset[str]


def sample(entries: Sequence[CorpusSchema], limit: int | None) -> list[CorpusSchema]:
    """Every k-th entry, at most `limit` (all when None)."""
    if limit is None or len(entries) <= limit:
        return list(entries)
    step = -(-len(entries) // limit)
    return list(entries[::step])


def keywords_of(schema: object) -> frozenset[str]:
    from radixlm.runtime.constrained.compile_cache import walk_subschemas

    found: set[str] = set()
    for node, _ in walk_subschemas(schema):
        found.update(k for k in node if k in KEYWORDS)
        if isinstance(node.get("additionalProperties"), bool):
            found.discard("additionalProperties")  # counted only as a schema
    return frozenset(found)


def measure(schema: dict[str, Any]) -> Outcome:
    from radixlm.runtime.constrained import backends

    engine_to_ok = {}
    for engine in ENGINES:
        try:
            backends.lower_on(engine, "json_schema", schema)
            engine_to_ok[engine] = True
        except (GrammarError, RecursionError, ValueError):
            engine_to_ok[engine] = False
    try:
        door: str | None = backends.validate("xgrammar", "json_schema", schema).backend
    except GrammarError:
        door = None
    return Outcome(engine_to_ok, door, keywords_of(schema))


def _pct(num: int, den: int) -> str:
    return f"{100 * num / den:.0f}%" if den else "-"


def set_rows(name_to_outcomes: dict[str, list[Outcome]], name_to_valid: dict[str, tuple[int, int]]) -> list[str]:
    lines = ["| set | schemas | xgrammar alone | llguidance alone | outlines alone | radixlm served | by engine | "
             "outputs valid |", "|---|---|---|---|---|---|---|---|"]
    for name, outcomes in name_to_outcomes.items():
        n = len(outcomes)
        alone = [_pct(sum(o.engine_to_ok[e] for o in outcomes), n) for e in ENGINES]
        served = Counter(o.door for o in outcomes if o.door is not None)
        by_engine = ", ".join(f"{e} {c}" for e, c in served.most_common())
        valid = name_to_valid.get(name)
        valid_text = f"{valid[0]}/{valid[1]}" if valid else "-"
        lines.append(f"| {name} | {n} | {' | '.join(alone)} | {_pct(sum(served.values()), n)} | {by_engine or '-'} | "
                     f"{valid_text} |")
    return lines


def keyword_rows(outcomes: Sequence[Outcome]) -> list[str]:
    lines = ["| keyword | schemas using it | xgrammar alone | llguidance alone | outlines alone | radixlm served |",
             "|---|---|---|---|---|---|"]
    keyword_to_outcomes: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        for k in o.keywords:
            keyword_to_outcomes[k].append(o)
    for keyword in KEYWORDS:
        used = keyword_to_outcomes.get(keyword, [])
        n = len(used)
        alone = [_pct(sum(o.engine_to_ok[e] for o in used), n) for e in ENGINES]
        lines.append(f"| {keyword} | {n} | {' | '.join(alone)} | {_pct(sum(o.door is not None for o in used), n)} |")
    return lines


def generate_valid(model_path: Path, entries: Sequence[CorpusSchema],
                   max_new_tokens: int) -> tuple[tuple[int, int], list[tuple[str, str, str]]]:
    """((schemas whose output validated, schemas generated), each failure (schema, reason,
    message)) for `entries`, one request each through an in-process Engine's front door (so each
    schema goes to the engine the server would choose), `--grammar-backend xgrammar`, seed 0,
    temperature 1.0, in batches of `grammar.COVERAGE_CHUNK` (`grammar._generate` judges each)."""
    from radixlm.runtime.bench.grammar import COVERAGE_CHUNK, _generate
    from radixlm.runtime.engine import Engine

    engine = Engine(str(model_path), grammar_backend="xgrammar", random_seed=0)
    failures: list[tuple[str, str, str]] = []
    try:
        for start in range(0, len(entries), COVERAGE_CHUNK):
            outcomes = _generate(engine, entries[start : start + COVERAGE_CHUNK], [0], max_new_tokens)
            failures.extend((name, *outcome) for name, outcome in outcomes.items() if outcome is not None)
    finally:
        engine.shutdown()
    return (len(entries) - len(failures), len(entries)), failures


def main(argv: list[str] | None = None) -> int:
    from radixlm.runtime.bench.schema_sets import load_sets

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="at most this many schemas per set (a stride)")
    parser.add_argument("--generate", action="store_true", help="also generate from every served schema")
    parser.add_argument("--model-path", default=None, help="model for --generate (default: the default model)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    name_to_entries = {name: sample(entries, args.limit) for name, entries in load_sets().items()}
    name_to_outcomes = {name: [measure(e.schema) for e in entries] for name, entries in name_to_entries.items()}
    name_to_valid: dict[str, tuple[int, int]] = {}
    failures: list[tuple[str, str, str]] = []
    if args.generate:
        from radixlm.runtime.model.model_files import resolve_model_path

        model_path = resolve_model_path(args.model_path)
        for name, entries in name_to_entries.items():
            served = [e for e, o in zip(entries, name_to_outcomes[name]) if o.door is not None]
            name_to_valid[name], failed = generate_valid(model_path, served, args.max_new_tokens)
            failures.extend(failed)
    print("\n".join(set_rows(name_to_outcomes, name_to_valid)))
    print()
    print("\n".join(keyword_rows([o for outcomes in name_to_outcomes.values() for o in outcomes])))
    for schema_name, reason, message in failures:  # served at the door, then aborted or not valid
        print(f"- {schema_name}: {reason}: {message[:200]}")
    print(f"\n({time.perf_counter() - start:.0f} s; " + json.dumps({n: len(e) for n, e in name_to_entries.items()}) + ")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
