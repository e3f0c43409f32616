"""GET /cache_tree through the real server (tiny model): a shared prefix appears as one node with
its token count, a running request shows its counts, its grammar and the node it matched (locked
while it runs), `max_nodes` bounds the answer and is validated, and /dashboard serves its page
open, with no data in it and nothing from elsewhere."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from conftest import ServerHandle
from radixlm_testing import wait_until

from radixlm.runtime.api.protocol import CacheTree
from radixlm.runtime.config.limits import MAX_CACHE_TREE_NODES

SHARED = list(range(300, 340))  # 40 prompt tokens every request below starts with
SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # a name, not an address the page loads
WAIT_GUARD_S = 120  # a failure guard, not a speed check: the tests wait for events


def external_urls(text: str) -> set[str]:
    return set(re.findall(r"(?:https?:)?//[\w.-]+\.\w+[^\s\"'`)]*", text))


def cache_tree(url: str, **params: Any) -> dict[str, Any]:
    resp = httpx.get(f"{url}/cache_tree", params=params, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    CacheTree.model_validate(resp.json())  # the documented shape, exactly
    return resp.json()


def generate(url: str, input_ids: list[int], **sampling: Any) -> dict[str, Any]:
    resp = httpx.post(f"{url}/generate", timeout=120, json={
        "input_ids": input_ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0, **sampling}})
    assert resp.status_code == 200, resp.text
    return resp.json()


def path_to_root(nodes: dict[int, dict[str, Any]], node_id: int) -> list[dict[str, Any]]:
    path = []
    while node_id is not None:
        path.append(nodes[node_id])
        node_id = nodes[node_id]["parent"]
    return path[::-1]


def test_a_shared_prefix_is_one_node_with_its_token_count(tiny_server: ServerHandle) -> None:
    url = tiny_server.url
    assert httpx.post(f"{url}/flush_cache", timeout=60).status_code == 200
    before = cache_tree(url)
    assert before["tree"]["nodes"] == [] and before["tree"]["tree_tokens"] == 0
    for suffix in ([5, 6, 7], [8, 9, 10], [11, 12, 13]):
        out = generate(url, SHARED + suffix)
    assert out["meta_info"]["cached_tokens"] == len(SHARED)
    state = cache_tree(url)
    tree = state["tree"]
    top = [n for n in tree["nodes"] if n["parent"] is None]
    assert [n["num_tokens"] for n in top] == [len(SHARED)]
    shared = top[0]
    assert shared["num_children"] == 3 and shared["num_hidden_children"] == 0 and not shared["is_locked"]
    assert tree["tree_tokens"] == sum(n["num_tokens"] for n in tree["nodes"]) == tree["evictable_tokens"]
    assert tree["locked_tokens"] == 0 and tree["num_nodes"] == len(tree["nodes"])  # all shown
    pool = state["pool"]
    assert pool["tree_tokens"] == tree["tree_tokens"]
    assert pool["free_tokens"] + pool["tree_tokens"] + pool["used_tokens"] == pool["max_total_num_tokens"]
    assert state["cache"]["num_matched_tokens"] >= 2 * len(SHARED)
    assert state["server"]["ttft_count"] >= 3 and state["steps"]["num_forwards"] >= 3
    assert state["running"] == [] and state["waiting"] == []
    assert len(cache_tree(url, max_nodes=1)["tree"]["nodes"]) == 1


def state_while_running(url: str, rid: str) -> dict[str, Any] | None:
    """Send a long constrained request from another thread and take /cache_tree pictures from the
    moment it is sent until one shows it running (the scheduler answers between its steps); None
    if it finished first (the caller retries). Then the request is aborted. (Pictures taken only
    after streamed chunks arrived came too late: the front delivers chunks behind the scheduler,
    which finished the 460 tokens first.)"""
    body = {"input_ids": SHARED + [20, 21, 22], "rid": rid,
            "sampling_params": {"max_new_tokens": 460, "regex": "[ab]+", "ignore_eos": True, "temperature": 0}}
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(httpx.post, f"{url}/generate", json=body, timeout=120)
        try:
            while not done.done():
                state = cache_tree(url)
                if any(r["rid"] == rid for r in state["running"]):
                    return state
            return None
        finally:
            httpx.post(f"{url}/abort_request", json={"rid": rid}, timeout=60)


def test_a_running_request_shows_its_counts_grammar_and_locked_path(tiny_server: ServerHandle) -> None:
    url = tiny_server.url
    generate(url, SHARED + [20, 21])
    for attempt in range(5):
        state = state_while_running(url, f"dash-running-{attempt}")
        if state is not None:
            break
    assert state is not None, "the request never showed as running"
    (req,) = [r for r in state["running"] if r["rid"] == f"dash-running-{attempt}"]
    assert req["state"] == "running" and req["prompt_tokens"] == len(SHARED) + 3
    assert req["cached_tokens"] >= len(SHARED) + 2 and req["completion_tokens"] >= 1
    assert req["grammar"] == {"kind": "regex", "spec": "[ab]+"}
    nodes = {n["id"]: n for n in state["tree"]["nodes"]}
    path = path_to_root(nodes, req["matched_node"])
    assert path[0]["num_tokens"] == len(SHARED)  # the shared prefix, locked while the request reads it
    assert all(n["is_locked"] and n["lock_ref"] >= 1 for n in path)
    assert state["tree"]["locked_tokens"] >= sum(n["num_tokens"] for n in path)
    # the request was aborted; its lock goes with it
    wait_until(lambda: cache_tree(url)["tree"]["locked_tokens"] == 0, "the aborted request's lock released",
               WAIT_GUARD_S)


@pytest.mark.parametrize("bad", ["0", str(MAX_CACHE_TREE_NODES + 1), "-3", "many", "2.5"])
def test_max_nodes_is_validated(tiny_server: ServerHandle, bad: str) -> None:
    resp = httpx.get(f"{tiny_server.url}/cache_tree", params={"max_nodes": bad}, timeout=60)
    assert resp.status_code == 400 and "max_nodes" in resp.json()["error"]["message"], resp.text


def test_the_dashboard_page_is_open_holds_no_data_and_loads_nothing_from_elsewhere(tiny_server: ServerHandle) -> None:
    url = tiny_server.url
    page = httpx.get(f"{url}/dashboard", timeout=60)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for asset, media in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        resp = httpx.get(f"{url}/dashboard/{asset}", timeout=60)
        assert resp.status_code == 200 and resp.headers["content-type"].startswith(media)
        assert external_urls(resp.text) <= {SVG_NAMESPACE}, resp.text
    assert external_urls(page.text) == set()
    assert 'src="/dashboard/dashboard.js"' in page.text
