"""JSON schemas as people write them -> the subset every grammar engine reads the same way.

`rewrite_schema(schema)` returns a schema whose valid instances are valid for the input schema
(never more: every rewrite below is exact or *stricter*, so an engine that enforces the result
exactly never produces an output the input schema rejects). What it does, per subschema:

Dialects (draft-04 .. 2020-12), exact:
- draft-04 `id`, `$id`, `$schema`, `$comment` are dropped (nothing is ever fetched);
- boolean `exclusiveMinimum` / `exclusiveMaximum` (draft-04) become the numeric form;
- `items: [...]` / `additionalItems` (draft-04 .. 2019-09) become `prefixItems` / `items`;
- `dependencies` (draft-04 .. 07) becomes `dependentRequired` / `dependentSchemas`;
- a `format` no validator asserts (`ASSERTED_FORMATS`) is an annotation: dropped; `date`, `time`
  and `date-time` become (stricter) `pattern`s (`FORMAT_PATTERNS`), also beside a `pattern` that
  every value of theirs matches (`schema_regex_within`), else an `allOf` branch beside it;
- `unevaluatedProperties` / `unevaluatedItems` beside no applicator are `additionalProperties` / `items`.

Structure, exact:
- a `$ref` into the middle of the schema (not a whole definition) points at a copy of its target
  made a definition first (`schema_refs`); a `$ref` beside annotations only stays a reference;
- a `$ref` with sibling keywords, every `$ref` inside `allOf` and every branch of an `anyOf` /
  `oneOf` that is a `$ref`, is inlined when its target does not lead back to itself (recursive
  references stay references);
- `allOf` branches are merged into their parent (`schema_merge.merge`) where no two keywords
  conflict (properties given as references inlined to merge; listed values with listed values or
  a `pattern` as one `enum`; a pattern that only bans characters with another pattern);
- a parent's keywords are distributed into each `anyOf` / `oneOf` branch (P and (A or B) is
  (P and A) or (P and B));
- `required` names that `properties` does not list get the schema the object gives them
  (`patternProperties` matches, else `additionalProperties`, else `{}`: any value);
- `propertyNames` (`schema_objects`) of `enum` / `const` / `pattern` / length bounds / `not`
  `pattern` becomes properties / patternProperties of a closed object (`{type: string}`: dropped);
- a closed object with `maxProperties: 1` is an `anyOf` of one-property objects;
- `not: {}` is `false`; `not` of `required` names, `enum` / `const` (beside a parent's),
  `type`, and `anyOf` / `allOf` of those (`schema_not`), as positive keywords.

Dropped: `uniqueItems: true`, which the request's grammar state keeps at sampling time against the
schema as sent (`unique_items`; the door gives it the schema as `LoweredGrammar.unique_items`).

Stricter where no engine enforces the keyword (the output stays valid, some valid outputs are
no longer produced; docs/json-schema.md lists them):
- `oneOf` (`schema_oneof`): anyOf of branches each narrowed to share no value with any other
  branch as sent; branches that cannot be, left out;
- `anyOf` branches that still hold a keyword no engine enforces are left out while others remain;
- `not: {pattern}`: strings without a character every match holds (`schema_not`);
- `format: regex`: strings without regex special characters (each a literal regex);
- `unevaluatedProperties` where no applicator is left: `additionalProperties`;
- `dependentRequired` / `dependentSchemas`: the dependents are always required / the schema
  always applies;
- `if` / `then` / `else` (`schema_conditional`): (if and then) or (not-if and else) when `if` is a
  discriminator (one property against constants whose values are listed, or against such a test
  one or more levels down), also for each conditional of an `allOf` in turn; else (if and then);
- `contains` (without `minContains` > 1 / `maxContains`): the first item satisfies it.

What is left (`not`, a `oneOf` not shown disjoint, `allOf` that could not be merged, ...) stays
in the result; `engine_choice` then picks an engine that enforces it or refuses the request
naming the keyword. GrammarError where the schema is malformed in a way a rewrite meets.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Iterator
from typing import Any

from radixlm.runtime.constrained.compile_cache import SCHEMA_MAPS, walk_subschemas
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.json_schema import resolve_pointer
from radixlm.runtime.constrained.schema_conditional import apply_conditional, conditional, is_conditional
from radixlm.runtime.constrained.schema_disjoint import Resolve
from radixlm.runtime.constrained.schema_merge import MergeConflict, both, merge
from radixlm.runtime.constrained.schema_not import without_not
from radixlm.runtime.constrained.schema_notes import note
from radixlm.runtime.constrained.schema_objects import (
    one_property,
    property_names,
    required_outside,
    unevaluated,
)
from radixlm.runtime.constrained.schema_oneof import as_any_of
from radixlm.runtime.constrained.schema_refs import hoist_deep_refs
from radixlm.runtime.constrained.schema_regex_chars import negated_class, pattern_avoiding
from radixlm.runtime.constrained.schema_regex_within import language_within

Schema = dict[str, Any]

# the formats a JSON Schema validator asserts (jsonschema's FormatChecker with its optional
# packages); any other `format` is an annotation only
ASSERTED_FORMATS = frozenset({
    "date", "date-time", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "iri", "iri-reference", "uri-template", "uuid", "regex", "json-pointer",
    "relative-json-pointer", "color",
})  # fmt: skip
ANNOTATIONS = ("$schema", "$id", "$comment", "id")
# every keyword of drafts 04 .. 2020-12; any other key of a schema object is an annotation (e.g.
# Snowplow's `self` block, OpenAPI's `x-*`) that no validator evaluates, and is dropped, so that
# no engine reads its value as a subschema
KEYWORDS = frozenset({
    "$schema", "$id", "$ref", "$defs", "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
    "$recursiveAnchor", "$vocabulary", "$comment", "id", "definitions", "type", "enum", "const", "multipleOf",
    "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems",
    "minItems", "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "dependencies", "properties", "patternProperties", "additionalProperties", "propertyNames",
    "items", "prefixItems", "additionalItems", "contains", "unevaluatedItems", "unevaluatedProperties", "allOf",
    "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "format", "contentEncoding",
    "contentMediaType", "contentSchema", "title", "description", "default", "deprecated", "readOnly", "writeOnly",
    "examples",
})  # fmt: skip
# Dates and times as patterns every engine enforces, stricter than RFC 3339: no engine's own
# `date` knows the calendar (each takes 2023-02-29; outlines' date-time has no offset), so a
# day is 01-28 in every month, 29-30 outside February, 31 in long months (never February 29);
# years 1000-2999; no leap second; the offset required, `T` and `Z` upper case.
_DATE = ("[12][0-9]{3}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)"
         "|(?:0[13578]|1[02])-31)")
_TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
FORMAT_PATTERNS = {"date": _DATE, "time": _TIME, "date-time": f"{_DATE}T{_TIME}"}
_SINGLES = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames",
            "unevaluatedProperties", "unevaluatedItems")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_BRANCH_KEYS = ("anyOf", "oneOf")
_APPLICATORS = ("allOf", "anyOf", "oneOf", "not", "if", "$ref", "dependentSchemas", "dependencies")
# keywords no engine enforces (the rewrite removes them where it can; `engine_choice` refuses the rest)
NEVER_ENFORCED = ("not", "oneOf", "uniqueItems", "if", "then", "else", "dependentRequired", "dependentSchemas",
                  "contains", "minContains", "maxContains", "propertyNames", "unevaluatedProperties",
                  "unevaluatedItems", "dependencies")
# keywords that only annotate: beside a `$ref` they are dropped rather than inlining its target
_REF_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
                              "$comment"})
# a string without these is a regex (ECMA-262 and Python) that matches itself literally
REGEX_SPECIALS = frozenset("\\^$.|?*+()[]{}")
MAX_INLINED = 50_000  # subschemas produced by inlining references, over the whole rewrite


def rewrite_schema(schema: object) -> object:
    """The rewritten schema (see the module docstring); the input is not changed."""
    if not isinstance(schema, dict):
        return schema
    root = hoist_deep_refs(copy.deepcopy(schema))
    # a top-level annotation a reference points into (`#/components/...`) stays: it holds schemas
    pointed_into = {ref[2:].split("/")[0] for ref in refs_in(root) if ref.startswith("#/")}
    root = {k: v for k, v in root.items() if k in KEYWORDS or k in pointed_into}
    rewriter = _Rewriter(root)
    return _prune_definitions(rewriter.node(root, "#", ()))


def _prune_definitions(schema: object) -> object:
    """`schema` without the top-level `$defs` / `definitions` entries no `$ref` reaches any more
    (inlining copied them where they were used)."""
    if not isinstance(schema, dict):
        return schema
    body = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}
    reached: set[str] = set()
    stack = [body]
    while stack:
        for ref in refs_in(stack.pop()):
            for key in ("$defs", "definitions"):
                prefix = f"#/{key}/"
                if ref.startswith(prefix):
                    name = ref[len(prefix):].split("/")[0].replace("~1", "/").replace("~0", "~")
                    defs = schema.get(key)
                    if isinstance(defs, dict) and (key, name) not in reached and name in defs:
                        reached.add((key, name))
                        stack.append(defs[name])
            if ref in ("#", "#/") or not ref.startswith(("#/$defs/", "#/definitions/")):
                return schema  # a reference to the root or elsewhere: keep everything
    for key in ("$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            kept = {n: d for n, d in schema[key].items() if (key, n) in reached}
            if kept:
                body[key] = kept
    return body


class _Rewriter:
    def __init__(self, root: Schema):
        self.root = root
        self.inlined = 0
        self._recursive: dict[str, bool] = {}

    # ---- references -------------------------------------------------------------------------
    def resolve(self, ref: str, path: str) -> object:
        return resolve_pointer(self.root, ref, f" at {path}")

    def is_recursive(self, ref: str, path: str) -> bool:
        """Whether the schema at `ref` reaches `ref` again through references."""
        if ref not in self._recursive:
            seen, stack, found = {ref}, [ref], False
            while stack and not found:
                for sub_ref in refs_in(self.resolve(stack.pop(), path)):
                    if sub_ref == ref:
                        found = True
                        break
                    if sub_ref.startswith("#") and sub_ref not in seen:
                        seen.add(sub_ref)
                        stack.append(sub_ref)
            self._recursive[ref] = found
        return self._recursive[ref]

    def inline(self, node: Schema, path: str, refs: tuple[str, ...]) -> Schema:
        """`node` with its `$ref` replaced by the target merged with the siblings, when the target
        is not recursive; else `node` as it is."""
        ref = node.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#") or ref in refs or self.is_recursive(ref, path):
            return node
        target = self.resolve(ref, path)
        self.inlined += 1
        if self.inlined > MAX_INLINED:
            raise GrammarError(f"json_schema is too large once its references are inlined (over {MAX_INLINED})")
        if target is True or target == {}:
            target = {}
        if not isinstance(target, dict):
            return node
        body = self.node(copy.deepcopy(target), path, (*refs, ref))
        rest = {k: v for k, v in node.items() if k != "$ref"}
        if not rest or not isinstance(body, dict):  # (a target `false` stays false with any siblings)
            return body
        try:
            return merge(body, rest)
        except MergeConflict:
            return {"allOf": [body, rest]}

    # ---- the walk ---------------------------------------------------------------------------
    def node(self, node: object, path: str, refs: tuple[str, ...]) -> object:
        if not isinstance(node, dict):
            return node
        node = _dialect(node)
        if path != "#":  # the root's annotations were dropped by `rewrite_schema`
            node = {k: v for k, v in node.items() if k in KEYWORDS}
        if "$ref" in node and set(node) - {"$ref"} <= _REF_ANNOTATIONS:
            node = {"$ref": node["$ref"]}  # exact, and a large target is not copied once per use
        # as sent: what `not` negates and what `oneOf`'s other branches admit (their rewrites may be stricter)
        raw = {key: node[key] for key in ("not", "oneOf") if key in node}
        conditions = self.conditions_of_all_of(node, path, refs)
        for key in SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                node[key] = {name: self.node(sub, f"{path}/{key}/{name}", refs) for name, sub in node[key].items()}
        for key in _SINGLES:
            if isinstance(node.get(key), dict):
                node[key] = self.node(node[key], f"{path}/{key}", refs)
        for key in _LISTS:
            if isinstance(node.get(key), list):
                node[key] = [self.node(sub, f"{path}/{key}/{i}", refs) for i, sub in enumerate(node[key])]
        if "$ref" in node and len(node) > 1:
            node = self.inline(node, path, refs)
        if isinstance(node.get("allOf"), list):
            node = self.merge_all_of(node, path, refs)
        if isinstance(node.get("oneOf"), list):  # targets inlined, so that `_distribute` sees their types
            node["oneOf"] = [self.inline(b, path, refs) if isinstance(b, dict) else b for b in node["oneOf"]]
        node = _dependents(node)
        if raw.get("not") is True or isinstance(raw.get("not"), dict) and set(raw["not"]) <= _REF_ANNOTATIONS:
            return False  # `not: {}`: no value is valid (a property that must be absent)
        if isinstance(raw.get("not"), dict):
            node = without_not({**node, "not": raw["not"]})
        node = conditional(node, self.resolve_or_none)
        for parts in conditions:
            node = apply_conditional(node, parts, self.resolve_or_none)
        node = property_names(node)
        node = required_outside(node, path)
        node = _arrays(node)
        for key in _BRANCH_KEYS:  # branches that are references show their keywords (not recursive)
            if isinstance(node.get(key), list) and set(node) - {key, "$defs", "definitions"} - _REF_ANNOTATIONS:
                node[key] = [self.inline(b, path, refs) if isinstance(b, dict) else b for b in node[key]]
        node = _distribute(node, raw.get("oneOf"), self.resolve_or_none)
        if isinstance(node.get("anyOf"), list):
            branches = [unevaluated(b) if isinstance(b, dict) else b for b in node["anyOf"]]
            if any(new is not old for new, old in zip(branches, node["anyOf"])):
                note("unevaluatedProperties")  # properties only another branch declares are left out
            node["anyOf"] = branches
        return one_property(unevaluated(node))

    def conditions_of_all_of(self, node: Schema, path: str, refs: tuple[str, ...]) -> list[Schema]:
        """The `allOf` branches of `node` that are conditionals (`schema_conditional.is_conditional`),
        taken out of it, their `if` / `then` / `else` rewritten; applied once `node` is."""
        branches = node.get("allOf")
        if not isinstance(branches, list) or not any(is_conditional(b) for b in branches):
            return []
        kept = [b for b in branches if not is_conditional(b)]
        if kept:
            node["allOf"] = kept
        else:
            del node["allOf"]
        return [{k: self.node(b[k], f"{path}/allOf/{i}/{k}", refs) for k in ("if", "then", "else") if k in b}
                for i, b in enumerate(branches) if is_conditional(b)]

    def resolve_or_none(self, ref: str) -> object:
        try:
            return self.resolve(ref, "#") if ref.startswith("#") else None
        except GrammarError:
            return None

    def merge_all_of(self, node: Schema, path: str, refs: tuple[str, ...]) -> Schema:
        branches = [self.inline(b, path, refs) if isinstance(b, dict) else b for b in node["allOf"]]
        merged: Schema = {k: v for k, v in node.items() if k != "allOf"}
        kept: list[object] = []
        for branch in branches:
            if branch is True or branch == {}:
                continue
            if not isinstance(branch, dict) or "$ref" in branch:
                kept.append(branch)
                continue
            try:
                merged = merge(merged, branch)
            except MergeConflict:
                try:  # a property given as a reference on one side and a schema on the other
                    merged = merge(self.inline_properties(merged, path, refs), self.inline_properties(branch, path, refs))
                except MergeConflict:
                    kept.append(branch)
        if kept:
            merged["allOf"] = kept
        return merged


    def inline_properties(self, node: Schema, path: str, refs: tuple[str, ...]) -> Schema:
        """`node` with each property that is a reference replaced by its target (not recursive)."""
        props = node.get("properties")
        if not isinstance(props, dict) or not any(isinstance(s, dict) and "$ref" in s for s in props.values()):
            return node
        return {**node, "properties": {name: self.inline(sub, path, refs) if isinstance(sub, dict) else sub
                                       for name, sub in props.items()}}


def refs_in(node: object) -> list[str]:
    """Every `$ref` string inside `node` (keyword-blind)."""
    found: list[str] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str):
                found.append(ref)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _dialect(node: Schema) -> Schema:
    """Draft-04 .. 2019-09 spellings in 2020-12's; annotations dropped (see the docstring)."""
    node = {k: v for k, v in node.items() if not (k in ANNOTATIONS and isinstance(v, str))}
    for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(key), bool):
            if node.pop(key) and bound in node:
                node[key] = node.pop(bound)
    if isinstance(node.get("items"), list):
        node["prefixItems"] = node.pop("items")
        if "additionalItems" in node:
            node["items"] = node.pop("additionalItems")
    else:
        node.pop("additionalItems", None)  # ignored without an items array
    deps = node.pop("dependencies", None)
    if isinstance(deps, dict):
        for name, value in deps.items():
            key = "dependentRequired" if isinstance(value, list) else "dependentSchemas"
            node.setdefault(key, {})[name] = value
    if isinstance(node.get("format"), str) and node["format"] not in ASSERTED_FORMATS:
        del node["format"]
    own = FORMAT_PATTERNS.get(node.get("format"))  # type: ignore[arg-type]
    if own is not None:
        note("format")  # (no year 0999, no leap day, the offset required)
        del node["format"]
        if "pattern" not in node or isinstance(node["pattern"], str) and language_within(own, node["pattern"]):
            node["pattern"] = f"^{own}$"  # beside a pattern that every value of ours matches: ours alone
        else:  # both must hold: ours as an allOf branch (llguidance intersects the patterns exactly)
            node["allOf"] = [*node.get("allOf", []), {"pattern": f"^{own}$"}]
    if node.get("format") == "regex":  # stricter: a regex without special characters, a literal
        narrowed = pattern_avoiding(node["pattern"], REGEX_SPECIALS) if isinstance(node.get("pattern"), str) else (
            f"^{negated_class(REGEX_SPECIALS)}*$")
        if narrowed is not None:
            note("format")
            del node["format"]
            node["pattern"] = narrowed
    if node.get("uniqueItems") is False:
        del node["uniqueItems"]
    if not any(k in node for k in _APPLICATORS):  # nothing else evaluates: the plain keyword
        if "unevaluatedProperties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = node.pop("unevaluatedProperties")
        if "unevaluatedItems" in node and "items" not in node:
            node["items"] = node.pop("unevaluatedItems")
    return node


def _dependents(node: Schema) -> Schema:
    """Stricter: dependents always required, dependent schemas always applied."""
    required = node.pop("dependentRequired", None)
    if isinstance(required, dict):
        note("dependentRequired")
        names = list(node.get("required", []))
        for dependents in required.values():
            names.extend(n for n in dependents if isinstance(n, str) and n not in names)
        node["required"] = names
    schemas = node.pop("dependentSchemas", None)
    if isinstance(schemas, dict):
        note("dependentSchemas")
        for sub in schemas.values():
            if sub is False:
                continue  # only forbids its trigger; stricter: the trigger is absent (left to engines)
            if isinstance(sub, dict):
                try:
                    node = merge(node, sub)
                except MergeConflict:
                    node.setdefault("allOf", []).append(sub)
    return node


_UNIQUE_STRICTER: contextvars.ContextVar[bool] = contextvars.ContextVar("unique_stricter", default=False)


@contextlib.contextmanager
def unique_items_stricter() -> Iterator[None]:
    """Inside: `uniqueItems: true` is rewritten as at most one item (stricter), for a schema whose
    output no sampling-time check follows (a structure inside free text: a structural tag)."""
    token = _UNIQUE_STRICTER.set(True)
    try:
        yield
    finally:
        _UNIQUE_STRICTER.reset(token)


def _arrays(node: Schema) -> Schema:
    """uniqueItems dropped (kept at sampling time: `unique_items`; inside `unique_items_stricter`
    at most one item, stricter), contains (the first item), stricter."""
    if node.get("uniqueItems") is True and not _UNIQUE_STRICTER.get():
        del node["uniqueItems"]
    elif node.get("uniqueItems") is True and node.get("minItems", 0) <= 1:
        note("uniqueItems")
        del node["uniqueItems"]
        node["maxItems"] = min(node.get("maxItems", 1), 1)
    contains = node.get("contains")
    if (isinstance(contains, dict) and node.get("minContains", 1) <= 1 and "maxContains" not in node
            and not node.get("prefixItems") and node.get("maxItems", 1) >= 1):
        note("contains")
        del node["contains"]
        node.pop("minContains", None)
        items = node.get("items", {})
        first = both(items, contains) if isinstance(items, dict) else contains
        node["prefixItems"] = [first]
        node["minItems"] = max(node.get("minItems", 0), 1)
    return node


def _distribute(node: Schema, raw_one_of: object, resolve: Resolve) -> Schema:
    """The parent's keywords into each anyOf / oneOf branch; a oneOf as anyOf of branches made
    exclusive (`schema_oneof.as_any_of`); branches that still hold a keyword no engine enforces
    left out (stricter) while others remain."""
    for key in _BRANCH_KEYS:
        branches = node.get(key)
        if not isinstance(branches, list):
            continue
        rest = {k: v for k, v in node.items() if k not in (key, "$defs", "definitions") and k not in _REF_ANNOTATIONS}
        if rest and not any(k in rest for k in _BRANCH_KEYS + ("allOf", "$ref")):
            branches = [both(rest, b) if isinstance(b, dict) else b for b in branches]
            node = {k: v for k, v in node.items() if k in (key, "$defs", "definitions")}
            node[key] = branches
            if key == "oneOf" and isinstance(raw_one_of, list):
                # a value of a branch satisfies the parent: it meets branch j as sent iff it meets both
                raw_one_of = [both(rest, b) if isinstance(b, dict) else b for b in raw_one_of]
        if key == "anyOf":
            servable = [b for b in branches if _is_servable(b)]
            if servable and len(servable) < len(branches):
                note("anyOf")
                node["anyOf"] = servable
        elif "anyOf" not in node and isinstance(raw_one_of, list) and len(raw_one_of) == len(branches):
            # (a oneOf that came in from an inlined or merged schema has no branches as sent here: it stays)
            split = as_any_of(branches, raw_one_of, resolve, _is_servable)
            if split is not None:
                del node["oneOf"]
                node["anyOf"] = split
    return node


def _is_servable(schema: object) -> bool:
    """No keyword left that no engine enforces (`NEVER_ENFORCED`), references not followed."""
    return not any(key in node for node, _ in walk_subschemas(schema) for key in NEVER_ENFORCED)
