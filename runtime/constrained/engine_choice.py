"""Which grammar engine serves a JSON schema: the server's `--grammar-backend` first, then ours.

A schema is first rewritten (`schema_rewrite`: dialects, references, allOf, and stricter forms of
what no engine enforces). Then each engine in `engine_order(preferred)` is tried: it is skipped
when the rewritten schema still uses a keyword it does not enforce exactly (`unenforced`: the
keywords each engine would let an output violate, found by runtime/bench/schema_keywords.py and
checked by tests/runtime/test_schema_engines.py) or when its own lowering refuses the schema;
the first that remains serves it. When none does, the request is refused (GrammarError, HTTP
400) with each engine's reason, which names the keyword. No engine is ever handed a schema
whose output it could let violate the schema.

Fallback order after the preferred engine: llguidance (it refuses, itself, every keyword it does
not implement), xgrammar, outlines.
"""

from __future__ import annotations

import copy
import json
from typing import NamedTuple

from radixlm.runtime.config.limits import MAX_REWRITTEN_SCHEMA_CHARS
from radixlm.runtime.constrained.compile_cache import walk_subschemas
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.schema_notes import note
from radixlm.runtime.constrained.schema_rewrite import NEVER_ENFORCED, rewrite_schema

FALLBACK_ORDER = ("llguidance", "xgrammar", "outlines")

_NEVER = NEVER_ENFORCED  # keywords no engine enforces (the rewrite removes them where it can)
# per engine: keywords it lets outputs violate, beyond _NEVER (llguidance refuses what it lacks)
_ENGINE_UNENFORCED: dict[str, tuple[str, ...]] = {
    "xgrammar": ("allOf", "patternProperties"),
    "llguidance": (),
    "outlines": ("allOf",),
}
# formats each engine enforces (a wrong value of each is refused: runtime/bench/schema_keywords.py);
# no engine knows the calendar, so `date` / `time` / `date-time` reach none: the rewrite turns them
# into patterns (`schema_rewrite.FORMAT_PATTERNS`), and beside another `pattern` they are refused
ENGINE_FORMATS: dict[str, frozenset[str]] = {
    "xgrammar": frozenset({"duration", "email", "hostname", "ipv4", "ipv6", "uri", "uri-reference", "uuid",
                           "json-pointer"}),
    "llguidance": frozenset({"duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid"}),
    "outlines": frozenset({"email", "uri", "uuid"}),
}


# A format an engine does not know, served to it as a pattern of ours whose every match is a valid
# value (stricter): beside the schema's own `pattern` as an `allOf` branch (llguidance intersects
# the two patterns exactly; xgrammar enforces no `allOf` and is skipped, as it is for a pattern
# beside a format). `uri-reference` (RFC 3986 URI-reference, llguidance has no such format): an
# optional scheme, then path characters (unreserved, sub-delims, `/`, percent-escapes) without
# `:` and `@` (so that a first segment is never read as a scheme, nor an authority as userinfo
# with a second `@`), an optional query and fragment of the same characters and `?`. No port,
# no userinfo, no IP literal. Every match is a URI (scheme present: `//` authority, absolute or
# rootless path) or a relative reference (path-noscheme, path-absolute, `//` authority, empty).
_PCHARS = "A-Za-z0-9._~!$&'()*+,;=/"  # (each class below ends with `-`, a literal there)
URI_REFERENCE_PATTERN = (f"^(?:[A-Za-z][A-Za-z0-9+.-]*:)?(?:[{_PCHARS}-]|%[0-9A-Fa-f]{{2}})*"
                         f"(?:\\?(?:[{_PCHARS}?-]|%[0-9A-Fa-f]{{2}})*)?(?:#(?:[{_PCHARS}?-]|%[0-9A-Fa-f]{{2}})*)?$")
FORMAT_FALLBACK_PATTERNS = {"uri-reference": URI_REFERENCE_PATTERN}


def engine_order(preferred: str) -> tuple[str, ...]:
    """The engines tried for a JSON schema, in order: `preferred`, then FALLBACK_ORDER."""
    return (preferred, *(e for e in FALLBACK_ORDER if e != preferred))


def unenforced(engine: str, schema: object) -> str | None:
    """Why `engine` would not enforce `schema` exactly (naming the keyword and where), or None."""
    extra = _ENGINE_UNENFORCED[engine]
    formats = ENGINE_FORMATS[engine]
    for node, path in walk_subschemas(schema):
        for key in (*_NEVER, *extra):
            if key in node:
                return f"does not enforce '{key}' at {path}"
        fmt = node.get("format")
        if isinstance(fmt, str) and fmt not in formats:
            return f"does not enforce format {fmt!r} at {path}"
        if "$ref" in node and len(node) > 1 and engine != "llguidance":
            return f"does not enforce keywords beside '$ref' at {path}"
        if engine == "xgrammar":
            if ("pattern" in node or "format" in node) and ("minLength" in node or "maxLength" in node
                                                             or "pattern" in node and "format" in node):
                return f"does not enforce 'pattern' / 'format' with length bounds or each other at {path}"
            if isinstance(node.get("pattern"), str) and ")?" in node["pattern"]:
                # xgrammar 0.2.8 let `21:47:000Z` through the date-time pattern (an optional group
                # after a character class): patterns with an optional group go elsewhere
                return f"does not enforce a 'pattern' with an optional group at {path}"
            if any(k in node for k in ("anyOf",)) and any(k in node for k in ("properties", "required", "items")):
                return f"does not enforce keywords beside 'anyOf' at {path}"
    return None


def for_engine(engine: str, schema: object) -> object:
    """`schema` with each `format` that `engine` does not enforce but that has a pattern of ours
    (`FORMAT_FALLBACK_PATTERNS`) replaced by it (stricter); `schema` itself when there is none."""
    lacking = {f for f in FORMAT_FALLBACK_PATTERNS if f not in ENGINE_FORMATS[engine]}
    if not any(node.get("format") in lacking for node, _ in walk_subschemas(schema)):
        return schema
    schema = copy.deepcopy(schema)
    for node, _ in walk_subschemas(schema):
        fmt = node.get("format")
        if fmt in lacking:
            note("format")
            del node["format"]
            own = FORMAT_FALLBACK_PATTERNS[fmt]
            if "pattern" in node:
                node["allOf"] = [*node.get("allOf", []), {"pattern": own}]
            else:
                node["pattern"] = own
    return schema


class EngineForm(NamedTuple):
    """A rewritten schema as one engine is given it."""

    text: str  # the schema's text (`for_engine`)
    reason: str | None  # why the engine would not enforce it (`unenforced`); None: it would
    stricter: tuple[str, ...]  # keywords served by a stricter form (`schema_notes`)


def per_engine(schema: object, stricter: tuple[str, ...] = ()) -> dict[str, EngineForm]:
    """Per engine, the (rewritten) schema as it is given it; `stricter`: what the rewrite noted."""
    from radixlm.runtime.constrained.schema_notes import noting

    text = schema_text(schema)
    engine_to_form: dict[str, EngineForm] = {}
    for engine in _ENGINE_UNENFORCED:
        with noting() as noted:
            mine = for_engine(engine, schema)
        engine_to_form[engine] = EngineForm(text if mine is schema else schema_text(mine), unenforced(engine, mine),
                                            (*stricter, *(k for k in noted if k not in stricter)))
    return engine_to_form


def rewritten(spec: object) -> object:
    """The schema of a json_schema spec (a dict, a JSON string, or a boolean), rewritten for the
    engines (`schema_rewrite`); GrammarError if it is not JSON, not a schema, or over the size
    bounds (`json_schema.parse_schema`)."""
    from radixlm.runtime.constrained.json_schema import parse_schema

    if isinstance(spec, bool) or spec in ("true", "false"):
        return spec if isinstance(spec, bool) else spec == "true"
    try:
        schema = rewrite_schema(parse_schema(spec))
    except RecursionError:
        raise GrammarError("json_schema is nested too deeply") from None
    num_chars = len(schema_text(schema))
    if num_chars > MAX_REWRITTEN_SCHEMA_CHARS:
        raise GrammarError(f"json_schema is too large once its references are inlined: {num_chars} characters, "
                           f"the limit is {MAX_REWRITTEN_SCHEMA_CHARS}")
    return schema


def refusal(reasons: list[tuple[str, str]]) -> GrammarError:
    """The error for a schema no engine serves, with each engine's reason."""
    text = "; ".join(f"{engine} {reason}" for engine, reason in reasons)
    return GrammarError(f"unsupported JSON schema: no grammar engine enforces it exactly: {text}")


def schema_text(schema: object) -> str:
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
