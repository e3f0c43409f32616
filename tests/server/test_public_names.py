"""The public names, pinned (issue 36, point 2: one name per concept across code, flags, JSON and
docs, SGLang's spelling where it has one): the flags, the keys of /get_server_info (the Engine's
too), of meta_info and of /cache_tree, read from the real server on the tiny model. A rename
fails here until this file, and docs/http-api.md, say so.

Renamed fields are still sent under their old names for one release; each such alias holds the
value of the field it was renamed to, is marked deprecated in /openapi.json and is listed in
docs/http-api.md."""

from __future__ import annotations

import argparse
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from conftest import ServerHandle

from radixlm.runtime.config.server_args import SECRET_FIELDS, ServerArgs, add_cli_args

DOCS = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"
WAIT_GUARD_S = 120  # a failure guard, not a speed check

FLAGS = [  # SGLang's names, one per ServerArgs field
    "--model-path", "--tokenizer-path", "--dtype", "--quantization", "--quantized-activations", "--device",
    "--attention-backend", "--context-length", "--max-total-tokens", "--mem-fraction-static",
    "--max-running-requests", "--chunked-prefill-size", "--schedule-policy", "--disable-radix-cache",
    "--disable-jump-forward", "--constrained-json-whitespace-pattern", "--grammar-backend", "--grammar-compile-memory-mb",
    "--disable-cpu-kernels",
    "--disable-adaptive-threads", "--enable-deterministic-inference", "--random-seed",
    "--speculative-algorithm", "--speculative-num-draft-tokens", "--speculative-ngram-min-match-window-size",
    "--speculative-ngram-max-match-window-size", "--speculative-ngram-capacity", "--speculative-draft-model-path", "--log-level", "--host", "--port", "--api-key", "--chat-template",
    "--served-model-name", "--tool-call-parser", "--reasoning-parser", "--response-store-size", "--enable-metrics",
    "--incremental-streaming-output", "--stream-interval", "--timeout-header", "--timeout-body", "--timeout-request",
    "--max-connections",
    "--kv-events-config", "--dp-size", "--load-balance-method", "--tp-size",
]
# /get_server_info: every setting by its field name (a secret as has_<name>), and the state below
SERVER_STATE = {
    "max_total_num_tokens", "kv_pool", "radix_cache", "num_running_reqs", "num_waiting_reqs",
    "num_grammar_queue_reqs", "num_retractions", "tp_worker_pids", "resolved_dtype", "resolved_kv_dtype",
    "quantized_activations_mode", "cpu_isa", "cpu_isa_features",
    # speculative decoding's counts (SGLang's names), there by default: constrained requests draft
    "avg_spec_accept_length", "spec_verify_ct", "spec_num_correct_drafts",
}
SCHEDULER_PROCESS_ONLY = {"scheduler_pid", "dp_rank"}  # the Engine has no scheduler process
KV_POOL = {"free_tokens"}
RADIX_CACHE = {"tree_tokens", "evictable_tokens", "hit_rate", "num_queried_tokens", "num_matched_tokens",
               "num_evicted_tokens"}
META_INFO = {"id", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason", "e2e_latency"}
META_INFO_LOGPROBS = {"input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs"}
CACHE_TREE = {"tree", "pool", "cache", "steps", "server", "num_running_reqs", "num_waiting_reqs", "running", "waiting"}
CACHE_TREE_SECTIONS = {
    "tree": {"nodes", "num_nodes", "tree_tokens", "evictable_tokens", "locked_tokens", "clock", "num_visited"},
    "pool": {"max_total_num_tokens", "free_tokens", "tree_tokens", "used_tokens"},
    "cache": {"num_queried_tokens", "num_matched_tokens", "hit_rate", "num_evicted_tokens"},
    "steps": {"num_forwards", "window_s", "extend_tokens_per_s", "decode_tokens_per_s", "steps_per_s"},
    "server": {"requests_started", "requests_finished", "requests_aborted", "prompt_tokens", "generation_tokens",
               "ttft_sum", "ttft_count", "itl_sum", "itl_count"},
}
TREE_NODE = {"id", "parent", "label", "num_tokens", "lock_ref", "is_locked", "last_access", "num_children",
             "num_hidden_children"}
DASHBOARD_REQ = {"rid", "state", "prompt_head", "prompt_tokens", "cached_tokens", "completion_tokens", "grammar",
                 "matched_node"}

# Deprecated aliases, sent until the next release: (section, old name) -> (section, new name);
# section "" is the top level, "running[]" each running request.
SERVER_INFO_ALIASES = {
    ("kv_pool", "total_tokens"): ("", "max_total_num_tokens"),
    ("radix_cache", "cached_tokens"): ("radix_cache", "tree_tokens"),
    ("radix_cache", "evicted_tokens"): ("radix_cache", "num_evicted_tokens"),
}
CACHE_TREE_ALIASES = {
    ("tree", "total_tokens"): ("tree", "tree_tokens"),
    ("pool", "total_tokens"): ("pool", "max_total_num_tokens"),
    ("pool", "cached_tokens"): ("pool", "tree_tokens"),
    ("cache", "queried_tokens"): ("cache", "num_queried_tokens"),
    ("cache", "matched_tokens"): ("cache", "num_matched_tokens"),
    ("cache", "evicted_tokens"): ("cache", "num_evicted_tokens"),
    ("running[]", "generated_tokens"): ("running[]", "completion_tokens"),
}


def keys(section: dict[str, Any], aliases: dict[tuple[str, str], tuple[str, str]], name: str) -> set[str]:
    """The keys of `section` (called `name`) without its deprecated aliases."""
    return set(section) - {old for (where, old) in aliases if where == name}


def at(doc: dict[str, Any], where: str) -> dict[str, Any]:
    return doc if where == "" else doc[where]


def check_aliases(doc: dict[str, Any], aliases: dict[tuple[str, str], tuple[str, str]]) -> None:
    """Each alias is there, with the value of the field it was renamed to."""
    for (where, old), (new_where, new) in aliases.items():
        if where == "running[]":
            assert doc["running"], "no running request to read the alias from"
            assert all(req[old] == req[new] for req in doc["running"] + doc["waiting"]), (old, new)
        else:
            assert at(doc, where)[old] == at(doc, new_where)[new], (where, old, new_where, new)


def test_the_flags() -> None:
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    assert [a.option_strings[0] for a in parser._actions if a.dest != "help"] == FLAGS
    assert [f.name for f in dataclasses.fields(ServerArgs)] == [f[2:].replace("-", "_") for f in FLAGS]


def test_server_info_keys(tiny_server: ServerHandle, tiny_engine: Any) -> None:
    info = httpx.get(f"{tiny_server.url}/get_server_info", timeout=60).json()
    settings = {f"has_{name}" if name in SECRET_FIELDS else name for name in (f[2:].replace("-", "_") for f in FLAGS)}
    assert keys(info, SERVER_INFO_ALIASES, "") == settings | SERVER_STATE | SCHEDULER_PROCESS_ONLY
    assert keys(info["kv_pool"], SERVER_INFO_ALIASES, "kv_pool") == KV_POOL
    assert keys(info["radix_cache"], SERVER_INFO_ALIASES, "radix_cache") == RADIX_CACHE
    check_aliases(info, SERVER_INFO_ALIASES)
    # the flag as given beside the pool's size in effect, as SGLang shows both
    assert (info["max_total_tokens"], info["max_total_num_tokens"]) == (4096, 4096)
    engine = tiny_engine.get_server_info()  # the same builder, in process
    assert set(engine) == set(info) - SCHEDULER_PROCESS_ONLY
    assert (set(engine["kv_pool"]), set(engine["radix_cache"])) == (set(info["kv_pool"]), set(info["radix_cache"]))


def test_meta_info_keys(tiny_server: ServerHandle, tiny_engine: Any) -> None:
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    plain = httpx.post(f"{tiny_server.url}/generate", json=body, timeout=120).json()
    assert set(plain) == {"text", "output_ids", "meta_info"} and set(plain["meta_info"]) == META_INFO
    logprobs = {**body, "return_logprob": True, "top_logprobs_num": 2}
    with_logprobs = httpx.post(f"{tiny_server.url}/generate", json=logprobs, timeout=120).json()
    assert set(with_logprobs["meta_info"]) == META_INFO | META_INFO_LOGPROBS
    in_process = tiny_engine.generate(prompt="Hello", sampling_params=body["sampling_params"])
    assert set(in_process["meta_info"]) == META_INFO


def state_while_running(url: str, rid: str) -> dict[str, Any] | None:
    """/cache_tree while a long request runs (None if it finished before a picture showed it)."""
    body = {"input_ids": list(range(300, 340)), "rid": rid,
            "sampling_params": {"max_new_tokens": 460, "regex": "[ab]+", "ignore_eos": True, "temperature": 0}}
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(httpx.post, f"{url}/generate", json=body, timeout=120)
        try:
            while not done.done():
                state = httpx.get(f"{url}/cache_tree", timeout=60).json()
                if any(r["rid"] == rid for r in state["running"]):
                    return state
            return None
        finally:
            httpx.post(f"{url}/abort_request", json={"rid": rid}, timeout=60)


def test_cache_tree_keys(tiny_server: ServerHandle) -> None:
    httpx.post(f"{tiny_server.url}/generate", timeout=120,
               json={"input_ids": list(range(300, 345)), "sampling_params": {"max_new_tokens": 2}})
    state = None
    deadline = time.monotonic() + WAIT_GUARD_S
    while state is None and time.monotonic() < deadline:
        state = state_while_running(tiny_server.url, f"names-{time.monotonic()}")
    assert state is not None, "no request showed as running"
    assert set(state) == CACHE_TREE
    for name, want in CACHE_TREE_SECTIONS.items():
        assert keys(state[name], CACHE_TREE_ALIASES, name) == want, name
    assert state["tree"]["nodes"] and all(set(node) == TREE_NODE for node in state["tree"]["nodes"])
    for req in state["running"] + state["waiting"]:
        assert keys(req, CACHE_TREE_ALIASES, "running[]") == DASHBOARD_REQ
    check_aliases(state, CACHE_TREE_ALIASES)


def test_one_name_per_concept_across_answers() -> None:
    """A count that two answers show has one name in both (the sets above)."""
    assert CACHE_TREE_SECTIONS["cache"] <= RADIX_CACHE  # the cache's counters
    assert {"max_total_num_tokens", "tree_tokens"} <= CACHE_TREE_SECTIONS["pool"]  # the pool's size, the tree's
    assert "tree_tokens" in RADIX_CACHE and "max_total_num_tokens" in SERVER_STATE
    assert DASHBOARD_REQ & META_INFO == {"prompt_tokens", "cached_tokens", "completion_tokens"}  # a request's counts


def test_aliases_are_deprecated_in_the_contract_and_listed_in_the_docs(tiny_server: ServerHandle) -> None:
    document = httpx.get(f"{tiny_server.url}/openapi.json", timeout=60).json()
    schemas = document["components"]["schemas"]
    models = {("/get_server_info", "kv_pool"): "KvPoolInfo", ("/get_server_info", "radix_cache"): "RadixCacheInfo",
              ("/cache_tree", "tree"): "CacheTreeView", ("/cache_tree", "pool"): "PoolState",
              ("/cache_tree", "cache"): "CacheCounters", ("/cache_tree", "running[]"): "DashboardReq"}
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith("| `/")]
    for endpoint, aliases in (("/get_server_info", SERVER_INFO_ALIASES), ("/cache_tree", CACHE_TREE_ALIASES)):
        for (where, old), (new_where, new) in aliases.items():
            assert schemas[models[endpoint, where]]["properties"][old].get("deprecated") is True, (endpoint, old)
            old_name = f"{where}.{old}".removeprefix(".")
            new_name = new if where == "running[]" else f"{new_where}.{new}".removeprefix(".")
            assert any(f"| `{endpoint}` |" in row and f"`{old_name}`" in row and f"`{new_name}`" in row
                       for row in rows), (endpoint, old_name, new_name)
