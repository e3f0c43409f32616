"""A corpus of "hard" JSON schemas, shaped like the schemas of configuration formats: CI pipelines,
issue forms, package manifests, compose files, linters' configs, cloud templates. Written for this
project (no public schema's text copied); each uses the keywords such schemas use and single
engines refuse or let violate: `$ref` inside `allOf` / `anyOf`, `required` names outside
`properties`, `patternProperties`, `additionalProperties` as a schema, `propertyNames`,
`if` / `then` / `else`, `dependentRequired` / `dependencies`, `uniqueItems`, `const`, `enum` of any
JSON values, `format`s, `contains`, and the draft-04 .. 2020-12 dialects.

The schemas are data, `data/hard_schema_corpus.json` (`{"schemas": [{"name", "schema",
"example"}]}`, each schema with its own `$schema`), written by `python -m
radixlm.runtime.bench.hard_schema_corpus` from the builders below (variant `i` of a family changes
names, fields and keyword mix). `big_schemas()` makes the 1-3 MB ones on demand (not stored).
tests/runtime/test_schema_engines.py checks every example against its schema with `jsonschema`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radixlm.runtime.bench.data_files import load_json
from radixlm.runtime.bench.schema_corpus import CorpusSchema

Schema = dict[str, Any]
CORPUS_FILE = "hard_schema_corpus.json"
DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT6 = "http://json-schema.org/draft-06/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"
DRAFT2019 = "https://json-schema.org/draft/2019-09/schema"
DRAFT2020 = "https://json-schema.org/draft/2020-12/schema"
_WORDS = ("build", "test", "lint", "deploy", "docs", "bench", "pack", "audit", "sync", "scan", "fmt", "check",
          "release", "smoke", "e2e", "cache", "notify", "index", "verify", "upload", "mirror", "prune", "seed",
          "probe", "stage")  # fmt: skip


def _w(i: int, k: int = 0) -> str:
    return _WORDS[(i * 7 + k * 3) % len(_WORDS)]


def ci_pipeline(i: int) -> tuple[Schema, object]:
    """A CI workflow: jobs by name pattern, steps as a string or an object, needs unique."""
    dialect = (DRAFT7, DRAFT2019, DRAFT2020)[i % 3]
    defs = "definitions" if dialect == DRAFT7 else "$defs"
    step = {"oneOf": [{"type": "string", "minLength": 1},
                      {"type": "object", "properties": {"run": {"type": "string"}, "uses": {"type": "string"},
                                                        "name": {"type": "string"}},
                       "required": ["name"], "additionalProperties": False}]}
    job: Schema = {
        "type": "object",
        "properties": {"runs_on": {"enum": ["linux", "macos", "windows", None]},
                       "steps": {"type": "array", "items": {"$ref": f"#/{defs}/step"}, "maxItems": 4},
                       "needs": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                       "timeout": {"type": "integer", "minimum": 1, "maximum": 360}},
        "required": ["runs_on", f"{_w(i)}_env"],
    }
    if i % 2:
        job["dependencies" if dialect == DRAFT7 else "dependentRequired"] = {"timeout": ["steps"]}
    schema: Schema = {
        "$schema": dialect, "type": "object", defs: {"step": step, "job": job},
        "properties": {"name": {"type": "string"},
                       "jobs": {"type": "object", "patternProperties": {"^[a-z][a-z0-9_-]*$": {"$ref": f"#/{defs}/job"}},
                                "additionalProperties": False, "maxProperties": 3}},
        "required": ["jobs"],
    }
    example = {"name": f"{_w(i)} pipeline",
               "jobs": {_w(i, 1): {"runs_on": "linux", f"{_w(i)}_env": {"CI": "1"},
                                   "steps": ["make", {"name": "up", "run": "x"}], "timeout": 10, "needs": []}}}
    return schema, example


def issue_form(i: int) -> tuple[Schema, object]:
    """An issue form: body items discriminated by `type` (const), labels unique, ids restricted."""
    field_types = ("input", "textarea", "dropdown", "checkboxes")
    items = []
    for kind in field_types[: 2 + i % 3]:
        attrs: Schema = {"type": "object", "properties": {"label": {"type": "string", "minLength": 1}},
                         "required": ["label"]}
        if kind == "dropdown":
            attrs["properties"]["options"] = {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                              "uniqueItems": True}
            attrs["required"] = ["label", "options"]
        items.append({"type": "object", "properties": {"type": {"const": kind}, "id": {"type": "string",
                      "pattern": "^[a-z][a-z0-9_-]*$"}, "attributes": attrs}, "required": ["type", "attributes"],
                      "additionalProperties": False})
    schema: Schema = {
        "$schema": DRAFT2020, "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 40}, "description": {"type": "string"},
                       "labels": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                       "assignees": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                       "body": {"type": "array", "items": {"oneOf": items}, "minItems": 1, "maxItems": 3},
                       "severity": {"enum": [1, 2, 3, "unknown", None]}},
        "required": ["name", "description", "body"],
        "propertyNames": {"enum": ["name", "description", "labels", "assignees", "body", "severity", f"x_{_w(i)}"]},
    }
    example = {"name": f"Bug {_w(i)}", "description": "d", "labels": ["bug"],
               "body": [{"type": "input", "attributes": {"label": "Version"}}]}
    return schema, example


def package_manifest(i: int) -> tuple[Schema, object]:
    """A package manifest in draft-04: `id`, boolean exclusive bounds, dependency maps, tuples."""
    version = {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"}
    schema: Schema = {
        "$schema": DRAFT4, "id": f"https://example.invalid/{_w(i)}-manifest.json", "type": "object",
        "definitions": {"version": version, "deps": {"type": "object", "additionalProperties": {"$ref": "#/definitions/version"}}},
        "properties": {"name": {"type": "string", "pattern": "^[a-z][a-z0-9-]*$"},
                       "version": {"$ref": "#/definitions/version"},
                       "homepage": {"type": "string", "format": "uri"},
                       "author": {"type": "object", "properties": {"name": {"type": "string"},
                                                                   "email": {"type": "string", "format": "email"}},
                                  "required": ["name"]},
                       "dependencies": {"$ref": "#/definitions/deps"},
                       "engines": {"type": "array", "items": [{"enum": ["node", "deno", "bun"]},
                                                              {"$ref": "#/definitions/version"}],
                                   "additionalItems": False},
                       "weight": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 100}},
        "required": ["name", "version", "license"],
        "dependencies": {"homepage": ["author"]} if i % 2 else {"author": {"required": ["license"]}},
    }
    example: Schema = {"name": f"pkg-{_w(i)}", "version": "1.0.0", "license": "MIT",
                       "author": {"name": "A", "email": "a@b.co"}, "homepage": "https://x.org/",
                       "dependencies": {"left": "2.0.1"}, "engines": ["node", "20.1.0"], "weight": 2.5}
    return schema, example


def compose_file(i: int) -> tuple[Schema, object]:
    """A compose file (2019-09): services by name pattern, ports as int or string, depends_on unique."""
    service: Schema = {
        "type": "object",
        "properties": {"image": {"type": "string"},
                       "ports": {"type": "array", "items": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 65535},
                                                                      {"type": "string", "pattern": "^[0-9]+:[0-9]+$"}]}},
                       "depends_on": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                       "restart": {"enum": ["no", "always", "on-failure"]},
                       f"x_{_w(i)}_{i}": {"type": "string", "maxLength": 8 + i},
                       "healthcheck": {"type": "object", "properties": {"test": {"type": "string"},
                                                                        "interval": {"type": "string"}},
                                       "dependentRequired": {"interval": ["test"]}}},
        "additionalProperties": {"type": ["string", "integer", "boolean"]},
    }
    if i % 3 == 0:
        service["required"] = ["image", "platform"]
    schema: Schema = {
        "$schema": DRAFT2019, "type": "object", "$defs": {"service": service},
        "properties": {"version": {"const": "3.8"},
                       "services": {"type": "object", "patternProperties": {"^[a-zA-Z0-9._-]+$": {"$ref": "#/$defs/service"}},
                                    "additionalProperties": False, "minProperties": 1, "maxProperties": 2},
                       "networks": {"type": "object", "additionalProperties": {"type": "object",
                                    "properties": {"driver": {"enum": ["bridge", "overlay"]}}}}},
        "required": ["services"],
    }
    example = {"services": {_w(i): {"image": "alpine", "platform": "linux", "ports": [80, "8080:80"],
                                    "restart": "always"}}}
    return schema, example


def linter_config(i: int) -> tuple[Schema, object]:
    """A linter's config (draft-06): rule levels as words, numbers or tuples; plugin names restricted."""
    level = {"oneOf": [{"enum": ["off", "warn", "error"]}, {"enum": [0, 1, 2]},
                       {"type": "array", "items": [{"enum": ["off", "warn", "error"]}], "minItems": 1, "maxItems": 2}]}
    schema: Schema = {
        "$schema": DRAFT6, "type": "object", "definitions": {"level": level},
        "properties": {"root": {"type": "boolean"}, "extends": {"anyOf": [{"type": "string"}, {"type": "array",
                       "items": {"type": "string"}}]},
                       "rules": {"type": "object", "propertyNames": {"pattern": "^[a-z][a-z-]*(/[a-z-]+)?$"},
                                 "additionalProperties": {"$ref": "#/definitions/level"}, "maxProperties": 3},
                       "plugins": {"type": "array", "items": {"type": "string"}, "contains": {"const": _w(i)}},
                       "ignore": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 3}},
        "required": ["rules"],
        "additionalProperties": i % 2 == 0,
    }
    example = {"root": True, "rules": {"no-unused": "warn", "eq/strict": ["error"]}, "plugins": [_w(i)]}
    return schema, example


def cloud_template(i: int) -> tuple[Schema, object]:
    """A cloud template: resources by logical id, typed by a `Type` const with if / then blocks."""
    kinds = ("Bucket", "Queue", "Function")
    resource: Schema = {
        "type": "object",
        "properties": {"Type": {"enum": list(kinds)}, "Properties": {"type": "object"},
                       "DependsOn": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "required": ["Type", "Properties"],
        "if": {"properties": {"Type": {"const": "Function"}}},
        "then": {"properties": {"Properties": {"required": ["Runtime"], "properties": {
            "Runtime": {"enum": ["python3.12", "nodejs20"]}, "Memory": {"type": "integer", "multipleOf": 64}}}}},
        "else": {"properties": {"Properties": {"properties": {"Name": {"type": "string", "maxLength": 63}}}}},
    }
    base = {"type": "object", "properties": {"Description": {"type": "string"},
                                             "Created": {"type": "string", "format": "date"}}}
    schema: Schema = {
        "$schema": DRAFT2020, "$defs": {"resource": resource, "base": base},
        "allOf": [{"$ref": "#/$defs/base"},
                  {"type": "object", "properties": {
                      "Resources": {"type": "object", "patternProperties": {"^[A-Za-z0-9]+$": {"$ref": "#/$defs/resource"}},
                                    "additionalProperties": False, "minProperties": 1, "maxProperties": 2},
                      "Outputs": {"type": "object", "additionalProperties": {"type": "object", "properties": {
                          "Value": {"type": "string"}, "Address": {"type": "string", "format": "ipv4"}}}}},
                   "required": ["Resources", f"Version{i}"]}],
    }
    example = {"Created": "2024-05-01", f"Version{i}": 1,
               "Resources": {"Fn": {"Type": "Function", "Properties": {"Runtime": "python3.12", "Memory": 128}}}}
    return schema, example


FAMILIES: dict[str, Callable[[int], tuple[Schema, object]]] = {
    "ci_pipeline": ci_pipeline, "issue_form": issue_form, "package_manifest": package_manifest,
    "compose_file": compose_file, "linter_config": linter_config, "cloud_template": cloud_template,
}
VARIANTS = 26  # per family: 156 schemas


def build() -> list[CorpusSchema]:
    """Every schema of the stored corpus, from the builders."""
    return [CorpusSchema(f"{family}_{i:02d}", *make(i)) for family, make in FAMILIES.items() for i in range(VARIANTS)]


def corpus() -> list[CorpusSchema]:
    """The stored corpus, loaded afresh."""
    return [CorpusSchema(e["name"], e["schema"], e["example"]) for e in load_json(CORPUS_FILE)["schemas"]]


def big_schema(num_services: int) -> CorpusSchema:
    """A compose-style schema with `num_services` declared services, each with its own fields
    (~6.6 KB each: 160 make ~1 MB), and an example."""
    services: Schema = {}
    for n in range(num_services):
        fields = {f"{_w(n, k)}_{k}_{n}": {"type": ["string", "integer"], "description": "x" * 40} for k in range(60)}
        fields["image"] = {"type": "string", "pattern": "^[a-z0-9./:-]+$"}
        services[f"svc{n}"] = {"type": "object", "properties": fields, "required": ["image", f"tag{n}"],
                               "additionalProperties": False if n % 2 else {"type": "string"}}
        if n % 2:
            fields[f"tag{n}"] = {"enum": ["a", "b", 1, None]}
    schema: Schema = {"$schema": DRAFT7, "type": "object", "definitions": {"services": {"type": "object", "properties": services}},
                      "allOf": [{"$ref": "#/definitions/services"}, {"required": ["svc0"]}]}
    return CorpusSchema(f"big_compose_{num_services}", schema, {"svc0": {"image": "alpine:3", "tag0": "x"}})


def big_schemas() -> list[CorpusSchema]:
    """Two generated schemas of ~1.1 and ~2.4 MB."""
    return [big_schema(160), big_schema(360)]


def main() -> None:
    entries = [{"name": e.name, "schema": e.schema, "example": e.example} for e in build()]
    lines = ",\n".join(json.dumps(e, ensure_ascii=False) for e in entries)
    path = Path(__file__).parent / "data" / CORPUS_FILE
    path.write_text('{"schemas": [\n' + lines + "\n]}\n")
    print(f"wrote {len(entries)} schemas to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
