"""JSON schemas in the categories of JSONSchemaBench (Geng et al., 2025), from what PyPI ships.

No model hub here, so not its data: sets of the same kinds, real where a package ships real ones
(read from the installed package at run time, never copied into this repository), generated where
none does. `load_sets()` gives each set's `CorpusSchema`s (example None: real schemas come without).

- `kubernetes` (real): kubernetes-validate 1.37's schemas of Kubernetes 1.37 ("local-strict":
  additionalProperties false), one per resource or type, each bundled with the `$defs` of its
  `_definitions.json` that it reaches (references rewritten from `/api/_definitions.json#/$defs/X`
  to `#/$defs/X`). Apache-2.0 (kubernetes-validate; the schemas come from Kubernetes' OpenAPI).
- `schemastore` (real): the SchemaStore schemas check-jsonschema 0.39 vendors (CI pipelines,
  issue forms, compose, dependabot, ...), Apache-2.0 or MIT per its licenses folder; renovate
  (AGPL-3.0) and snapcraft (GPL-3.0) are left out.
- `github-easy` / `github-medium` / `github-hard` (real, but not from GitHub): JSONSchemaBench
  crawled GitHub; we cannot. Each named definition of the SchemaStore documents above, bundled
  with the definitions it references, is a real schema someone wrote; split by its JSON size as
  JSONSchemaBench splits by complexity: easy < 1 KB, medium < 8 KB, hard the rest.
- `glaive` (generated): function-call parameter schemas in the shape of the GlaiveAI
  function-calling data (an object of typed, described parameters, some enums, some required).
- `snowplow` (generated): Iglu self-describing event schemas as Snowplow writes them (a `self`
  block, flat properties with `maxLength`, `["string", "null"]` unions, enums, formats,
  `additionalProperties: false`).

`python -m radixlm.runtime.bench.schema_sets` prints, per set, the share each engine compiles
alone and what the server's front door does (`schema_set_report`).
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable, Iterator
from importlib import resources
from typing import Any

from radixlm.runtime.bench.schema_corpus import CorpusSchema
from radixlm.runtime.constrained.schema_rewrite import refs_in

Schema = dict[str, Any]
KUBERNETES_VERSION = "v1.37.0-local-strict"
SCHEMASTORE_LEFT_OUT = ("renovate.json", "snapcraft.json")  # (A)GPL-licensed
GITHUB_EASY_MAX_CHARS = 1024
GITHUB_MEDIUM_MAX_CHARS = 8192
_K8S_REF = re.compile(r"^/api/_definitions\.json#/\$defs/")


def _package_dir(package: str, *parts: str) -> Any:
    node = resources.files(package)
    for part in parts:
        node = node / part
    return node


def _json_files(folder: Any) -> Iterator[tuple[str, Any]]:
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            yield entry.name, json.loads(entry.read_text(encoding="utf-8"))


def _retarget(node: object, rename: Callable[[str], str]) -> object:
    """A deep copy of `node` with every `$ref` string passed through `rename`."""
    if isinstance(node, dict):
        return {k: (rename(v) if k == "$ref" and isinstance(v, str) else _retarget(v, rename)) for k, v in node.items()}
    if isinstance(node, list):
        return [_retarget(item, rename) for item in node]
    return node


def bundle(root: Schema, defs: dict[str, Schema], key: str, prefix: str) -> Schema:
    """`root` with the entries of `defs` it reaches (through references `prefix + name`, followed
    transitively) under `root[key]`; references to anything else are left as they are."""
    reached: dict[str, Schema] = {}
    pending = [root]
    while pending:
        for ref in refs_in(pending.pop()):
            # the definition a reference points into (`#/definitions/a/properties/b`: `a`)
            name = ref[len(prefix):].split("/")[0].replace("~1", "/").replace("~0", "~") if ref.startswith(prefix) else None
            if name is not None and name in defs and name not in reached:
                reached[name] = defs[name]
                pending.append(defs[name])
    out = copy.deepcopy(root)
    if reached:
        out[key] = {**out.get(key, {}), **copy.deepcopy(reached)}
    return out


def kubernetes() -> list[CorpusSchema]:
    folder = _package_dir("kubernetes_validate", "kubernetes-json-schema", KUBERNETES_VERSION)
    files = dict(_json_files(folder))
    defs = files.pop("_definitions.json")["$defs"]
    files.pop("all.json", None)
    local = {name: _retarget(d, lambda r: _K8S_REF.sub("#/$defs/", r)) for name, d in defs.items()}
    out = []
    for name, schema in files.items():
        root = _retarget(schema, lambda r: _K8S_REF.sub("#/$defs/", r))
        assert isinstance(root, dict)
        out.append(CorpusSchema(f"k8s/{name[:-5]}", bundle(root, local, "$defs", "#/$defs/"), None))
    return out


def _schemastore_documents() -> list[tuple[str, Schema]]:
    folder = _package_dir("check_jsonschema", "builtin_schemas", "vendor")
    return [(name, doc) for name, doc in _json_files(folder) if name not in SCHEMASTORE_LEFT_OUT and isinstance(doc, dict)]


def schemastore() -> list[CorpusSchema]:
    return [CorpusSchema(f"schemastore/{name[:-5]}", doc, None) for name, doc in _schemastore_documents()]


def github_like() -> dict[str, list[CorpusSchema]]:
    """The named definitions of the SchemaStore documents as schemas of their own, by size."""
    sets: dict[str, list[CorpusSchema]] = {"github-easy": [], "github-medium": [], "github-hard": []}
    for doc_name, doc in _schemastore_documents():
        for key in ("definitions", "$defs"):
            defs = doc.get(key)
            if not isinstance(defs, dict):
                continue
            for def_name, sub in defs.items():
                if not isinstance(sub, dict) or not sub:
                    continue
                schema = {k: v for k, v in doc.items() if k in ("$schema",)}
                schema.update(bundle(sub, defs, key, f"#/{key}/"))
                size = len(json.dumps(schema))
                level = ("easy" if size < GITHUB_EASY_MAX_CHARS else "medium" if size < GITHUB_MEDIUM_MAX_CHARS
                         else "hard")
                sets[f"github-{level}"].append(CorpusSchema(f"{doc_name[:-5]}#{def_name}", schema, None))
    return sets


# ---------------------------------------------------------------- generated sets

_VERBS = ("get", "search", "create", "update", "delete", "convert", "calculate", "book", "send", "find", "translate",
          "schedule", "check", "list", "generate", "analyze")
_NOUNS = ("weather", "flight", "recipe", "stock_price", "invoice", "movie", "event", "hotel", "playlist", "route",
          "currency", "news", "task", "contact", "order", "poll")
_PARAMS = ("location", "date", "query", "amount", "currency", "limit", "language", "category", "email", "start_time",
           "end_time", "unit", "priority", "tags", "include_details", "user_id", "rating", "price_range", "title",
           "description", "attendees", "radius", "format")


def _glaive_parameter(rng: random.Random, name: str) -> Schema:
    kind = rng.choice(("string", "string", "enum", "integer", "number", "boolean", "array", "object"))
    described = {"description": f"The {name.replace('_', ' ')}"}
    if kind == "enum":
        return {"type": "string", "enum": rng.sample(["low", "medium", "high", "metric", "imperial", "json", "csv",
                                                      "asc", "desc", "daily", "weekly"], rng.randint(2, 4)), **described}
    if kind == "integer":
        return {"type": "integer", "minimum": 0, "maximum": rng.choice((10, 100, 1000)), **described}
    if kind == "array":
        return {"type": "array", "items": {"type": "string"}, **described}
    if kind == "object":
        return {"type": "object", "properties": {"min": {"type": "number"}, "max": {"type": "number"}},
                "required": ["min", "max"], **described}
    if kind == "string" and name in ("date", "start_time", "end_time"):
        return {"type": "string", "format": "date" if name == "date" else "date-time", **described}
    if kind == "string" and name == "email":
        return {"type": "string", "format": "email", **described}
    return {"type": kind, **described}


def glaive(num: int = 60, seed: int = 0) -> list[CorpusSchema]:
    rng = random.Random(seed)
    out = []
    for i in range(num):
        names = rng.sample(_PARAMS, rng.randint(1, 6))
        properties = {name: _glaive_parameter(rng, name) for name in names}
        required = sorted(rng.sample(names, rng.randint(0, len(names))))
        schema: Schema = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        out.append(CorpusSchema(f"glaive/{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}_{i}", schema, None))
    return out


_SNOWPLOW_FIELDS = ("category", "action", "label", "property", "value", "page_url", "referrer", "session_id",
                    "user_id", "timestamp", "currency", "revenue", "quantity", "sku", "element_id", "target_url",
                    "position", "experiment_id", "variant", "duration_ms")


def _snowplow_field(rng: random.Random, name: str) -> Schema:
    if name in ("page_url", "referrer", "target_url"):
        return {"type": ["string", "null"], "format": "uri", "maxLength": 4096}
    if name == "timestamp":
        return {"type": "string", "format": "date-time"}
    if name in ("session_id", "experiment_id"):
        return {"type": "string", "format": "uuid"}
    if name in ("value", "revenue", "duration_ms"):
        return {"type": ["number", "null"], "minimum": 0, "maximum": 9999999}
    if name in ("quantity", "position"):
        return {"type": "integer", "minimum": 0, "maximum": 2147483647}
    if name == "currency":
        return {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]}
    return {"type": ["string", "null"], "maxLength": rng.choice((32, 255, 1024))}


def snowplow(num: int = 40, seed: int = 1) -> list[CorpusSchema]:
    rng = random.Random(seed)
    out = []
    for i in range(num):
        names = rng.sample(_SNOWPLOW_FIELDS, rng.randint(2, 9))
        schema: Schema = {
            "$schema": "http://iglucentral.com/schemas/com.snowplowanalytics.self-desc/schema/jsonschema/1-0-0#",
            "description": f"Schema for a {names[0]} event",
            "self": {"vendor": "com.example", "name": f"event_{i}", "format": "jsonschema", "version": "1-0-0"},
            "type": "object", "properties": {name: _snowplow_field(rng, name) for name in names},
            "additionalProperties": False}
        required = [n for n in names if rng.random() < 0.5]
        if required:
            schema["required"] = required
        out.append(CorpusSchema(f"snowplow/event_{i}", schema, None))
    return out


def load_sets() -> dict[str, list[CorpusSchema]]:
    """Every set by name, in a fixed order (each schema loaded afresh: callers may mutate them)."""
    return {"glaive": glaive(), **github_like(), "kubernetes": kubernetes(), "snowplow": snowplow(),
            "schemastore": schemastore()}
