"""Resident memory of a whole server: the sum of RSS over its process tree (HTTP front, tokenizer,
scheduler, detokenizer) after one W1 request, at a fixed KV pool size, so that runs differ only in
their weights. `python -m radixlm.runtime.bench.memory [--max-total-tokens N] -- SERVER FLAGS...`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import httpx

from radixlm.runtime.bench import workloads as wl


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def tree_rss_bytes(pid: int) -> int:
    """Sum of VmRSS over `pid` and all its descendants."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            todo += _children(p)
        except OSError:
            continue  # gone meanwhile
    return total


def cli_flags(flags: dict[str, Any]) -> list[str]:
    return [item for name, value in flags.items() for item in (f"--{name.replace('_', '-')}", str(value))]


def server_rss_after_w1(flags: dict[str, Any], max_total_tokens: int) -> int:
    """Bytes resident in a server started with Engine-style `flags` after one W1 request."""
    from radixlm.runtime.bench.serving import start_server

    proc, url = start_server([*cli_flags(flags), "--max-total-tokens", str(max_total_tokens)])
    try:
        body = {"text": wl.W1_PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": wl.W1_NEW_TOKENS,
                                                          "ignore_eos": True}}
        httpx.post(url + "/generate", json=body, timeout=600).raise_for_status()
        return tree_rss_bytes(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-total-tokens", type=int, default=16384)
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="server flags, after --")
    args = parser.parse_args(argv)
    flags = [f for f in args.flags if f != "--"]
    pairs = dict(zip(flags[::2], flags[1::2], strict=True))
    rss = server_rss_after_w1({k.lstrip("-"): v for k, v in pairs.items()}, args.max_total_tokens)
    print(f"server RSS after W1 ({' '.join(flags) or 'defaults'}, --max-total-tokens {args.max_total_tokens}, "
          f"pid tree of {os.getpid()}'s child): {rss / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
