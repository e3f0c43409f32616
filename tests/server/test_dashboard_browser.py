"""The dashboard in a real browser (headless Chromium over CDP, `cdp_browser`): on a server without
an API key the page is live as it opens, no click; on one with a key it loads open and empty,
asks for the key only after the server's 401, the key typed once brings the data in, and after a few shared-prefix requests
the numbers change and the tree shows the shared prefix with its token count; selecting a running
request highlights its cached prefix; a traced program's calls appear on the timeline. A screenshot is saved under tests/artifacts/.

Nothing here waits for a time: each wait is for a condition in the page (deadlines only guard
against hangs)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cdp_browser import CHROMIUM, Browser
from conftest import ServerHandle, running_server

import radixlm as rl

KEY = "dashboard-key-5f2"
AUTH = {"Authorization": f"Bearer {KEY}"}
SHARED = list(range(300, 340))  # the 40 prompt tokens every request starts with
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


LONG_CONTEXT = 16_384  # the running request's room: it runs until the test aborts it


@pytest.fixture(scope="module")
def server(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """The tiny random model with a long context (a request that would outrun the page's polls on
    a fast machine now runs until it is aborted)."""
    from radixlm_testing import save_tiny_model

    model_dir = tmp_path_factory.mktemp("tiny-long-llama")
    save_tiny_model(model_dir, "llama", vocab_size=49152, tokenizer_dir=default_model_dir,
                    max_position_embeddings=LONG_CONTEXT)
    with running_server(model_dir, tmp_path_factory, "dashboard", "--api-key", KEY, "--max-total-tokens",
                        str(LONG_CONTEXT + 1024), "--random-seed", "0") as handle:
        yield handle


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium (make test does)")
    with Browser() as b:
        yield b


def generate(url: str, input_ids: list[int]) -> None:
    resp = httpx.post(f"{url}/generate", headers=AUTH, timeout=120, json={
        "input_ids": input_ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert resp.status_code == 200, resp.text


def stream_long_request(url: str, rid: str, done: threading.Event) -> None:
    """A request with room for the whole context and nothing to end it sooner (no grammar, whose
    end would stop it, EOS ignored): the test aborts it once the page listed it."""
    body = {"input_ids": SHARED + [50, 51], "rid": rid, "stream": True,
            "sampling_params": {"max_new_tokens": LONG_CONTEXT - len(SHARED) - 3, "ignore_eos": True,
                                "temperature": 1.0}}
    try:
        with httpx.stream("POST", f"{url}/generate", headers=AUTH, json=body, timeout=120) as resp:
            assert resp.status_code == 200
            for _ in resp.iter_lines():
                pass
    finally:
        done.set()


CLICK_AND_READ = """(() => {
  const row = document.querySelector('#requests tbody tr[data-rid="%s"]');
  if (!row) return null;
  row.click();  // redraws from the answer that listed the request: no race with the next poll
  return {
    selection: document.getElementById('selection').textContent,
    path: [...document.querySelectorAll('#tree g.node.on-path')].map(g => Number(g.dataset.tokens)),
    lockedOnPath: [...document.querySelectorAll('#tree g.node.on-path')].every(g => g.dataset.locked === 'true'),
  };
})()"""


def click_when_listed(browser: Browser, rid: str, done: threading.Event) -> dict[str, Any] | None:
    """Click the request's row once the page lists it; None if the request ended unlisted."""
    while not done.is_set():  # each look waits for the page's next frame
        seen = browser.evaluate(f"new Promise(r => requestAnimationFrame(() => r({CLICK_AND_READ % rid})))")
        if seen is not None:
            return dict(seen)
    seen = browser.evaluate(CLICK_AND_READ % rid)  # the last answer may list it still
    return None if seen is None else dict(seen)


def test_without_an_api_key_the_dashboard_connects_by_itself(tiny_server: ServerHandle, browser: Browser) -> None:
    browser.goto(f"{tiny_server.url}/dashboard?poll_ms=100")
    browser.wait_for_function("Number(document.body.dataset.polls || 0) >= 2")  # no click: it polls by itself
    assert browser.evaluate("document.getElementById('key-form').hidden") is True  # never asked for a key
    assert browser.evaluate("document.getElementById('status').textContent").startswith("live, ")
    total = httpx.get(f"{tiny_server.url}/cache_tree", timeout=60).json()["pool"]["max_total_num_tokens"]
    assert browser.evaluate("document.getElementById('pool-total').textContent") == f"{total:,}"


def test_the_dashboard_shows_the_shared_prefix_and_live_numbers(server: ServerHandle, browser: Browser) -> None:
    url = server.url
    browser.goto(f"{url}/dashboard?poll_ms=100")
    # it tries without a key, and only the 401 makes it ask for one
    browser.wait_for_function("!document.getElementById('key-form').hidden")
    assert browser.evaluate("document.getElementById('status').textContent") == "this server needs an API key"
    assert browser.evaluate("document.getElementById('tree-total').textContent") == "-"  # the shell holds no data
    assert "polls" not in browser.evaluate("Object.keys(document.body.dataset)")
    browser.evaluate(f"document.getElementById('api-key').value = {json.dumps(KEY)};"
                     "document.getElementById('key-form').requestSubmit()")
    browser.wait_for_function("Number(document.body.dataset.polls || 0) >= 1")
    assert browser.evaluate("document.getElementById('api-key').value") == ""  # kept in page memory only
    assert browser.evaluate("document.getElementById('tree-total').textContent") == "0"
    for suffix in ([5, 6, 7], [8, 9, 10], [11, 12, 13]):
        generate(url, SHARED + suffix)
    # the numbers change: the tree's total, the hit rate, and a root node of exactly the shared prefix
    # (unlocked: a picture taken after the last request finished)
    shared_row = f"document.querySelector('#tree g.node[data-tokens=\"{len(SHARED)}\"][data-locked=\"false\"]')"
    browser.wait_for_function(f"document.getElementById('tree-total').textContent !== '0' && {shared_row} !== null"
                              " && document.getElementById('hit-rate').textContent !== '0.0%'")
    tree = httpx.get(f"{url}/cache_tree", headers=AUTH, timeout=60).json()["tree"]
    (shared,) = [n for n in tree["nodes"] if n["parent"] is None]
    assert shared["num_tokens"] == len(SHARED)
    assert browser.evaluate(f"{shared_row}.dataset.label") == shared["label"]
    shown = browser.evaluate(f"{shared_row}.querySelector('text.label').textContent")
    assert shown.startswith(json.dumps(shared["label"]) + f"{len(SHARED)} tok · lock 0"), shown
    polls = browser.evaluate("Number(document.body.dataset.polls)")
    browser.wait_for_function(f"Number(document.body.dataset.polls) > {polls}")  # it keeps polling

    # a running request: its row, when selected, highlights its cached prefix (locked while it runs)
    rid, done = "dash-browser", threading.Event()
    thread = threading.Thread(target=stream_long_request, args=(url, rid, done), daemon=True)
    thread.start()
    try:
        seen = click_when_listed(browser, rid, done)
    finally:
        httpx.post(f"{url}/abort_request", headers=AUTH, json={"rid": rid}, timeout=60)
        thread.join(timeout=120)
    assert seen is not None, "the long request never showed in the page"
    assert seen["path"][0] == len(SHARED) and seen["lockedOnPath"], seen
    assert seen["selection"].startswith(f"{rid}: ") and f"of {len(SHARED) + 2} prompt tokens cached" in seen["selection"]

    # a traced program's calls, sent by the language, appear on the timeline
    endpoint = rl.RuntimeEndpoint(url, api_key=KEY)

    @rl.function
    def two_answers(s: Any) -> None:
        s += "A shared preamble for both questions. " * 4
        s += "Q1:" + rl.gen("a1", max_tokens=3, temperature=0)
        s += "Q2:" + rl.gen("a2", max_tokens=3, temperature=0)

    assert endpoint.send_trace(two_answers.run(backend=endpoint, trace=True).trace()) == 2
    names = browser.wait_for_function(
        "(() => { const n = [...document.querySelectorAll('#traces rect.call')].map(r => r.dataset.name);"
        " return n.includes('a2') && n; })()")
    assert names[-2:] == ["a1", "a2"]
    browser.screenshot(ARTIFACTS / "dashboard.png")
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000
