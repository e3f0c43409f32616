"""References into the middle of a schema, made references to definitions (`hoist_deep_refs`).

A `$ref` may name any JSON pointer (`#/definitions/step/oneOf/1/properties/run`,
`#/properties/orbs`). The rewrite restructures schemas (a `oneOf` becomes `anyOf`, a parent's
properties move into its branches), so such a path may not exist in its output. Before the
rewrite, each target that is not a whole definition (`#/$defs/x`, `#/definitions/x`) or the root
is copied, as it was sent, into a definition of its own, and the references to it point there:
exact (the same schema under another name), and the copy is rewritten like any definition.
"""

from __future__ import annotations

import copy
from typing import Any

from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.json_schema import resolve_pointer

Schema = dict[str, Any]
_DEF_KEYS = ("$defs", "definitions")
MAX_HOISTED = 10_000  # distinct deep targets copied, per schema


def is_deep(ref: str) -> bool:
    """A local reference to something other than the root or a whole definition."""
    if not ref.startswith("#") or ref in ("#", "#/"):
        return False
    parts = ref[1:].lstrip("/").split("/")
    return not (len(parts) == 2 and parts[0] in _DEF_KEYS)


def hoist_deep_refs(root: Schema) -> Schema:
    """`root` (changed in place and returned) with every deep local reference (`is_deep`) pointing
    at a new definition holding a copy of its target as sent; unresolvable ones are left alone."""
    key = "definitions" if isinstance(root.get("definitions"), dict) else "$defs"
    ref_to_name: dict[str, str] = {}
    pending: list[object] = [root]
    new_defs: dict[str, object] = {}
    while pending:
        stack = [pending.pop()]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                stack.extend(item)
                continue
            if not isinstance(item, dict):
                continue
            ref = item.get("$ref")
            if isinstance(ref, str) and is_deep(ref):
                if ref not in ref_to_name:
                    try:
                        target = resolve_pointer(root, ref)
                    except GrammarError:
                        target = None
                    if target is not None:
                        if len(ref_to_name) >= MAX_HOISTED:
                            raise GrammarError(f"json_schema has too many references into its parts (over {MAX_HOISTED})")
                        name = f"hoisted:{len(ref_to_name)}"
                        ref_to_name[ref] = name
                        new_defs[name] = copy.deepcopy(target)
                        pending.append(new_defs[name])
                if ref in ref_to_name:
                    item["$ref"] = f"#/{key}/{ref_to_name[ref]}"
            stack.extend(v for k, v in item.items() if k not in ("enum", "const", "default", "examples"))
    if new_defs:
        root[key] = {**(root.get(key) or {}), **new_defs}
    return root
