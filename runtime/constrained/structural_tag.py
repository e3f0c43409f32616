"""Structural tags (SGLang's `structural_tag`): free text, in which each trigger string opens a
tagged structure whose body is constrained by a JSON schema, then free text again.

The spec, as SGLang's OpenAI `response_format` and native `sampling_params.structural_tag` take it:

    {"type": "structural_tag",            # optional
     "structures": [{"begin": "<tool_call>{\"name\": \"f\", \"arguments\": ",
                     "schema": {...}, "end": "}</tool_call>"}, ...],
     "triggers": ["<tool_call>"]}

Text is free until one of `triggers` appears; from there the output must continue as the `begin`
of a structure that starts with that trigger, a JSON value of its `schema` (laid out as
`json.dumps` does: `", "` and `": "`, no raw control characters in strings), and its `end`.
Served by xgrammar (its `triggered_tags` format) and llguidance (a Lark grammar with a lazy
lexeme per trigger, written here); the outlines backend (a regex DFA) cannot.

`tool_choice="auto"` in the chat API is served with these (`tool_formats.tool_call_structures`):
the trigger is `<tool_call>`, one structure per tool, so once the model opens a call, it is well
formed.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from radixlm.runtime.constrained.errors import GrammarError

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_KEYS = {"type", "structures", "triggers"}
_STRUCTURE_KEYS = {"begin", "schema", "end"}


def normalize_structural_tag(spec: object) -> str:
    """The canonical JSON text of a structural tag (a dict or its JSON text); GrammarError naming
    what is wrong."""
    try:
        tag = json.loads(spec) if isinstance(spec, str) else spec
    except json.JSONDecodeError as e:
        raise GrammarError(f"structural_tag is not valid JSON: {e}") from None
    if not isinstance(tag, dict):
        raise GrammarError("structural_tag must be an object {\"structures\": [...], \"triggers\": [...]}")
    unknown = sorted(set(tag) - _KEYS)
    if unknown:
        raise GrammarError(f"structural_tag has unknown field(s) {unknown}; expected structures and triggers")
    if tag.get("type", "structural_tag") != "structural_tag":
        raise GrammarError(f"structural_tag.type must be 'structural_tag', got {tag['type']!r}")
    triggers, structures = tag.get("triggers"), tag.get("structures")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise GrammarError("structural_tag.triggers must be a non-empty list of non-empty strings")
    if len(set(triggers)) != len(triggers):
        raise GrammarError("structural_tag.triggers lists a trigger twice")
    if not isinstance(structures, list) or not structures:
        raise GrammarError("structural_tag.structures must be a non-empty list of {begin, schema, end}")
    out = []
    for i, structure in enumerate(structures):
        where = f"structural_tag.structures[{i}]"
        if not isinstance(structure, dict):
            raise GrammarError(f"{where} must be an object {{begin, schema, end}}")
        unknown = sorted(set(structure) - _STRUCTURE_KEYS)
        if unknown:
            raise GrammarError(f"{where} has unknown field(s) {unknown}")
        begin, schema, end = structure.get("begin"), structure.get("schema", True), structure.get("end")
        if not isinstance(begin, str) or not isinstance(end, str):
            raise GrammarError(f"{where}.begin and .end must be strings")
        opened_by = [t for t in triggers if begin.startswith(t)]
        if len(opened_by) != 1:
            raise GrammarError(f"{where}.begin {begin!r} must start with exactly one of the triggers {triggers}")
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(f"{where}.schema must be a JSON schema object")
        out.append({"begin": begin, "schema": schema, "end": end})
    for trigger in triggers:
        if not any(s["begin"].startswith(trigger) for s in out):
            raise GrammarError(f"structural_tag trigger {trigger!r} opens no structure (no begin starts with it)")
    return json.dumps({"structures": out, "triggers": triggers}, separators=(",", ":"), ensure_ascii=False)


def xgrammar_format(normalized: str, schema_for_xgrammar: Callable[[str], str]) -> str:
    """xgrammar's structural tag (`triggered_tags`) for a normalized spec. Each schema goes in as
    xgrammar's own EBNF of it in `json.dumps`'s layout, with control characters taken out of every
    negated character class (xgrammar's JSON strings would take them raw; its `excludes` option
    would, but drops maxLength). `schema_for_xgrammar` maps a schema's JSON text to the text
    xgrammar should read (or GrammarError)."""
    import xgrammar as xgr

    tag = json.loads(normalized)
    tags = []
    for s in tag["structures"]:
        grammar = xgr.Grammar.from_json_schema(schema_for_xgrammar(json.dumps(s["schema"])), any_whitespace=False)
        tags.append({"begin": s["begin"], "content": {"type": "grammar", "grammar": _no_raw_controls(str(grammar))},
                     "end": s["end"]})
    return json.dumps({"type": "structural_tag",
                       "format": {"type": "triggered_tags", "triggers": tag["triggers"], "tags": tags}})


def _no_raw_controls(ebnf: str) -> str:
    """`ebnf` with `\\0-\\x1f` added to each negated character class outside string literals."""
    out = []
    i, quoted, in_class = 0, False, False
    while i < len(ebnf):
        c = ebnf[i]
        if c == "\\":
            out.append(ebnf[i:i + 2])
            i += 2
            continue
        if quoted:
            quoted = c != '"'
        elif in_class:
            in_class = c != "]"
        elif c == '"':
            quoted = True
        elif c == "[":
            in_class = True
            if ebnf.startswith("[^", i) and not ebnf.startswith("[^\\0-\\x1f", i):
                out.append("[^\\0-\\x1f")
                i += 2
                continue
        out.append(c)
        i += 1
    return "".join(out)


def lark_grammar(normalized: str) -> str:
    """llguidance's Lark grammar for a normalized spec: any text, and a lazy lexeme per trigger
    that ends at the trigger's first occurrence; the structures it opens follow."""
    tag = json.loads(normalized)
    lines = ["%llguidance {}", "TEXT: /(.|\\n)*/"]
    opened = []
    for i, trigger in enumerate(tag["triggers"]):
        bodies = []
        for j, s in enumerate(tag["structures"]):
            if not s["begin"].startswith(trigger):
                continue
            schema = s["schema"] if isinstance(s["schema"], dict) else ({} if s["schema"] else {"not": {}})
            schema = {**schema, "x-guidance": JSON_LAYOUT}
            rest = s["begin"][len(trigger):]
            parts = [_lark_string(rest)] if rest else []
            parts.append(f"%json {json.dumps(schema, ensure_ascii=False)}")
            if s["end"]:
                parts.append(_lark_string(s["end"]))
            lines.append(f"s{j}: {' '.join(parts)}")
            bodies.append(f"s{j}")
        lines.append(f"t{i}[lazy]: TEXT {_lark_string(trigger)}")
        lines.append(f"tag{i}: t{i} ({' | '.join(bodies)})")
        opened.append(f"tag{i}")
    lines.insert(1, f"start: ({' | '.join(opened)})* TEXT")
    return "\n".join(lines) + "\n"


def _lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
