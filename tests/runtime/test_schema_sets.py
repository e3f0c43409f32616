"""The JSONSchemaBench-style sets (`runtime/bench/schema_sets.py`) at the front door: a stride
sample of each set is served (>= 90% where we reach it) or refused naming what no engine enforces;
the real sets come from the installed packages, bundled self-contained. (Generation from a sample
of each set through the server: tests/server/test_schema_generation.py.)"""

from __future__ import annotations

import functools
import json

from radixlm.runtime.bench import schema_sets
from radixlm.runtime.bench.schema_set_report import keyword_rows, measure, sample, set_rows
from radixlm.runtime.constrained.schema_rewrite import refs_in


@functools.cache
def _sets() -> dict[str, list[schema_sets.CorpusSchema]]:
    return schema_sets.load_sets()

MAX_CHARS = 64 * 1024  # the sample leaves out the few larger documents: their lowering takes seconds each
# the share of each set's sample the door must serve (measured: docs/json-schema.md has the table)
MIN_SERVED = {"glaive": 0.9, "github-easy": 0.9, "github-medium": 0.9, "github-hard": 0.9, "kubernetes": 0.9,
              "snowplow": 0.9, "schemastore": 0.6}


def test_sets_are_self_contained_and_licensed() -> None:
    SETS = _sets()  # noqa: N806
    assert set(SETS) == set(MIN_SERVED)
    assert len(SETS["kubernetes"]) > 800 and len(SETS["schemastore"]) >= 20
    assert not any(e.name.startswith(("schemastore/renovate", "schemastore/snapcraft")) for e in SETS["schemastore"])
    for entry in SETS["kubernetes"][::50]:
        text = json.dumps(entry.schema)
        assert "_definitions.json" not in text, entry.name  # every reference points inside
        assert all(ref.startswith("#") for ref in refs_in(entry.schema)), entry.name


def test_a_sample_of_each_set_is_served_at_the_door() -> None:
    name_to_outcomes = {}
    for name, entries in _sets().items():
        small = [e for e in entries if len(json.dumps(e.schema)) <= MAX_CHARS]
        outcomes = [measure(e.schema) for e in sample(small, 12)]
        served = sum(o.door is not None for o in outcomes) / len(outcomes)
        assert served >= MIN_SERVED[name], (name, served)
        name_to_outcomes[name] = outcomes
    table = set_rows(name_to_outcomes, {})
    assert len(table) == 2 + len(MIN_SERVED) and table[2].startswith("| glaive | 12 |")
    assert any(row.startswith("| oneOf |") for row in keyword_rows(name_to_outcomes["kubernetes"]))
