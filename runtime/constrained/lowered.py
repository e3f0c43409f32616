"""A request's grammar as the front door lowered it: the form its backend's compile worker
compiles as it is (issue 36: a spec is lowered once).

The door checks a grammar by lowering it (`backends.validate`); the `LoweredGrammar` it gets
travels with the request (`TokenizedGenerateReq.grammar` -> `Req.lowered_grammar`) to the
scheduler's backend (`CompileCache.get_lowered`), which compiles its `form` without lowering the
spec again. A spec that comes without one (`CompileCache.get`) is lowered by the same function in
the compile worker. The form, per backend (`--grammar-backend`):

- outlines: the regex (`spec.spec_to_regex`: a JSON schema's, with the server's JSON whitespace
  pattern; choices' alternation; a regex as given), whose token index the worker builds;
- xgrammar: the `xgr.Grammar` (`xgrammar_backend.xgrammar_grammar`), in xgrammar's own exact
  serialization (`Grammar.serialize_json`), which the worker compiles with
  `GrammarCompiler.compile_grammar`;
- llguidance: the grammar text (`llguidance_backend.grammar_text`), from which each request's
  matcher is built.
"""

from __future__ import annotations

from dataclasses import dataclass

# (name, value) of each backend setting a lowering depends on, e.g. (("whitespace_pattern", None),)
LoweringSettings = tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class LoweredGrammar:
    """The spec of `kind` whose cache key's text is `normalized` (the backend's `normalize`: equal
    specs share one compile, lowered at the door or not), lowered by `backend` to `form` with
    `settings`. Only a backend of that name with those settings compiles it (`get_lowered`).
    `stricter`: for a JSON schema, the keywords the door served by a stricter rewrite, which may
    leave out valid outputs (`schema_notes`; reported as `meta_info.schema_stricter`).
    `unique_items`: for a JSON schema with `uniqueItems: true`, the schema as sent (its JSON text),
    whose unique arrays the request's grammar state keeps unique at sampling time (`unique_items`);
    "" for any other grammar."""

    backend: str
    kind: str
    normalized: str
    form: str
    settings: LoweringSettings = ()
    stricter: tuple[str, ...] = ()
    unique_items: str = ""
