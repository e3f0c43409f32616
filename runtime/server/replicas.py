"""N radixlm replicas behind SGLang's own cache-aware router, in one command (`make serve-replicas N=2`):

    python -m radixlm.runtime.server.replicas --num-replicas 2 [--port 30000] [--policy cache_aware]
                                              [-- radixlm serve flags, e.g. --max-total-tokens 8192]

                      clients (native /generate, /v1/completions, /v1/chat/completions)
                                        |
                        sglang-router :30000 (--policy cache_aware)
                        one approximate prefix tree per replica
                           /                         \\
              radixlm serve :30001          radixlm serve :30002     ...
              own KV pool + radix cache     own KV pool + radix cache

Each replica is a whole `radixlm serve` (its own processes, KV pool and radix cache) on the next
port up; the router (`sglang-router`, the `router` extra) sends each request to the replica whose
cache most likely holds its prefix, and balances load when the replicas drift apart. Everything
listens on 127.0.0.1 unless --host says otherwise. Ctrl-C (or any process exiting) stops them all.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import httpx

WAIT_SECONDS = 600.0  # first start of the default model can convert it; a guard, not a timing


def serve_command(port: int, host: str, serve_flags: list[str]) -> list[str]:
    return [sys.executable, "-m", "radixlm.runtime.server.serve", "--host", host, "--port", str(port), *serve_flags]


def router_command(worker_urls: list[str], port: int, host: str, policy: str, prometheus_port: int,
                   *flags: str) -> list[str]:
    """`sglang-router launch` over `worker_urls` (its CLI; flags as `sglang-router launch --help`).
    Its Prometheus exporter gets a port of its own on `host` (by default every router takes
    29000 on all interfaces, so a second one on the machine would fail to start)."""
    return [sys.executable, "-m", "sglang_router", "launch", "--host", host, "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", policy, "--prometheus-host", host,
            "--prometheus-port", str(prometheus_port), *flags]


def healthy_workers(router_url: str) -> int:
    """How many workers the router reports healthy (its GET /readiness); 0 while it is not up."""
    try:
        return int(httpx.get(router_url + "/readiness", timeout=5).json().get("healthy_workers", 0))
    except (httpx.HTTPError, ValueError):
        return 0


def is_healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until(condition: Callable[[], bool], what: str, procs: list[subprocess.Popen[bytes]],
               timeout: float = WAIT_SECONDS) -> None:
    """Poll `condition` until true; fail if one of `procs` exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while not condition():
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{' '.join(map(str, proc.args[:4]))}... exited with {proc.returncode} "
                                   f"while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout:g} s")
        time.sleep(0.1)


def default_model_flags(serve_flags: list[str]) -> list[str]:
    """The embedded default model named by its directory: the router loads its own tokenizer from
    the model path a replica reports, and would look a name it cannot find on disk up on the hub."""
    from radixlm.runtime.model.model_files import DEFAULT_MODEL_NAME, default_model_dir

    flags = ["--model-path", str(default_model_dir())]
    return flags if "--served-model-name" in serve_flags else [*flags, "--served-model-name", DEFAULT_MODEL_NAME]


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    serve_flags = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(prog="python -m radixlm.runtime.server.replicas", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-replicas", type=int, default=2, help="radixlm servers behind the router")
    parser.add_argument("--port", type=int, default=30000,
                        help="the router's; the replicas take the next ones, then the router's Prometheus exporter")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--policy", default="cache_aware", help="the router's --policy (cache_aware, round_robin, ...)")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.num_replicas < 1:
        parser.error("--num-replicas must be at least 1")
    if "--model-path" not in serve_flags:
        serve_flags = [*default_model_flags(serve_flags), *serve_flags]
    urls = [f"http://{args.host}:{args.port + 1 + i}" for i in range(args.num_replicas)]
    procs: list[subprocess.Popen[bytes]] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        for i in range(len(urls)):
            procs.append(subprocess.Popen(serve_command(args.port + 1 + i, args.host, serve_flags)))
        for url in urls:
            wait_until(lambda url=url: is_healthy(url), f"the replica at {url}", procs)
        procs.append(subprocess.Popen(router_command(urls, args.port, args.host, args.policy,
                                                     args.port + args.num_replicas + 1, "--log-level", "warn")))
        router_url = f"http://{args.host}:{args.port}"
        wait_until(lambda: healthy_workers(router_url) == len(urls), "the router to see every replica", procs)
        print(f"radixlm replicas ready: router ({args.policy}) at {router_url} over {', '.join(urls)}", flush=True)
        while all(proc.poll() is None for proc in procs):
            time.sleep(0.5)
        return 1  # a process exited by itself
    except KeyboardInterrupt:
        return 0
    finally:
        stop_all(procs)


if __name__ == "__main__":
    sys.exit(main())
