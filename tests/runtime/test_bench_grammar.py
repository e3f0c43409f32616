"""The grammar bench's schemas (radixlm.runtime.bench.grammar) are what its table says they are:
valid JSON schemas; 4 fields; 20 leaf fields nested in 4 objects; 200 properties; a recursive
`$ref`. (The bench itself prints timings and is run by hand; no timing is asserted.)"""

from __future__ import annotations

from typing import Any

import jsonschema

from radixlm.runtime.bench.grammar import schemas


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
