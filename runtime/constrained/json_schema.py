"""JSON schema -> regex: outlines-core's translation, made sound where it would silently not be.

outlines-core's `build_regex_from_schema` ignores several keywords, so its regex could match JSON
that violates the schema. Before calling it we:
- lower numeric bounds (`minimum`, `maximum`, `exclusive*`) to range regexes (`numeric_regex`),
  spliced in afterwards through unique string-constant placeholders;
- rewrite string `pattern`s so every match is a valid JSON string body (`regex_syntax`);
- refuse, with a GrammarError naming keyword and location, what it would ignore: the keywords in
  `_IGNORED_KEYWORDS`, `uniqueItems: true`, `pattern`/`format` combined with length bounds, and
  `required` names that `properties` does not declare;
- refuse what it must never be asked: a `$ref` that is not local (`#/...`; nothing is ever fetched
  or read from a file), and schemas over the size bounds of `limits` (text, nesting, and the
  estimated size of the regex, see `schema_size`), before the regex is built.
Finally Unicode `\\d` (in date/time formats) becomes ASCII `[0-9]`, the `time` format's
fraction of a second gets the literal dot outlines-core meant, and the `email` format keeps only
its dot-atom form (see _EMAIL).
"""

from __future__ import annotations

import json
import math
import secrets
from typing import Any

from outlines_core.json_schema import build_regex_from_schema

from radixlm.runtime.config.limits import (
    MAX_SCHEMA_BOUND,
    MAX_SCHEMA_CHARS,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_REGEX_CHARS,
    json_depth,
)
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.numeric_regex import bounded_number_regex
from radixlm.runtime.constrained.regex_syntax import check_regex_size, check_regex_syntax, rewrite_regex
from radixlm.runtime.constrained.schema_size import estimate_regex_chars

_IGNORED_KEYWORDS = (
    "multipleOf", "minProperties", "maxProperties", "patternProperties", "propertyNames",
    "dependentRequired", "dependentSchemas", "dependencies", "contains", "minContains", "maxContains",
)  # fmt: skip
_BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# Where subschemas live: name -> schema maps, single schemas, lists of schemas.
_SCHEMA_MAP_KEYS = ("properties", "$defs", "definitions")
_SCHEMA_KEYS = ("additionalProperties", "items", "not", "if", "then", "else", "additionalItems")
_SCHEMA_LIST_KEYS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
# outlines-core's `time` format spells the fraction of a second `(\\.[0-9]+)?`: a backslash, then
# any character, so its JSON could hold an invalid escape such as `"07:39:34\\*7"`
_TIME_FRACTION_AS_OUTLINES_SPELLS_IT = r':([0-5][0-9])(\\.[0-9]+)?(Z)?"'
_TIME_FRACTION = r':([0-5][0-9])(\.[0-9]+)?(Z)?"'
# outlines-core's `email` format also admits RFC 5322's quoted local part (`"a b"@x.org`) and
# address literals (`a@[IPv6:...]`) spelled with raw `"`, `\` and control characters: inside a JSON
# string that is invalid JSON (`{"value":""a"@b.co"}` matched), and a literal ends only on `]"`, so
# sampled output could run to its length limit. We keep the dot-atom form (local@domain.tld),
# which is JSON-safe and what "email" means in practice.
_EMAIL_AS_OUTLINES_SPELLS_IT = build_regex_from_schema('{"type": "string", "format": "email"}')[1:-1]
_EMAIL = (
    r"[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
)


def parse_schema(spec: object) -> dict[str, Any]:
    """The schema as a dict, from a dict or a JSON string; GrammarError if neither, or if it is
    longer than MAX_SCHEMA_CHARS as JSON text or nested deeper than MAX_SCHEMA_DEPTH."""
    if isinstance(spec, (str, bytes)):
        _check_schema_chars(len(spec))
        try:
            spec = json.loads(spec)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise GrammarError(f"json_schema is not valid JSON: {e}") from None
        except RecursionError:
            raise GrammarError(f"json_schema is nested too deeply (the limit is {MAX_SCHEMA_DEPTH} levels)") from None
    if not isinstance(spec, dict):
        raise GrammarError(f"json_schema must be a JSON object, got {type(spec).__name__}")
    depth = json_depth(spec, MAX_SCHEMA_DEPTH)
    if depth > MAX_SCHEMA_DEPTH:
        raise GrammarError(f"json_schema is nested too deeply (the limit is {MAX_SCHEMA_DEPTH} levels)")
    _check_schema_chars(len(json.dumps(spec)))
    return spec


def _check_schema_chars(num_chars: int) -> None:
    if num_chars > MAX_SCHEMA_CHARS:
        raise GrammarError(f"json_schema is too long: {num_chars} characters, the limit is {MAX_SCHEMA_CHARS}")


def schema_to_regex(schema: dict[str, Any], whitespace_pattern: str | None = None) -> str:
    """The regex of JSON texts valid for `schema`; GrammarError if unsupported or invalid.

    `whitespace_pattern` is the regex allowed between JSON tokens (outlines-core's default `[ ]?`).
    Property order in the output follows the schema's key order.
    """
    placeholders: dict[str, str] = {}
    try:
        lowered = _lower(schema, "#", placeholders, f"radixlm_bound_{secrets.token_hex(6)}_")
    except RecursionError:
        raise GrammarError("json_schema is nested too deeply") from None
    if estimate_regex_chars(lowered, MAX_SCHEMA_REGEX_CHARS, placeholders) > MAX_SCHEMA_REGEX_CHARS:
        raise GrammarError(
            f"json_schema is too complex: its regex would exceed {MAX_SCHEMA_REGEX_CHARS} characters "
            "(nested arrays and objects with many optional properties multiply its size)"
        )
    assert isinstance(lowered, dict)
    unrolled = _unroll_refs(lowered, lowered, {}, "#", [MAX_UNROLLED_SUBSCHEMAS])
    if unrolled is _IMPOSSIBLE:
        raise GrammarError(f"no output of this recursive schema nests at most {MAX_REF_EXPANSIONS} "
                           "levels (the outlines backend's bound; xgrammar and llguidance serve any depth)")
    try:
        regex = build_regex_from_schema(json.dumps(unrolled), whitespace_pattern)
    except (ValueError, TypeError) as e:
        raise GrammarError(f"unsupported JSON schema: {str(e).splitlines()[0]}") from None
    regex = regex.replace(_TIME_FRACTION_AS_OUTLINES_SPELLS_IT, _TIME_FRACTION)
    regex = regex.replace(_EMAIL_AS_OUTLINES_SPELLS_IT, _EMAIL)
    for name, sub_regex in placeholders.items():
        regex = regex.replace(json.dumps(name), f"(?:{sub_regex})")
    check_regex_size(regex, "the regex of this json_schema", max_chars=MAX_SCHEMA_REGEX_CHARS)
    return rewrite_regex(regex, in_json_string=False)


# Local references are inlined before outlines-core sees the schema (its own unrolling leaves a
# dangling `,` where it stops). A schema reached through the same reference MAX_REF_EXPANSIONS
# times on one path is not expanded again: what needs it is pruned (an optional property is
# dropped, an array of it stays empty, an anyOf / oneOf branch goes), so every output parses
# and a recursive structure nests at most that many levels below where it starts.
MAX_REF_EXPANSIONS = 3
MAX_UNROLLED_SUBSCHEMAS = 20_000  # references fanning out could otherwise multiply without end
_IMPOSSIBLE: Any = object()  # a subschema no output may take (a reference past the bound)


def resolve_pointer(root: dict[str, Any], ref: str, where: str = "") -> object:
    """The subschema a local `$ref` ("#", "#/", "#/$defs/x", any JSON pointer) names; GrammarError
    (saying `where`, e.g. " at #/properties/a") if none."""
    node: object = root
    for part in ref[1:].lstrip("/").split("/") if ref not in ("#", "#/") else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise GrammarError(f"$ref {ref!r}{where} does not name a part of the schema")
    return node


def _unroll_refs(root: dict[str, Any], schema: object, expanded: dict[str, int], path: str,
                 left: list[int]) -> object:
    """`schema` with local references inlined (see MAX_REF_EXPANSIONS; `expanded` counts the
    references taken on the way here), or _IMPOSSIBLE when no output may take it. `left[0]`
    counts down the subschemas it may still produce (GrammarError at 0)."""
    if not isinstance(schema, dict):
        return schema
    left[0] -= 1
    if left[0] < 0:
        raise GrammarError(f"json_schema is too complex: its references expand to more than "
                           f"{MAX_UNROLLED_SUBSCHEMAS} subschemas")
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        if expanded.get(ref, 0) >= MAX_REF_EXPANSIONS:
            return _IMPOSSIBLE
        target = _unroll_refs(root, resolve_pointer(root, ref), {**expanded, ref: expanded.get(ref, 0) + 1}, ref, left)
        rest = _unroll_refs(root, {k: v for k, v in schema.items() if k != "$ref"}, expanded, path, left)
        if target is _IMPOSSIBLE or rest is _IMPOSSIBLE:
            return _IMPOSSIBLE
        return {**target, **rest} if isinstance(target, dict) else target
    out = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}

    def sub(value: object, where: str) -> object:
        return _unroll_refs(root, value, expanded, f"{path}/{where}", left)

    if isinstance(out.get("properties"), dict):
        required = out.get("required", [])
        kept = {}
        for name, value in out["properties"].items():
            lowered = sub(value, f"properties/{name}")
            if lowered is not _IMPOSSIBLE:
                kept[name] = lowered
            elif isinstance(required, list) and name in required:
                return _IMPOSSIBLE
        out["properties"] = kept
    if isinstance(out.get("items"), dict):
        items = sub(out["items"], "items")
        if items is _IMPOSSIBLE:
            if out.get("minItems", 0) > 0:
                return _IMPOSSIBLE
            del out["items"]
            out["maxItems"] = 0
        else:
            out["items"] = items
    if isinstance(out.get("prefixItems"), list):
        prefix = [sub(value, f"prefixItems/{i}") for i, value in enumerate(out["prefixItems"])]
        if _IMPOSSIBLE in prefix:
            first = prefix.index(_IMPOSSIBLE)
            if out.get("minItems", 0) > first:
                return _IMPOSSIBLE
            prefix, out["maxItems"] = prefix[:first], first
        out["prefixItems"] = prefix
    if isinstance(out.get("additionalProperties"), dict):
        extra = sub(out["additionalProperties"], "additionalProperties")
        out["additionalProperties"] = False if extra is _IMPOSSIBLE else extra
    for key in ("anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            branches = [sub(value, f"{key}/{i}") for i, value in enumerate(out[key])]
            out[key] = [branch for branch in branches if branch is not _IMPOSSIBLE]
            if not out[key]:
                return _IMPOSSIBLE
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [sub(value, f"allOf/{i}") for i, value in enumerate(out["allOf"])]
        if _IMPOSSIBLE in out["allOf"]:
            return _IMPOSSIBLE
    for key in ("not", "if", "then", "else", "additionalItems"):
        if isinstance(out.get(key), dict):
            out[key] = sub(out[key], key)
            if out[key] is _IMPOSSIBLE:
                raise GrammarError(f"the recursion under {key!r} at {path} is deeper than "
                                   f"{MAX_REF_EXPANSIONS} levels (the outlines backend's bound)")
    return out


def _lower(schema: object, path: str, placeholders: dict[str, str], prefix: str) -> object:
    """A copy of `schema` with its subschemas lowered, checked, and bounds replaced by placeholders."""
    if not isinstance(schema, dict):
        return schema
    _check_supported(schema, path)
    out = dict(schema)
    for key in _SCHEMA_MAP_KEYS:
        if isinstance(out.get(key), dict):
            out[key] = {n: _lower(s, f"{path}/{key}/{n}", placeholders, prefix) for n, s in out[key].items()}
    for key in _SCHEMA_KEYS:
        if isinstance(out.get(key), dict):
            out[key] = _lower(out[key], f"{path}/{key}", placeholders, prefix)
    for key in _SCHEMA_LIST_KEYS:
        if isinstance(out.get(key), list):
            out[key] = [_lower(s, f"{path}/{key}/{i}", placeholders, prefix) for i, s in enumerate(out[key])]
    if "pattern" in out:
        pattern = check_regex_syntax(out["pattern"], what=f"pattern at {path}")
        out["pattern"] = rewrite_regex(pattern, in_json_string=True)
    return _lower_bounds(out, path, placeholders, prefix)


def _check_supported(schema: dict[str, Any], path: str) -> None:
    """GrammarError for keywords outlines-core would silently ignore (outputs could then be invalid),
    and for references to anything but this schema (they are never fetched)."""
    ref = schema.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
        raise GrammarError(
            f"unsupported $ref {ref!r} at {path}: only references within the schema ('#/...') are "
            "supported; nothing is fetched from URLs or files"
        )
    for key in _IGNORED_KEYWORDS:
        if key in schema:
            raise GrammarError(f"unsupported JSON schema keyword {key!r} at {path}")
    if schema.get("uniqueItems") is True:
        raise GrammarError(f"unsupported JSON schema keyword 'uniqueItems' at {path}")
    if ("pattern" in schema or "format" in schema) and ("minLength" in schema or "maxLength" in schema):
        raise GrammarError(
            f"unsupported JSON schema at {path}: 'pattern'/'format' with 'minLength'/'maxLength'"
        )
    required = schema.get("required", [])
    declared = schema.get("properties", {})
    if isinstance(required, list) and isinstance(declared, dict):
        for name in required:
            if name not in declared:
                raise GrammarError(f"required property {name!r} at {path} is not declared in 'properties'")


def _lower_bounds(schema: dict[str, Any], path: str, placeholders: dict[str, str], prefix: str) -> object:
    """`schema` itself, or, if it is a bounded number, a placeholder constant for its range regex."""
    if not any(key in schema for key in _BOUND_KEYWORDS) or "enum" in schema or "const" in schema:
        return schema
    types = schema.get("type")
    type_list = types if isinstance(types, list) else [types]
    numeric = [t for t in type_list if t in ("integer", "number")]
    if types is None:
        raise GrammarError(f'numeric bounds at {path} need "type": "integer" or "number"')
    if not numeric:
        return schema  # bounds apply to numbers only
    low, high, is_low_exclusive, is_high_exclusive = _bounds(schema, path)
    regex = bounded_number_regex(
        low,
        high,
        exclusive_min=is_low_exclusive,
        exclusive_max=is_high_exclusive,
        is_integer="number" not in numeric,
    )
    if regex is None:
        raise GrammarError(f"the numeric bounds at {path} admit no value")
    name = f"{prefix}{len(placeholders)}"
    placeholders[name] = regex
    others = [t for t in type_list if t not in ("integer", "number")]
    if not others:
        return {"const": name}
    rest = {k: v for k, v in schema.items() if k not in _BOUND_KEYWORDS}
    rest["type"] = others if len(others) > 1 else others[0]
    return {"anyOf": [{"const": name}, rest]}


def _bounds(schema: dict[str, Any], path: str) -> tuple[float | None, float | None, bool, bool]:
    """(minimum, maximum, is_minimum_exclusive, is_maximum_exclusive), the tighter bound winning.

    Accepts both draft-6+ numeric `exclusive*` and draft-4 boolean flags on `minimum`/`maximum`.
    """

    def number(key: str) -> float | None:
        value = schema.get(key)
        if value is None or isinstance(value, bool) and key.startswith("exclusive"):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GrammarError(f"{key!r} at {path} must be a finite number")
        if isinstance(value, float) and not math.isfinite(value) or abs(value) > MAX_SCHEMA_BOUND:
            raise GrammarError(f"{key!r} at {path} must be a finite number within +-1e30")
        return value

    low, high = number("minimum"), number("maximum")
    is_low_exclusive = schema.get("exclusiveMinimum") is True and low is not None
    is_high_exclusive = schema.get("exclusiveMaximum") is True and high is not None
    exclusive_low, exclusive_high = number("exclusiveMinimum"), number("exclusiveMaximum")
    if exclusive_low is not None and (low is None or exclusive_low >= low):
        low, is_low_exclusive = exclusive_low, True
    if exclusive_high is not None and (high is None or exclusive_high <= high):
        high, is_high_exclusive = exclusive_high, True
    return low, high, is_low_exclusive, is_high_exclusive
