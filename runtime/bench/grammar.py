"""`python -m radixlm.runtime.bench.grammar`: compile time of JSON schemas per grammar backend
(outlines, xgrammar, llguidance) with the default model's tokenizer, each backend warmed up first
(its vocabulary built once): a 4-field object, a 20-field nested one (4 objects of 4 fields plus
4 scalars), a 200-property one (every other property required) and a recursive tree
(`children: {items: {$ref: "#"}}`). One compile each (a compiled grammar is cached).
(Issue 13, point 6 will extend this into the grammar table: mask time, W4, coverage.)"""

from __future__ import annotations

import time
from typing import Any

from radixlm.runtime.constrained import backends
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.model.model_files import resolve_model_path
from radixlm.runtime.tokenizer import Tokenizer

_LEAVES: list[dict[str, Any]] = [{"type": "string", "maxLength": 20}, {"type": "integer"}, {"type": "boolean"},
                                 {"type": "number"}]


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


def main() -> None:
    path = resolve_model_path(None)
    tokenizer, vocab_size = Tokenizer(path), ModelConfig.from_dir(path).vocab_size
    print("| backend | " + " | ".join(schemas()) + " |")
    print("|---|" + "---|" * len(schemas()))
    for name in backends.GRAMMAR_BACKENDS:
        backend = backends.create(name, tokenizer, vocab_size, num_workers=1, enable_jump_forward=True,
                                  whitespace_pattern=None)
        try:
            backend.get("json_schema", _object({"x": _LEAVES[1]}, ["x"])).result(timeout=600)  # warm-up
            cells = []
            for schema in schemas().values():
                start = time.perf_counter()
                try:
                    backend.get("json_schema", schema).result(timeout=600)
                    cells.append(f"{time.perf_counter() - start:.3f} s")
                except Exception as e:  # a refusal is a result of the table, not a crash of it
                    cells.append(f"refused ({str(e)[:60]})")
            print(f"| {name} | " + " | ".join(cells) + " |")
        finally:
            backend.shutdown()


if __name__ == "__main__":
    main()
