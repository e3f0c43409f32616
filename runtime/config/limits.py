"""Every bound the server puts on one request, in one place (docs/http-api.md's "Limits" lists
the same values). A request over a limit is refused before any work is queued: HTTP 413 for the
body size, 400 naming the field and the limit for everything else.

Why each exists: the body, JSON nesting, batch, `n`, stop strings and ids bound the memory and
work one request can claim; the grammar bounds keep a regex or JSON schema from compiling for
minutes or exhausting memory (a compile that still runs past the deadline is killed).
"""

from __future__ import annotations

# ---------------------------------------------------------------- the HTTP body
MAX_BODY_BYTES = 32 * 1024 * 1024  # larger bodies get 413
MAX_JSON_DEPTH = 128  # nesting of arrays / objects in a body

# ---------------------------------------------------------------- prompts and copies
MAX_BATCH = 1024  # prompts in one /generate or /v1/completions request
MAX_N = 64  # copies of one prompt (`n`)
MAX_SEQUENCES = 1024  # prompts x n in one request
MAX_RID_CHARS = 256  # a client-chosen request id

# ---------------------------------------------------------------- sampling parameters
MAX_STOP_STRINGS = 32
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 256
MAX_TOP_LOGPROBS_NUM = 100  # native `top_logprobs_num`
MAX_OPENAI_TOP_LOGPROBS = 20  # OpenAI `logprobs` (completions) / `top_logprobs` (chat)
# (prompt tokens + max_new_tokens must fit the context length: checked against the model's)

# ---------------------------------------------------------------- grammars (regex, JSON schema)
MAX_REGEX_CHARS = 64 * 1024  # a regex as the client sends it
# Positions of a regex with counted repetitions multiplied out (`a{1000}` counts 1000): a token
# index has roughly one state per position, and each state costs milliseconds to build.
MAX_REGEX_POSITIONS = 20_000
# A JSON schema as JSON text (real configuration formats' schemas reach 1-3 MB), and once rewritten
# for the engines (`constrained.schema_rewrite` inlines references): the context-free engines'
# grammars, and so their compile memory, grow linearly with it; the outlines engine's regex is
# bounded apart (MAX_SCHEMA_REGEX_CHARS).
MAX_SCHEMA_CHARS = 4 * 1024 * 1024
MAX_REWRITTEN_SCHEMA_CHARS = 8 * 1024 * 1024
MAX_SCHEMA_DEPTH = 64  # nesting of a JSON schema document
MAX_EBNF_CHARS = 256 * 1024  # an `ebnf` grammar's text (xgrammar / llguidance)
MAX_SCHEMA_BOUND = 10**30  # |minimum|, |maximum| (their range regexes grow with the digits)
# The regex a JSON schema turns into (estimated before it is built: optional properties and array
# items are repeated in it, so nesting multiplies its size).
MAX_SCHEMA_REGEX_CHARS = 1_000_000
# A token index still building after this long is killed and its request refused (400).
# Override with RADIXLM_GRAMMAR_COMPILE_TIMEOUT (seconds).
GRAMMAR_COMPILE_TIMEOUT_S = 60.0
GRAMMAR_COMPILE_MAX_MEMORY_BYTES = 4 * 1024**3  # address space of the index-building process


def json_depth(value: object, limit: int) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, `[]` is 1), or `limit + 1` as soon as
    it is deeper than `limit`. Iterative, so safe on values nested past Python's recursion limit."""
    stack = [(value, 0)]
    deepest = 0
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        depth += 1
        if depth > limit:
            return limit + 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children if isinstance(child, (dict, list)))
    return deepest

# ---------------------------------------------------------------- the dashboard
MAX_CACHE_TREE_NODES = 1000  # `max_nodes` of GET /cache_tree
DEFAULT_CACHE_TREE_NODES = 200
MAX_TRACE_CALLS_PER_POST = 256  # entries of one POST /traces (the language sends larger traces in parts)
TRACE_CALLS_KEPT = 2000  # the server keeps the newest this many (GET /traces `max_entries` at most this)
