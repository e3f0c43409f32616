"""What `GET /cache_tree` shows of a scheduler: the radix tree (a bounded picture,
`mem_cache.tree_view`), the KV pool, the running and waiting requests with the tree node each one
matched, and the recent step rate. A plain JSON-ready dict (the `CacheTree` model of
`runtime.protocol`), built in the scheduler process, sent in one `CacheTreeResp`.

Bounded whatever the load: at most `max_nodes` tree nodes, MAX_REQS_SHOWN requests per queue
(the counts say how many there are), labels of a few tokens, grammar specs cut to
GRAMMAR_CHARS, and the matched-path walk of each request limited to MAX_PATH_STEPS nodes.

The fields marked "deprecated" are old names of renamed ones (issue 36: one name per concept),
sent beside the new names until the next release (docs/http-api.md lists them); they go together
with their `deprecated` fields in `runtime.protocol`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from radixlm.runtime.mem_cache.tree_view import NodeView, TreeView, shown_ancestor, view_tree
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.scheduler import Scheduler, grammar_spec

MAX_REQS_SHOWN = 64  # per queue
MAX_PATH_STEPS = 256  # nodes walked up from a request's node to find its shown ancestor
GRAMMAR_CHARS = 80
PROMPT_HEAD_TOKENS = 12
RATE_WINDOW_S = 5.0  # the step rate is over the steps that started this long ago or later


def cache_tree_state(sched: Scheduler, max_nodes: int, decode: Callable[[Sequence[int]], str]) -> dict[str, Any]:
    """The dashboard's picture of `sched` (see the module docstring for its bounds)."""
    view = view_tree(sched.cache, max_nodes, lambda ids: decode(list(ids)))
    shown_ids = {node.node_id for node in view.nodes}
    running = [(r, "running") for r in sched.running]
    running += [(sched.chunked_req, "prefilling")] if sched.chunked_req is not None else []
    waiting = [(r, "waiting") for r in sched.waiting] + [(r, "grammar") for r in sched.grammar_waiting]

    def reqs(queue: list[tuple[Req, str]]) -> list[dict[str, Any]]:
        return [_req_state(r, state, shown_ids, decode) for r, state in queue[:MAX_REQS_SHOWN]]

    pool = sched.kv_pool
    cache = sched.cache
    return {
        "tree": tree_dict(view),
        "pool": {
            "max_total_num_tokens": pool.max_total_num_tokens,
            "free_tokens": pool.num_free,
            "tree_tokens": cache.tree_tokens,
            "used_tokens": pool.max_total_num_tokens - pool.num_free - cache.tree_tokens,  # held by running requests
            "total_tokens": pool.max_total_num_tokens, "cached_tokens": cache.tree_tokens,  # deprecated
        },
        "cache": {"num_queried_tokens": cache.num_queried_tokens, "num_matched_tokens": cache.num_matched_tokens,
                  "hit_rate": cache.hit_rate, "num_evicted_tokens": sched.bridge.num_evicted_tokens,
                  # deprecated
                  "queried_tokens": cache.num_queried_tokens, "matched_tokens": cache.num_matched_tokens,
                  "evicted_tokens": sched.bridge.num_evicted_tokens},
        "steps": _step_rate(sched),
        "num_running_reqs": len(running),
        "num_waiting_reqs": len(waiting),
        "running": reqs(running),
        "waiting": reqs(waiting),
    }


def tree_dict(view: TreeView) -> dict[str, Any]:
    return {"nodes": [_node_dict(node) for node in view.nodes], "num_nodes": view.num_nodes,
            "tree_tokens": view.tree_tokens, "evictable_tokens": view.evictable_tokens,
            "locked_tokens": view.locked_tokens, "clock": view.clock, "num_visited": view.num_visited,
            "total_tokens": view.tree_tokens}  # deprecated


def _node_dict(node: NodeView) -> dict[str, Any]:
    return {"id": node.node_id, "parent": node.parent_id, "label": node.label, "num_tokens": node.num_tokens,
            "lock_ref": node.lock_ref, "is_locked": node.is_locked, "last_access": node.last_access,
            "num_children": node.num_children, "num_hidden_children": node.num_hidden_children}


def _req_state(req: Req, state: str, shown_ids: set[int], decode: Callable[[Sequence[int]], str]) -> dict[str, Any]:
    grammar = grammar_spec(req.params)
    return {
        "rid": req.rid,
        "state": state,
        "prompt_head": decode(req.input_ids[:PROMPT_HEAD_TOKENS])[:60],
        "prompt_tokens": len(req.input_ids),
        "cached_tokens": req.cached_tokens,
        "completion_tokens": len(req.output_ids),
        "generated_tokens": len(req.output_ids),  # deprecated
        "grammar": None if grammar is None else {"kind": grammar[0], "spec": str(grammar[1])[:GRAMMAR_CHARS]},
        "matched_node": shown_ancestor(req.last_node, shown_ids, MAX_PATH_STEPS),  # None while waiting
    }


def _step_rate(sched: Scheduler) -> dict[str, Any]:
    """Tokens the scheduler computed per second over the last RATE_WINDOW_S (its step records)."""
    since = time.monotonic() - RATE_WINDOW_S
    num_extend = num_decode = num_steps = 0
    for step in reversed(sched.recent_steps):  # newest first; at most STEP_RECORDS_KEPT
        if step.start < since:
            break
        num_extend += step.num_extend_tokens
        num_decode += step.num_decodes
        num_steps += 1
    return {"num_forwards": sched.num_forwards, "window_s": RATE_WINDOW_S,
            "extend_tokens_per_s": num_extend / RATE_WINDOW_S, "decode_tokens_per_s": num_decode / RATE_WINDOW_S,
            "steps_per_s": num_steps / RATE_WINDOW_S}
