"""`python -m radixlm.runtime.bench.router_hits --replica-urls URL URL ...`: the total prefix-cache hit
rate of radixlm replicas behind sglang-router, `cache_aware` against `round_robin`, on the same
traffic (issue 16).

The traffic is families of prompts: in each family a shared prefix that is more than half of each
prompt's text (cache_aware routes by prefix only above its 0.3 cache_threshold), then a question
of its own. It is sent one request at a time, family after family, through /generate, streamed
/generate and /v1/completions in turn. For each policy a router is started over the replicas
(already running: `make serve-replicas` starts them), every replica's cache is flushed, the
traffic sent, and the hit rate read from the replicas' own /metrics: cached prompt tokens over
prompt tokens, summed over the replicas.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys

import httpx

from radixlm.runtime.server.replicas import healthy_workers, router_command, stop_all, wait_until

WORDS = ("amber basalt cedar delta ember fjord granite harbor indigo juniper kelp lagoon meadow nectar onyx "
         "prairie quartz river sierra tundra umber valley willow xenon yarrow zephyr").split()
ROUTES = ("generate", "generate-stream", "completions")
TIMEOUT = 600.0  # one request: a guard


def families(num_families: int = 6, per_family: int = 3, seed: int = 0) -> list[list[str]]:
    """`num_families` lists of `per_family` prompts sharing a prefix over half of each prompt."""
    rng = random.Random(seed)
    out = []
    for f in range(num_families):
        prefix = f"Family {f} notes: " + " ".join(rng.choice(WORDS) for _ in range(40)) + "."
        prompts = [prefix + f" Question {q}: " + " ".join(rng.choice(WORDS) for _ in range(6)) + "?"
                   for q in range(per_family)]
        assert all(len(prefix) >= len(p) / 2 for p in prompts)
        out.append(prompts)
    return out


def send(url: str, route: str, prompt: str, model: str, max_new_tokens: int = 2) -> int:
    """One request through `route` (one of ROUTES) at `url`; its status. A 200 whose answer is
    not whole (no [DONE], fewer tokens than asked) raises."""
    if route == "completions":
        body = {"model": model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
        resp = httpx.post(url + "/v1/completions", json=body, timeout=TIMEOUT)
        if resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] != max_new_tokens:
            raise AssertionError(f"short completion: {resp.text[:300]}")
        return resp.status_code
    params = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
    stream = route == "generate-stream"
    with httpx.stream("POST", url + "/generate", json={"text": prompt, "sampling_params": params, "stream": stream},
                      timeout=TIMEOUT) as resp:
        text = resp.read().decode()
    if resp.status_code == 200:
        if stream:
            events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
            if events[-1:] != ["[DONE]"]:
                raise AssertionError(f"stream without [DONE]: {text[-300:]}")
            text = events[-2]
        if json.loads(text)["meta_info"]["completion_tokens"] != max_new_tokens:
            raise AssertionError(f"short answer: {text[:300]}")
    return resp.status_code


def counter(url: str, name: str) -> float:
    """A counter of a replica's own /metrics."""
    text = httpx.get(url + "/metrics", timeout=60).text
    match = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
    if match is None:
        raise KeyError(f"{name} not in {url}/metrics")
    return float(match.group(1))


def hit_rate(replica_urls: list[str], router_url: str, model: str, prompt_families: list[list[str]]) -> float:
    """Caches flushed, the traffic sent through the router, the total hit rate over the replicas."""
    for url in replica_urls:
        httpx.post(url + "/flush_cache", timeout=60).raise_for_status()
    names = ("radixlm_prompt_tokens_total", "radixlm_cached_tokens_total")
    before = [[counter(url, name) for name in names] for url in replica_urls]
    for prompts in prompt_families:
        for i, prompt in enumerate(prompts):
            status = send(router_url, ROUTES[i % len(ROUTES)], prompt, model)
            if status != 200:
                raise AssertionError(f"{ROUTES[i % len(ROUTES)]} through the router: status {status}")
    after = [[counter(url, name) for name in names] for url in replica_urls]
    prompt_tokens = sum(a[0] - b[0] for a, b in zip(after, before))
    cached_tokens = sum(a[1] - b[1] for a, b in zip(after, before))
    return cached_tokens / prompt_tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixlm.runtime.bench.router_hits", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replica-urls", nargs="+", required=True, help="running radixlm servers")
    parser.add_argument("--router-port", type=int, default=31990, help="where the routers listen (one at a time; their Prometheus exporter one up)")
    parser.add_argument("--families", type=int, default=6)
    parser.add_argument("--per-family", type=int, default=3)
    args = parser.parse_args(argv)
    model = httpx.get(args.replica_urls[0] + "/v1/models", timeout=60).json()["data"][0]["id"]
    prompt_families = families(args.families, args.per_family)
    rates = {}
    router_url = f"http://127.0.0.1:{args.router_port}"
    for policy in ("round_robin", "cache_aware"):
        proc = subprocess.Popen(router_command(args.replica_urls, args.router_port, "127.0.0.1", policy,
                                               args.router_port + 1, "--log-level", "warn"))
        try:
            wait_until(lambda: healthy_workers(router_url) == len(args.replica_urls), "the router", [proc])
            rates[policy] = hit_rate(args.replica_urls, router_url, model, prompt_families)
        finally:
            stop_all([proc])
    print(f"{len(args.replica_urls)} replicas, {args.families} families x {args.per_family} requests: total cache "
          f"hit rate cache_aware {rates['cache_aware']:.3f}, round_robin {rates['round_robin']:.3f} "
          f"({rates['cache_aware'] / max(rates['round_robin'], 1e-9):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
