"""`python -m radixlm.runtime.bench.soak --minutes N [--url URL]`: a soak run against a server (not a test).

For N minutes, C concurrent clients send a mixed load: native /generate streams (free, regex,
prompts sharing long prefixes, long sampled outputs), /v1/chat/completions streams (free,
json_schema), native batches, and clients that abort mid-stream (/abort_request) or drop the
connection. At the end it reports requests served, errors by kind, retractions and evicted
tokens, the server's RSS over time (summed over its process tree, read from /proc) and the KV
pool's free tokens once the cache is flushed (all of it, unless KV leaked). Exit code 1 on any
error or leak. Starts its own server (`radixlm serve` on the default model with a 1,024-token KV
pool; see --server-args) unless --url is given.

The request and outcome types here are also what the server load tests drive.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

ACTIONS = ("complete", "abort", "disconnect")
REGEX = r"[a-z]{2,8}( [a-z]{2,8}){1,4}\."
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["name", "age"],
}


def _facts(colours: tuple[str, ...], animals: tuple[str, ...], places: tuple[str, ...]) -> str:
    """About 150 tokens of made-up facts: a long prefix that many prompts share."""
    return " ".join(f"Fact {i}: the {colours[i % len(colours)]} {animals[i % len(animals)]} lives near the "
                    f"{places[i % len(places)]}." for i in range(12))


PREFIXES = (
    _facts(("red", "blue", "green", "amber"), ("fox", "heron", "otter", "lynx", "crow", "seal"),
           ("river", "hill", "coast", "wood")),
    _facts(("grey", "white", "black", "gold"), ("mole", "wren", "hare", "toad", "newt", "vole"),
           ("lake", "moor", "field", "fen")),
)


@dataclass(frozen=True)
class LoadRequest:
    """One client request: `api` is generate (an SSE stream), chat (an OpenAI SSE stream) or batch
    (a non-streamed /generate over several prompts). `abort` / `disconnect` cut a stream after
    `cut_after` events, by /abort_request (the body needs a `rid`) or by closing the connection."""

    api: str
    body: dict[str, Any]
    action: str = "complete"
    cut_after: int = 2


@dataclass
class Outcome:
    """What a client saw. `kind`: ok, aborted, disconnected, or an error kind (http_<status>,
    timeout, transport:<exception>, malformed:<exception>, stream_error, truncated, bad_output)."""

    kind: str
    texts: list[str] = field(default_factory=list)  # one per prompt (several for a batch)
    output_ids: list[list[int]] | None = None  # native API only
    finish_reasons: list[str | None] = field(default_factory=list)
    detail: str = ""

    @property
    def is_error(self) -> bool:
        return self.kind not in ("ok", "aborted", "disconnected")


def _event(line: str) -> Any:
    """The JSON of one SSE `data:` line, "[DONE]", or None for other lines."""
    if not line.startswith("data: "):
        return None
    payload = line[len("data: ") :]
    return payload if payload == "[DONE]" else json.loads(payload)


async def _stream(client: httpx.AsyncClient, url: str, req: LoadRequest) -> Outcome:
    path = "/generate" if req.api == "generate" else "/v1/chat/completions"
    text, ids, finish, events, done = "", None, None, 0, False
    async with client.stream("POST", url + path, json={**req.body, "stream": True}) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return Outcome(f"http_{resp.status_code}", detail=resp.text[:200])
        async for line in resp.aiter_lines():
            event = _event(line)
            if event is None:
                continue
            if event == "[DONE]":
                done = True
                break
            if "error" in event:
                return Outcome("stream_error", detail=str(event["error"])[:200])
            events += 1
            if req.api == "generate":
                text, ids = event["text"], event["output_ids"]
                finish = (event["meta_info"]["finish_reason"] or {}).get("type", finish)
            else:
                for choice in event["choices"]:
                    text += choice["delta"].get("content") or ""
                    finish = choice["finish_reason"] or finish
            if events == req.cut_after and req.action == "disconnect":
                return Outcome("disconnected")
            if events == req.cut_after and req.action == "abort":
                (await client.post(url + "/abort_request", json={"rid": req.body["rid"]})).raise_for_status()
    if not done or finish is None:
        return Outcome("truncated", [text], None if ids is None else [ids], [finish])
    kind = "aborted" if finish == "abort" else "ok"
    return Outcome(kind, [text], None if ids is None else [ids], [finish])


async def _batch(client: httpx.AsyncClient, url: str, req: LoadRequest) -> Outcome:
    resp = await client.post(url + "/generate", json=req.body)
    if resp.status_code != 200:
        return Outcome(f"http_{resp.status_code}", detail=resp.text[:200])
    results = resp.json()
    reasons = [(r["meta_info"]["finish_reason"] or {}).get("type") for r in results]
    return Outcome("ok", [r["text"] for r in results], [r["output_ids"] for r in results], reasons)


async def send(client: httpx.AsyncClient, url: str, req: LoadRequest, timeout: float) -> Outcome:
    """Run one request to its end within `timeout` seconds; never raises for server faults."""
    try:
        run = _batch(client, url, req) if req.api == "batch" else _stream(client, url, req)
        outcome = await asyncio.wait_for(run, timeout)
    except asyncio.TimeoutError:
        return Outcome("timeout")
    except httpx.HTTPError as e:
        return Outcome(f"transport:{type(e).__name__}", detail=str(e)[:200])
    except (KeyError, TypeError, ValueError) as e:  # a response not shaped as the API says
        return Outcome(f"malformed:{type(e).__name__}", detail=str(e)[:200])
    if outcome.kind == "ok" and not _grammar_ok(req, outcome):
        outcome.kind, outcome.detail = "bad_output", outcome.texts[0][:200]
    return outcome


def _grammar_ok(req: LoadRequest, outcome: Outcome) -> bool:
    """A constrained output that stopped (not cut by max tokens) must match its grammar."""
    params = req.body.get("sampling_params", req.body)
    for text, reason in zip(outcome.texts, outcome.finish_reasons):
        if reason != "stop":
            continue
        if params.get("regex") and not re.fullmatch(params["regex"], text):
            return False
        if params.get("json_schema") or params.get("response_format"):
            try:
                value = json.loads(text)
            except ValueError:
                return False
            if not isinstance(value, dict) or not {"name", "age"} <= set(value):
                return False
    return True


def request_shapes(count: int, seed: int, max_new_tokens: int = 32) -> list[LoadRequest]:
    """`count` distinct greedy requests, run to completion: half share one of two long prefixes; a
    mix of native streams, chat streams, regex / JSON-schema constraints and native batches."""
    rng = random.Random(seed)
    shapes = []
    for i in range(count):
        place = rng.choice(["river", "lake", "coast", "moor"])
        question = f"Question {i}: which animal lives near the {place}?"
        prompt = f"{PREFIXES[i % 2]}\n{question}" if i % 4 < 2 else question
        new_tokens = rng.randint(max_new_tokens // 2, max_new_tokens)
        greedy = {"temperature": 0, "max_new_tokens": new_tokens}
        kind = i % 6
        if kind in (0, 1):
            free = {**greedy, "ignore_eos": True}
            shapes.append(LoadRequest("generate", {"text": prompt, "sampling_params": free}))
        elif kind == 2:
            constrained = {**greedy, "regex": REGEX}
            shapes.append(LoadRequest("generate", {"text": prompt, "sampling_params": constrained}))
        elif kind == 3:
            messages = [{"role": "user", "content": prompt}]
            shapes.append(LoadRequest("chat", {"messages": messages, "max_tokens": new_tokens, "temperature": 0,
                                               "ignore_eos": True}))
        elif kind == 4:
            shapes.append(LoadRequest("chat", {
                "messages": [{"role": "user", "content": f"Describe a person as JSON. {question}"}],
                "max_tokens": 2 * new_tokens, "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
            }))
        else:
            shapes.append(LoadRequest("batch", {"text": [prompt, question], "sampling_params": greedy}))
    return shapes


def with_action(shape: LoadRequest, action: str, rid: str, cut_after: int) -> LoadRequest:
    """`shape` cut by `action`; a batch (not streamed) always completes, and a chat (whose rid the
    server makes) disconnects instead of aborting."""
    if action == "complete" or shape.api == "batch":
        return shape
    if action == "abort" and shape.api == "generate":
        return LoadRequest(shape.api, {**shape.body, "rid": rid}, "abort", cut_after)
    return LoadRequest(shape.api, shape.body, "disconnect", cut_after)


def process_tree(root_pid: int) -> list[int]:
    """A process's pid and those of all its descendants, from /proc."""
    parent_of: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent_of[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree = [root_pid]
    for pid in tree:  # grows while it is walked: breadth-first
        tree += [child for child, parent in parent_of.items() if parent == pid and child not in tree]
    return tree


def process_tree_rss(root_pid: int) -> int:
    """Resident bytes of a process and all its descendants, from /proc (0 if it is gone)."""
    total = 0
    for pid in process_tree(root_pid):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def server_root_pid(info: dict[str, Any]) -> int | None:
    """The server's main process (the scheduler's parent), if it runs on this machine."""
    try:
        stat = Path(f"/proc/{info['scheduler_pid']}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (KeyError, OSError, ValueError):
        return None


async def wait_idle_and_flush(client: httpx.AsyncClient, url: str, timeout: float = 60.0) -> dict[str, Any]:
    """Wait until nothing runs or waits, flush the cache, and return /get_server_info."""
    deadline = time.monotonic() + timeout
    while True:
        info = (await client.get(url + "/get_server_info")).json()
        if info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0:
            if (await client.post(url + "/flush_cache")).status_code == 200:
                return dict((await client.get(url + "/get_server_info")).json())
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server did not become idle within {timeout:.0f}s: {info}")
        await asyncio.sleep(0.1)


@dataclass
class SoakReport:
    load_seconds: float  # new requests were sent for this long
    seconds: float  # until the last one ended
    kinds: Counter[str]  # outcome kind -> count
    rss_mb: list[tuple[float, float]]  # (seconds since start, server tree RSS in MiB)
    info: dict[str, Any]  # /get_server_info after the run, cache flushed

    def render(self) -> str:
        served = sum(n for kind, n in self.kinds.items() if kind in ("ok", "aborted", "disconnected"))
        errors = {kind: n for kind, n in self.kinds.items() if kind not in ("ok", "aborted", "disconnected")}
        pool, cache = self.info["kv_pool"], self.info["radix_cache"]
        lines = [
            f"duration: {self.seconds:.0f} s ({self.load_seconds:.0f} s of new requests, then the last ones "
            f"finishing); requests: {sum(self.kinds.values())} "
            f"({served} served: {self.kinds['ok']} completed, {self.kinds['aborted']} aborted, "
            f"{self.kinds['disconnected']} disconnected)",
            f"errors: {sum(errors.values())} {dict(sorted(errors.items())) or ''}".rstrip(),
            f"retractions: {self.info.get('num_retractions')}; evicted tokens: {cache.get('num_evicted_tokens')}",
            f"KV pool at the end (cache flushed): {pool['free_tokens']} free of {self.info['max_total_num_tokens']}",
        ]
        if self.rss_mb:
            series = ", ".join(f"{t:.0f}s {mb:.0f}" for t, mb in self.rss_mb)
            lines.append(f"server RSS (MiB, process tree): {series}")
            lines.append(f"RSS first -> last: {self.rss_mb[0][1]:.0f} -> {self.rss_mb[-1][1]:.0f} MiB "
                         f"(max {max(mb for _, mb in self.rss_mb):.0f})")
        return "\n".join(lines)


async def soak(url: str, seconds: float, concurrency: int, seed: int, max_new_tokens: int,
               request_timeout: float = 600.0) -> SoakReport:
    shapes = request_shapes(60, seed, max_new_tokens)
    # short prompts, long sampled outputs: they outgrow admission's estimate and force retraction
    shapes += [LoadRequest("generate", {"text": f"Story {i}:", "sampling_params": {
        "temperature": 0.8, "top_p": 0.95, "max_new_tokens": 3 * max_new_tokens, "ignore_eos": True}})
        for i in range(4)]
    kinds: Counter[str] = Counter()
    rss_mb: list[tuple[float, float]] = []
    rss_interval = max(10.0, seconds / 30)  # about 30 samples
    start = time.monotonic()
    deadline = start + seconds
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=request_timeout, limits=limits) as client:
        info = (await client.get(url + "/get_server_info")).json()
        root = server_root_pid(info) if urlparse(url).hostname in ("127.0.0.1", "localhost", "::1") else None

        async def sample_rss() -> None:
            while root is not None:
                rss_mb.append((time.monotonic() - start, process_tree_rss(root) / 2**20))
                await asyncio.sleep(rss_interval)

        async def client_loop(index: int) -> None:
            rng = random.Random(seed * 1000 + index)
            count = 0
            while time.monotonic() < deadline:
                action = rng.choices(ACTIONS, weights=(6, 2, 2))[0]
                req = with_action(rng.choice(shapes), action, f"soak-{index}-{count}", rng.randint(1, 4))
                outcome = await send(client, url, req, request_timeout)
                kinds[outcome.kind] += 1
                if outcome.is_error:
                    params = req.body.get("sampling_params", req.body)
                    print(f"error {outcome.kind} ({req.api}, {req.action}, rid {req.body.get('rid')}, "
                          f"{json.dumps(params)[:160]}): {outcome.detail}", flush=True)
                count += 1

        sampler = asyncio.ensure_future(sample_rss())
        await asyncio.gather(*(client_loop(i) for i in range(concurrency)))
        elapsed = time.monotonic() - start
        info = await wait_idle_and_flush(client, url)
        if root is not None:
            rss_mb.append((time.monotonic() - start, process_tree_rss(root) / 2**20))
        sampler.cancel()
    return SoakReport(seconds, elapsed, kinds, rss_mb, info)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixlm.runtime.bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, required=True, help="how long to send load")
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="longest output of a request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--request-timeout", type=float, default=600.0,
                        help="seconds a request may take before it counts as a timeout error")
    parser.add_argument("--server-args", default="--max-total-tokens 1024",
                        help="flags for the server this script starts (ignored with --url)")
    args = parser.parse_args(argv)
    proc = None
    url = args.url
    if url is None:
        from radixlm.runtime.bench.serving import start_server

        proc, url = start_server(args.server_args.split())
    try:
        report = asyncio.run(soak(url, args.minutes * 60, args.concurrency, args.seed, args.max_new_tokens,
                                  request_timeout=args.request_timeout))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    print(report.render())
    errors = sum(n for kind, n in report.kinds.items() if kind not in ("ok", "aborted", "disconnected"))
    return 1 if errors or report.info["kv_pool"]["free_tokens"] != report.info["max_total_num_tokens"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
