"""The rewrites that serve what no engine enforces (`not`, overlapping `oneOf`, `format: regex`,
`propertyNames`, `unevaluatedProperties`, `maxProperties: 1`, references into a schema's middle):
each is exact or stricter. Per case: every probe the rewritten schema accepts is accepted by the
schema as sent (`jsonschema`, format checker on), some probe is accepted, the door serves it, and
outputs generated on the tiny random model (an in-process Engine, temperature 1.0) validate under
the schema as sent. Refusals still name the keyword where no form exists."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import FormatChecker
from jsonschema.validators import validator_for

from radixlm.runtime.constrained.backends import validate
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.schema_disjoint import disjoint
from radixlm.runtime.constrained.schema_regex_chars import pattern_avoiding, required_chars
from radixlm.runtime.constrained.schema_rewrite import rewrite_schema

_CLOSED = {"type": "object", "additionalProperties": False}
# (name, schema as sent, probes: instances some of which it accepts and some it rejects)
CASES: list[tuple[str, dict[str, Any], list[object]]] = [
    ("oneOf: each requires its own key", {
        "type": "object", "properties": {"gcp": {"type": "string"}, "aws": {"type": "string"}},
        "oneOf": [{"required": ["gcp"]}, {"required": ["aws"]}]},
     [{}, {"gcp": "a"}, {"aws": "b"}, {"gcp": "a", "aws": "b"}, "s"]),
    ("oneOf: one branch within the other", {"oneOf": [
        {**_CLOSED, "properties": {"paths": {"type": "array"}, "project": {"type": "string"}}, "required": ["paths"]},
        {**_CLOSED, "properties": {"paths": {"type": "array"}, "project": {"type": "string"}},
         "required": ["project", "paths"]}]},
     [{"paths": []}, {"paths": [], "project": "p"}, {"project": "p"}, {}]),
    ("oneOf: constants, and a catch-all that excludes them", {"type": "object", "required": ["provider"], "oneOf": [
        {"properties": {"provider": {"const": "npm"}, "email": {"type": "string"}}, "required": ["email"]},
        {"properties": {"provider": {"const": "s3"}}},
        {"properties": {"provider": {"type": "string", "not": {"enum": ["npm", "s3"]}}}}]},
     [{"provider": "npm", "email": "e"}, {"provider": "npm"}, {"provider": "s3"}, {"provider": "x"}, {}]),
    ("oneOf: a required value, or any other value (a not)", {
        "type": "object", "properties": {"when": {"type": "string"}, "start_in": {"type": "string"}},
        "oneOf": [{"properties": {"when": {"enum": ["delayed"]}}, "required": ["when", "start_in"]},
                  {"properties": {"when": {"not": {"enum": ["delayed"]}}}}]},
     [{"when": "delayed", "start_in": "1h"}, {"when": "delayed"}, {"when": "manual"}, {}]),
    ("oneOf: enum members", {"oneOf": [{"const": "always"}, {"const": "never"}, {"enum": ["never", "soon"]}]},
     ["always", "never", "soon", "other"]),
    ("oneOf: branches that forbid properties (not required)", {  # GitHub actions' composite steps
        **_CLOSED, "properties": {"run": {"type": "string"}, "shell": {"type": "string"}, "uses": {"type": "string"}},
        "oneOf": [{"anyOf": [{"not": {"properties": {"run": True}, "required": ["run"]}},
                             {"not": {"properties": {"shell": True}, "required": ["shell"]}}]},
                  {"not": {"properties": {"uses": True}, "required": ["uses"]}}]},
     [{"uses": "u"}, {"run": "r", "shell": "s"}, {"run": "r"}, {}, {"run": "r", "shell": "s", "uses": "u"},
      {"run": "r", "uses": "u"}]),
    ("not: required names", {"type": "object", "properties": {"func": {"type": "string"}, "step": {"type": "string"}},
                             "not": {"required": ["func", "step"]}},
     [{}, {"func": "f"}, {"step": "s"}, {"func": "f", "step": "s"}, 3]),
    ("not: anyOf of required", {"type": "object", "not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}},
     [{}, {"a": 1}, {"b": 1}, {"c": 1}]),
    ("not: allOf of required", {"not": {"allOf": [{"required": ["when"]}, {"required": ["unless"]}]}},
     [{}, {"when": 1}, {"unless": 1}, {"when": 1, "unless": 1}, "s"]),
    ("not: pattern beside a pattern", {"type": "string", "maxLength": 20, "pattern": "^[A-Za-z][A-Za-z0-9_]*$",
                                       "not": {"pattern": "^([Bb][Uu][Ii][Ll][Dd][Kk][Ii][Tt][Ee]|[Bb][Kk])"}},
     ["deploy_key", "bk_key", "BuildkiteX", "ab", "_x", "k"]),
    ("not: patterns alone", {"not": {"anyOf": [{"pattern": "\\.\\."}, {"pattern": "@\\{"}]}},
     ["a..b", "a@{b", "a.b", "plain", 3]),
    ("not: type and enum", {"type": ["string", "null"], "enum": ["a", "b", None], "not": {"enum": ["b"]}},
     ["a", "b", None, "c"]),
    ("format: regex", {"type": "object", "properties": {"re": {"type": "string", "format": "regex"},
                                                        "cov": {"type": "string", "format": "regex",
                                                                "pattern": "^/.+/$"}}, "required": ["re", "cov"]},
     [{"re": "abc", "cov": "/x y/"}, {"re": "(", "cov": "/x/"}, {"re": "a", "cov": "/(/"}, {"re": "a", "cov": "x"}]),
    ("propertyNames: a length bound, a string type", {"type": "object", "propertyNames": {"minLength": 2},
                                                      "additionalProperties": {"type": "integer"},
                                                      "properties": {"meta": {"type": "object",
                                                                              "propertyNames": {"type": "string"}}}},
     [{}, {"ab": 1}, {"a": 1}, {"ab": "x"}, {"meta": {"k": 1}}]),
    ("maxProperties 1 over listed keys", {**_CLOSED, "maxProperties": 1, "minProperties": 1, "properties": {
        "run": {"type": "string"}, "checkout": {"type": "boolean"}}},
     [{}, {"run": "x"}, {"checkout": True}, {"run": "x", "checkout": True}, {"other": 1}]),
    ("maxProperties 1, other names allowed", {"type": "object", "maxProperties": 1, "minProperties": 1,
                                              "properties": {"run": {"type": "string"}},
                                              "additionalProperties": {"type": "object"}},
     [{}, {"run": "x"}, {"orb/cmd": {}}, {"run": "x", "orb/cmd": {}}]),
    ("unevaluatedProperties after allOf is merged", {
        "type": "object", "properties": {"a": {"type": "integer"}}, "allOf": [{"properties": {"b": {"type": "string"}}}],
        "unevaluatedProperties": False},
     [{"a": 1}, {"b": "x"}, {"c": 1}, {"a": 1, "b": "x"}]),
    ("a reference into a schema's middle", {
        "type": "object", "properties": {"x": {"type": "object", "properties": {"y": {"type": "integer", "maximum": 9}},
                                               "oneOf": [{"required": ["y"]}, {"required": ["w"]}]},
                                         "z": {"$ref": "#/properties/x/properties/y"}}, "required": ["z"]},
     [{"z": 3}, {"z": 12}, {"z": "s"}, {"x": {"y": 1}, "z": 1}]),
    ("format: date beside a pattern all our dates match", {  # citation-file-format's date
        "type": "string", "format": "date", "pattern": "^[0-9]{4}-(0[1-9]|1[012])-(0[1-9]|[12][0-9]|3[01])$"},
     ["2024-02-28", "2024-02-30", "2024-13-01", "24-01-01", "1999-12-31"]),
    ("listed values joined with a pattern", {
        "type": "object", "properties": {"task": {"anyOf": [{"enum": ["A@1"]}, {"enum": ["B@2"]}]}},
        "required": ["task"], "anyOf": [{"properties": {"task": {"pattern": "^A@1$"}, "a": {"type": "integer"}}},
                                        {"properties": {"task": {"pattern": "^B@2$"}}}]},
     [{"task": "A@1"}, {"task": "B@2"}, {"task": "C@3"}, {"task": "A@1", "a": "s"}]),
    ("if: a discriminator two levels down", {  # GitHub actions: `runs.using == "composite"`
        "type": "object", "required": ["runs"], "properties": {"runs": {"oneOf": [
            {**_CLOSED, "properties": {"using": {"enum": ["node20", "node24"]}, "main": {"type": "string"}},
             "required": ["using", "main"]},
            {**_CLOSED, "properties": {"using": {"const": "composite"}, "steps": {"type": "array"}},
             "required": ["using", "steps"]}]}, "outputs": {}},
        "if": {"properties": {"runs": {"type": "object", "properties": {"using": {"const": "composite"}}}}},
        "then": {"properties": {"outputs": {"type": "object", "required": ["value"]}}},
        "else": {"properties": {"outputs": {"type": "string"}}}},
     [{"runs": {"using": "composite", "steps": []}, "outputs": {"value": 1}},
      {"runs": {"using": "composite", "steps": []}, "outputs": "s"},
      {"runs": {"using": "node20", "main": "m"}, "outputs": "s"},
      {"runs": {"using": "node20", "main": "m"}, "outputs": {"value": 1}}, {"runs": {"using": "x", "main": "m"}}]),
    ("allOf of conditionals on one discriminator", {  # GitHub issue forms: one `if` per item type
        "type": "object", "required": ["type"], "properties": {"type": {"$ref": "#/$defs/type"}},
        "$defs": {"type": {"type": "string", "enum": ["markdown", "input", "upload"]}},
        "allOf": [{"if": {"properties": {"type": {"const": "markdown"}}},
                   "then": {"properties": {"value": {"type": "string"}}, "required": ["value"]}},
                  {"if": {"properties": {"type": {"const": "input"}}},
                   "then": {"properties": {"label": {"type": "string"}}, "required": ["label"]},
                   "else": {"properties": {"label": False}}}]},
     [{"type": "markdown", "value": "v"}, {"type": "markdown"}, {"type": "input", "label": "l"}, {"type": "input"},
      {"type": "upload"}, {"type": "upload", "label": "l"}, {"type": "markdown", "value": "v", "label": "l"}]),
    ("allOf of a conditional that is no discriminator", {  # dependabot: a schedule unless in a group
        "type": "object", "properties": {"schedule": {"type": "string"}, "group": {"type": "string"}},
        "allOf": [{"if": {"not": {"required": ["group"]}}, "then": {"required": ["schedule"]}}]},
     [{"schedule": "s"}, {}, {"group": "g"}, {"group": "g", "schedule": "s"}]),
    ("format: date-time beside a narrower pattern", {  # GitLab CI's released_at
        "type": "string", "format": "date-time", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$"},
     ["2024-01-05T10:00:00Z", "2024-01-05T10:00:00.5Z", "2024-02-30T10:00:00Z", "2024-01-05T10:00:00+01:00"]),
    ("propertyNames: a length bound beside patternProperties", {  # mergify's source files
        "type": "object", "patternProperties": {"^[A-Za-z0-9_-]+$": {"type": "integer"}},
        "propertyNames": {"minLength": 2}},
     [{}, {"ab": 1}, {"a": 1}, {"ab": "x"}, {"a b": 1}]),
]
CASE_IDS = [name for name, _, _ in CASES]


def _errors(schema: object, instance: object) -> list[str]:
    validator = validator_for(schema)
    return [e.message for e in validator(schema, format_checker=FormatChecker()).iter_errors(instance)]


@pytest.mark.parametrize("name,schema,probes", CASES, ids=CASE_IDS)
def test_rewrite_is_exact_or_stricter_and_served(name: str, schema: dict[str, Any], probes: list[object]) -> None:
    rewritten = rewrite_schema(schema)
    accepted = [p for p in probes if not _errors(rewritten, p)]
    assert accepted, (name, rewritten)  # not empty
    for probe in accepted:
        assert not _errors(schema, probe), (name, rewritten, probe)
    assert any(_errors(schema, p) for p in probes), name  # the probes can tell
    validate("xgrammar", "json_schema", schema)  # served (GrammarError names the keyword otherwise)


def test_generated_outputs_validate_under_the_schema_as_sent(tiny_engine: Any) -> None:
    params = [{"json_schema": json.dumps(schema), "max_new_tokens": 96, "temperature": 1.0, "seed": n}
              for n, (_, schema, _) in enumerate(CASES)]
    outs = tiny_engine.generate(prompt=["JSON:"] * len(params), sampling_params=params)
    for out, (name, schema, _) in zip(outs, CASES):
        assert out["meta_info"]["finish_reason"]["type"] in ("stop", "length"), (name, out["meta_info"])
        assert not _errors(schema, json.loads(out["text"])), (name, out["text"])


def test_what_has_no_exact_or_stricter_form_is_refused_naming_it() -> None:
    # two string branches told apart only by patterns that may both match: "exactly one" is unenforceable
    with pytest.raises(GrammarError, match="'oneOf'"):
        validate("xgrammar", "json_schema", {"oneOf": [{"type": "string", "pattern": "^a"},
                                                       {"type": "string", "pattern": "b$"}]})
    with pytest.raises(GrammarError, match="'not'"):  # no character every match holds
        validate("xgrammar", "json_schema", {"type": "string", "not": {"pattern": "^.*$"}})
    with pytest.raises(GrammarError, match="'not'"):
        validate("xgrammar", "json_schema", {"type": "integer", "not": {"const": 3}})
    with pytest.raises(GrammarError, match="no valid value"):  # an `if` on a property that can hold nothing
        validate("xgrammar", "json_schema", {"type": "object", "required": ["k"], "properties": {"k": {"enum": []}},
                                             "if": {"properties": {"k": {"const": "a"}}}, "then": {}})
    # the branch holding an unenforced `not` is left out of an anyOf; if it is the only one, refused
    assert rewrite_schema({"anyOf": [{"type": "integer"}, {"type": "string", "not": {"pattern": ".*"}}]}) == {
        "anyOf": [{"type": "integer"}]}


def test_a_format_beside_a_pattern_is_ours_alone_only_within_it() -> None:
    """`date` beside a pattern that all of our calendar pattern's dates match: ours alone; beside a
    narrower pattern (only 2024), ours as an `allOf` branch, which llguidance intersects; where
    the intersection is empty or llguidance cannot read the pattern, refused naming it."""
    from radixlm.runtime.constrained.schema_regex_within import language_within

    assert language_within("[12][0-9]{3}-[0-9]{2}", "^[0-9]{4}-[0-9]{2}$")
    assert language_within("[12][0-9]{3}-[0-9]{2}", "[0-9]{4}")  # matched anywhere: a whole match is one
    assert not language_within("[12][0-9]{3}-[0-9]{2}", "^2024-[0-9]{2}$")
    assert not language_within("[12][0-9]{3}", "^(?=1)[0-9]{4}$")  # a lookahead: not read, so no
    narrower = {"type": "string", "format": "date", "pattern": "^2024-"}
    assert rewrite_schema(narrower)["allOf"][0]["pattern"].startswith("^[12][0-9]{3}-")
    assert validate("xgrammar", "json_schema", narrower).backend == "llguidance"
    with pytest.raises(GrammarError, match="Unsatisfiable"):  # no date of ours is in year 999
        validate("xgrammar", "json_schema", {"type": "string", "format": "date", "pattern": "^0999-"})
    with pytest.raises(GrammarError, match="'allOf'"):
        validate("xgrammar", "json_schema", {"type": "string", "format": "date", "pattern": "^(?=1)[0-9-]+$"})


def test_uri_reference_is_our_pattern_for_llguidance_only() -> None:
    """llguidance has no `uri-reference`: it gets our pattern (alone, or as an `allOf` branch
    beside the schema's own), every match of which is an RFC 3986 reference; xgrammar, which
    enforces the format, keeps it."""
    import random
    import re

    from radixlm.runtime.constrained.engine_choice import URI_REFERENCE_PATTERN, for_engine

    alone = {"type": "string", "format": "uri-reference"}
    beside = {"type": "string", "format": "uri-reference", "pattern": "\\.ya?ml$"}
    assert for_engine("llguidance", alone) == {"type": "string", "pattern": URI_REFERENCE_PATTERN}
    assert for_engine("llguidance", beside)["allOf"] == [{"pattern": URI_REFERENCE_PATTERN}]
    assert for_engine("xgrammar", alone) is alone
    assert validate("xgrammar", "json_schema", alone).backend == "xgrammar"
    assert validate("llguidance", "json_schema", alone).backend == "llguidance"
    assert validate("xgrammar", "json_schema", beside).backend == "llguidance"
    rng, alphabet, matched = random.Random(0), "aZ09._~/!$&'()*+,;=-%?#:@ F", 0
    for _ in range(3000):
        text = rng.choice(["", "https:", "a+b:", "//", "http://h"]) + "".join(
            rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
        if re.fullmatch(URI_REFERENCE_PATTERN, text):
            matched += 1
            assert not _errors(alone, text), text
    assert matched > 500 and _errors(alone, "a b") and not re.fullmatch(URI_REFERENCE_PATTERN, "a b")


def test_the_door_names_the_keywords_it_served_stricter() -> None:
    """`LoweredGrammar.stricter` (`schema_notes`, reported as `meta_info.schema_stricter`): the
    keywords whose rewrite may leave out valid outputs; nothing where every rewrite is exact."""
    cases = dict((name, schema) for name, schema, _ in CASES)
    assert validate("xgrammar", "json_schema", {"oneOf": [{"type": "string"}, {"type": "integer"}]}).stricter == ()
    assert validate("xgrammar", "json_schema", cases["not: type and enum"]).stricter == ()
    assert validate("xgrammar", "json_schema", cases["if: a discriminator two levels down"]).stricter == ("if",)
    unique = {"type": "array", "uniqueItems": True, "contains": {"type": "integer"}, "items": {"type": "integer"}}
    lowered = validate("xgrammar", "json_schema", unique)  # uniqueItems: kept at sampling time, exactly
    assert lowered.stricter == ("contains",) and json.loads(lowered.unique_items) == unique
    uri = {"type": "string", "format": "uri-reference"}
    assert validate("xgrammar", "json_schema", uri).stricter == ()
    assert validate("llguidance", "json_schema", uri).stricter == ("format",)


def test_disjointness_and_regex_helpers() -> None:
    assert disjoint({"type": "object", "required": ["a"]}, {**_CLOSED, "properties": {"b": {}}})
    assert not disjoint({"required": ["a"]}, {**{"additionalProperties": False}, "properties": {"b": {}}})  # "s" fits
    assert disjoint({"$ref": "#/$defs/s"}, {"type": "integer"}, lambda ref: {"type": "string"})
    assert disjoint({"type": "array", "minItems": 1, "items": {"type": "string"}}, {"type": "array", "items": False})
    assert required_chars("^\\w+://") == {":"} and required_chars("(?i)ab") is None and required_chars(".*") is None
    assert pattern_avoiding("^[^,]+$", {"\n"}) == "^[^\\n,]+$"
    assert pattern_avoiding("^a(b|c)$", {"x"}) is None  # a group: not narrowed


# ---- property-based: random oneOf / not schemas over a small universe of values -------------
_NAMES = ("a", "b", "c")
_VALUES = (0, 1, "x", "y", None)


def _branch_strategy() -> Any:
    from hypothesis import strategies as st

    value_schema = st.one_of(st.just({}), st.builds(lambda v: {"const": v}, st.sampled_from(_VALUES)),
                             st.builds(lambda vs: {"enum": list(vs)}, st.sets(st.sampled_from(_VALUES), min_size=1)),
                             st.builds(lambda v: {"not": {"enum": [v]}}, st.sampled_from(_VALUES)),
                             st.sampled_from([{"type": "integer"}, {"type": "string"}, False]))
    return st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["object", "string", "integer", ["object", "null"]]),
        "required": st.lists(st.sampled_from(_NAMES), unique=True, max_size=2),
        "properties": st.dictionaries(st.sampled_from(_NAMES), value_schema, max_size=3),
        "additionalProperties": st.just(False),
        "not": st.one_of(st.builds(lambda n: {"required": [n]}, st.sampled_from(_NAMES)),
                         st.builds(lambda v: {"enum": [v]}, st.sampled_from(_VALUES))),
    })


def _instances() -> list[object]:
    objects: list[object] = [{}]
    for name in _NAMES:
        objects += [{**o, name: v} for o in objects[:8] for v in _VALUES[:3]]
    return [*objects, *_VALUES]


def test_random_one_of_rewrites_admit_only_valid_values() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    instances = _instances()

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(st.lists(_branch_strategy(), min_size=2, max_size=3),
           st.fixed_dictionaries({}, optional={"type": st.just("object"), "required": st.just(["a"])}))
    def check(branches: list[dict[str, Any]], parent: dict[str, Any]) -> None:
        schema = {**parent, "oneOf": branches}
        try:
            rewritten = rewrite_schema(schema)
        except GrammarError:  # refused (e.g. a required name that additionalProperties false forbids)
            return
        for instance in instances:
            if not _errors(rewritten, instance):
                assert not _errors(schema, instance), (schema, rewritten, instance)

    check()


# ---- property-based: random if / then / else on a discriminator, one or two levels down ----------
_KEYS = ("a", "b", "c")


def _conditional_strategy() -> Any:
    from hypothesis import strategies as st

    keys = st.sets(st.sampled_from(_KEYS), min_size=1).map(sorted)
    leaf = st.one_of(st.builds(lambda ks: {"enum": ks}, keys), st.builds(lambda k: {"const": k}, st.sampled_from(_KEYS)))
    inner = st.builds(lambda u, req: {"type": "object", "properties": {"u": u}, **({"required": ["u"]} if req else {})},
                      leaf, st.booleans())
    own = st.one_of(leaf, inner, st.builds(lambda a, b: {"anyOf": [a, b]}, inner, inner))
    test_leaf = st.one_of(st.builds(lambda k: {"const": k}, st.sampled_from(_KEYS)),
                          st.builds(lambda ks: {"type": "string", "enum": ks}, keys))
    test = st.one_of(test_leaf, st.builds(
        lambda t, typed, req: {**({"type": "object"} if typed else {}), "properties": {"u": t},
                               **({"required": ["u"]} if req else {})}, test_leaf, st.booleans(), st.booleans()))
    cond = st.builds(lambda t, req: {"properties": {"k": t}, **({"required": ["k"]} if req else {})}, test, st.booleans())
    effect = st.sampled_from([{}, {"required": ["v"]}, {"properties": {"v": {"type": "integer"}}},
                              {"properties": {"v": {"type": "string"}}}])
    conditional = st.builds(lambda c, t, e: {"if": c, "then": t, "else": e}, cond, effect, effect)
    return st.builds(lambda k, req, parts, in_all_of, typed: {
        **({"type": "object"} if typed else {}), "properties": {"k": k, "v": {}}, **({"required": ["k"]} if req else {}),
        **({"allOf": parts} if in_all_of else parts[0])}, own, st.booleans(), st.lists(conditional, min_size=1,
                                                                                     max_size=2), st.booleans(),
        st.booleans())


def test_random_conditional_rewrites_admit_only_valid_values() -> None:
    from hypothesis import given, settings

    ks: list[object] = ["a", "b", "c", {"u": "a"}, {"u": "b"}, {}, 1]
    instances: list[object] = [{**({"k": k} if k is not None else {}), **({"v": v} if v is not None else {})}
                               for k in (None, *ks) for v in (None, 1, "s")] + ["s", None]

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(_conditional_strategy())
    def check(schema: dict[str, Any]) -> None:
        try:
            rewritten = rewrite_schema(schema)
        except GrammarError:
            return
        for instance in instances:
            if not _errors(rewritten, instance):
                assert not _errors(schema, instance), (schema, rewritten, instance)

    check()
