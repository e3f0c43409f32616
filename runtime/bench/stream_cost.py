"""Stream-cost benchmark: what one streamed request costs as its output grows, and whether a heavy
stream stalls the server for everyone else.

1. Long stream: one /generate stream of 4,000 tokens (`ignore_eos`, greedy) on a tiny random
   model with a 4,608-position context; reports the client-side time per token of the first and
   the last 500 tokens, and the bytes received. Flat per-token cost means last/first ~ 1. The
   same stream from the in-process Engine (`--engine-baseline`) shows what the model's own step
   adds as the context grows (attention over 4,000 positions), apart from the stream path.
2. Heavy logprob stream: 200 tokens with `top_logprobs_num=100` and `return_text_in_logprobs`,
   while a second client polls GET /health every 20 ms; reports the worst /health latency and
   the bytes the stream sent.

Starts its own server (`python -m radixlm.runtime.server.serve`, this interpreter) on a free
port unless `--url` is given (point it at another build's server to compare before/after; the
tiny model is written to `--model-dir`, which such a server can be started on).

    python -m radixlm.runtime.bench.stream_cost [--url URL] [--model-dir DIR] [--repeats 3]
        [--server-flags "--incremental-streaming-output"] [--engine-baseline]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

LONG_POSITIONS = 4_608
LONG_TOKENS = 4_000
WINDOW = 500
HEAVY_TOKENS = 200
HEALTH_POLL_S = 0.02


def write_tiny_long_model(path: Path) -> Path:
    """A tiny random Llama (2 layers, hidden 64) with the default model's tokenizer and a
    4,608-position context; written once."""
    if (path / "config.json").exists():
        return path
    import torch
    import transformers

    from radixlm.runtime.model.model_files import resolve_model_path

    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=LONG_POSITIONS, rms_norm_eps=1e-6, initializer_range=0.1,
        tie_word_embeddings=False, rope_theta=10000.0,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    default_dir = resolve_model_path(None)
    source = json.loads((default_dir / "config.json").read_text())
    model.config.eos_token_id, model.config.bos_token_id = source.get("eos_token_id"), source.get("bos_token_id")
    model.save_pretrained(path, safe_serialization=True)
    for f in default_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(f, path / f.name)
    return path


def start_server(model_dir: Path, log_path: Path, flags: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "radixlm.runtime.server.serve", "--port", str(port), "--model-path", str(model_dir),
           "--max-total-tokens", "16384", "--random-seed", "0", *flags]
    proc = subprocess.Popen(cmd, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the server did not start: see {log_path}")


def stream(url: str, body: dict[str, Any]) -> tuple[list[tuple[float, int]], int]:
    """(arrival time, completion_tokens) per chunk, and the bytes received."""
    arrivals: list[tuple[float, int]] = []
    num_bytes = 0
    with httpx.stream("POST", url + "/generate", json={**body, "stream": True}, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            num_bytes += len(line) + 1
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                chunk = json.loads(line[5:])
                arrivals.append((time.perf_counter(), chunk["meta_info"]["completion_tokens"]))
    return arrivals, num_bytes


def time_at(arrivals: list[tuple[float, int]], tokens: int) -> float:
    """When the first chunk holding at least `tokens` tokens arrived."""
    return next(t for t, n in arrivals if n >= tokens)


LONG_BODY = {"text": "Once upon a time",
             "sampling_params": {"max_new_tokens": LONG_TOKENS, "temperature": 0, "ignore_eos": True}}


def windows(arrivals: list[tuple[float, int]], num_bytes: int) -> dict[str, float]:
    first = (time_at(arrivals, WINDOW) - time_at(arrivals, 1)) / (WINDOW - 1)
    last = (time_at(arrivals, LONG_TOKENS) - time_at(arrivals, LONG_TOKENS - WINDOW)) / WINDOW
    return {"first_ms": first * 1e3, "last_ms": last * 1e3, "ratio": last / first, "mb": num_bytes / 1e6}


def long_stream(url: str) -> dict[str, float]:
    return windows(*stream(url, LONG_BODY))


def engine_long_stream(engine: Any) -> dict[str, float]:
    arrivals = [(time.perf_counter(), chunk["meta_info"]["completion_tokens"])
                for chunk in engine.generate(prompt=LONG_BODY["text"], sampling_params=LONG_BODY["sampling_params"],
                                             stream=True)]
    return windows(arrivals, 0)


def report_long(name: str, runs: list[dict[str, float]]) -> None:
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"{name} ({LONG_TOKENS} tokens, medians of {len(runs)}): first {WINDOW} tokens "
          f"{med['first_ms']:.3f} ms/token, last {WINDOW} {med['last_ms']:.3f} ms/token "
          f"(last/first {med['ratio']:.2f}), {med['mb']:.1f} MB received")


def heavy_logprob_stream(url: str) -> dict[str, float]:
    body = {"input_ids": list(range(500, 520)),
            "sampling_params": {"max_new_tokens": HEAVY_TOKENS, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 100, "return_text_in_logprobs": True}
    latencies: list[float] = []
    done = threading.Event()

    def poll_health() -> None:
        with httpx.Client(timeout=600) as client:
            while not done.is_set():
                start = time.perf_counter()
                client.get(url + "/health")
                latencies.append(time.perf_counter() - start)
                time.sleep(HEALTH_POLL_S)

    poller = threading.Thread(target=poll_health)
    poller.start()
    try:
        _, num_bytes = stream(url, body)
    finally:
        done.set()
        poller.join()
    return {"worst_health_ms": max(latencies) * 1e3, "median_health_ms": statistics.median(latencies) * 1e3,
            "mb": num_bytes / 1e6}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="an already running server on the tiny long model (else one is started)")
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/radixlm-bench-tiny-long"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--server-flags", default="", help="extra flags for the server this bench starts")
    parser.add_argument("--engine-baseline", action="store_true", help="also stream from the in-process Engine")
    args = parser.parse_args(argv)
    write_tiny_long_model(args.model_dir)
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args.model_dir, args.model_dir / "server.log", args.server_flags.split())
    try:
        stream(url, {"text": "warm up", "sampling_params": {"max_new_tokens": 16}})
        longs = [long_stream(url) for _ in range(args.repeats)]
        heavies = [heavy_logprob_stream(url) for _ in range(args.repeats)]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    report_long("server stream", longs)
    worst = max(r["worst_health_ms"] for r in heavies)
    heavy_mb = statistics.median(r["mb"] for r in heavies)
    median_health = statistics.median(r["median_health_ms"] for r in heavies)
    print(f"heavy logprob stream ({HEAVY_TOKENS} tokens x 100 top logprobs with text): worst /health "
          f"{worst:.1f} ms over {args.repeats} runs (median {median_health:.1f} ms), {heavy_mb:.1f} MB sent")
    if args.engine_baseline:
        from radixlm.runtime.config.envs import set_process_defaults

        set_process_defaults()
        from radixlm.runtime.engine import Engine

        engine = Engine(str(args.model_dir), max_total_tokens=16384, random_seed=0)
        try:
            report_long("in-process Engine stream (the model's own cost)",
                        [engine_long_stream(engine) for _ in range(args.repeats)])
        finally:
            engine.shutdown()


if __name__ == "__main__":
    main()
