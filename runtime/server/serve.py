"""`radixlm serve` / `python -m radixlm.runtime.server.serve`: start the three processes and the HTTP server.

  main process   FastAPI on uvicorn (uvloop, h11 with the timeouts and cap of http_protocol.py) + TokenizerManager
  scheduler      model, KV pool, radix cache, scheduler loop      (run_scheduler_process)
                 with --dp-size N: N of them, one per data-parallel rank, each with cores / N torch
                 threads; the TokenizerManager's LoadBalancer picks a request's rank
  detokenizer    incremental detokenization                       (run_detokenizer_process)
joined by zmq over ipc:// sockets in a private temp directory. A watchdog fails every request
with 503 and stops the server (exit code 1) if a child dies; SIGINT/SIGTERM shut down cleanly
(children stopped, sockets and the temp directory removed, exit code 0). Either way, requests
still in flight get SHUTDOWN_GRACE_S to finish; then they are cancelled and their connections
dropped, so a client that never reads its stream cannot keep the server alive.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import multiprocessing as mp
import os
import signal
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from radixlm.runtime.config.envs import set_process_defaults
from radixlm.runtime.config.server_args import ServerArgs, add_cli_args, from_cli_args

set_process_defaults()  # before torch loads here or in a child process

logger = logging.getLogger("radixlm.serve")
CHILD_START_TIMEOUT = 600.0
WATCHDOG_INTERVAL = 0.2
SHUTDOWN_GRACE_S = 10.0


def _wait_ready(name: str, proc: BaseProcess, conn: Connection) -> dict[str, Any]:
    deadline = time.monotonic() + CHILD_START_TIMEOUT
    while time.monotonic() < deadline:
        if conn.poll(0.2):
            status, payload = conn.recv()
            if status != "ready":
                raise RuntimeError(f"the {name} process failed to start: {payload}")
            return dict(payload)
        if not proc.is_alive():
            raise RuntimeError(f"the {name} process exited during start-up (code {proc.exitcode})")
    raise RuntimeError(f"the {name} process did not start within {CHILD_START_TIMEOUT:.0f}s")


def _run_scheduler(*args: Any) -> None:
    """The scheduler child's entry: its modules (torch, the model) load in the child only."""
    from radixlm.runtime.scheduler.scheduler_process import run_scheduler_process

    run_scheduler_process(*args)


def _run_detokenizer(*args: Any) -> None:
    from radixlm.runtime.detokenizer.detokenizer_process import run_detokenizer_process

    run_detokenizer_process(*args)


def _child_specs(args: ServerArgs) -> list[tuple[str, Any, ServerArgs, tuple[Any, ...]]]:
    """(name, target, settings, extra args) of each child: the schedulers (one per data-parallel
    rank, named by rank when there are several, each given cores / N threads), then the detokenizer."""
    if args.dp_size == 1:
        schedulers = [("scheduler", _run_scheduler, args, (0, None))]
    else:
        threads = max(1, len(os.sched_getaffinity(0)) // args.dp_size)
        schedulers = [(f"scheduler dp{rank}", _run_scheduler, _rank_args(args), (rank, threads))
                      for rank in range(args.dp_size)]
    return [*schedulers, ("detokenizer", _run_detokenizer, args, ())]


def _rank_args(args: ServerArgs) -> ServerArgs:
    """The settings each scheduler gets: with data parallelism and a pool sized from memory, each
    rank takes 1/N of --mem-fraction-static (they share the host's memory, and all measure what is
    available before any allocates)."""
    if args.dp_size == 1 or args.max_total_tokens is not None:
        return args
    return args.replace(mem_fraction_static=args.mem_fraction_static / args.dp_size)


def launch_server(args: ServerArgs) -> int:
    """Run the server until a signal or a child's death; returns the process exit code."""
    from radixlm.runtime.ipc.sockets import IpcPaths

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    paths = IpcPaths.create()
    ctx = mp.get_context("spawn")
    children: dict[str, BaseProcess] = {}
    try:
        readers: dict[str, Connection] = {}
        for name, target, settings, extra in _child_specs(args):
            readers[name], writer = ctx.Pipe(duplex=False)
            children[name] = ctx.Process(target=target, args=(settings, paths, writer, *extra),
                                         name=f"radixlm-{name.replace(' ', '-')}", daemon=True)
            children[name].start()
        infos = {name: _wait_ready(name, children[name], conn) for name, conn in readers.items()}
        ranks = [info for info in infos.values() if "dp_rank" in info]
        info = {"context_len": ranks[0]["context_len"],
                "max_total_num_tokens": min(i["max_total_num_tokens"] for i in ranks)}
        return _serve_http(args, paths, children, info)
    except RuntimeError as e:
        print(f"radixlm: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        for proc in children.values():
            if proc.is_alive():
                proc.terminate()
        for proc in children.values():
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        paths.remove()


def _serve_http(args: ServerArgs, paths: Any, children: dict[str, BaseProcess], info: dict[str, Any]) -> int:
    import uvicorn
    import uvloop

    from radixlm.runtime.model.model_config import ModelConfig
    from radixlm.runtime.model.model_files import resolve_model_path
    from radixlm.runtime.server.http_protocol import TimedH11Protocol
    from radixlm.runtime.server.http_server import create_app
    from radixlm.runtime.server.load_balance import LoadBalancer
    from radixlm.runtime.server.metrics import Metrics
    from radixlm.runtime.server.tokenizer_manager import TokenizerManager
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

    model_dir = resolve_model_path(args.model_path)
    model_name = args.served_model_name or (args.model_path or "SmolLM2-135M-Instruct")
    tokenizer = Tokenizer(args.tokenizer_path or model_dir, chat_template=args.chat_template)
    vocab_size = ModelConfig.from_dir(model_dir).vocab_size
    exit_code = 0

    async def main() -> None:
        nonlocal exit_code
        tm = TokenizerManager(paths, tokenizer, model_name, info["context_len"], vocab_size,
                              info["max_total_num_tokens"], Metrics(model_name), args.incremental_streaming_output,
                              args.grammar_backend,
                              LoadBalancer(args.load_balance_method, args.dp_size, info["max_total_num_tokens"]),
                              whitespace_pattern=args.constrained_json_whitespace_pattern)
        tm.start()
        app = create_app(tm, args.api_key, enable_metrics=args.enable_metrics, tool_call_parser=args.tool_call_parser,
                         reasoning_parser=args.reasoning_parser, response_store_size=args.response_store_size)
        protocol = functools.partial(TimedH11Protocol, timeout_header=args.timeout_header,
                                     timeout_body=args.timeout_body, timeout_request=args.timeout_request,
                                     max_connections=args.max_connections)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level.lower(),
                                access_log=args.log_level.lower() == "debug", lifespan="off",
                                timeout_graceful_shutdown=SHUTDOWN_GRACE_S, http=protocol)  # type: ignore[arg-type]
        server = uvicorn.Server(config)

        async def watchdog() -> None:
            nonlocal exit_code
            while not server.started:
                await asyncio.sleep(0.05)
            print(f"radixlm server ready at http://{args.host}:{args.port} (model {model_name})", flush=True)
            while True:
                dead = [name for name, proc in children.items() if not proc.is_alive()]
                if dead:
                    reason = f"the {dead[0]} process died (exit code {children[dead[0]].exitcode})"
                    print(f"radixlm: {reason}; shutting down", file=sys.stderr, flush=True)
                    tm.fail_all(reason)
                    exit_code = 1
                    await asyncio.sleep(0.5)  # let in-flight requests receive their 503
                    server.should_exit = True
                    return
                await asyncio.sleep(WATCHDOG_INTERVAL)

        watch = asyncio.ensure_future(watchdog())
        await server.serve()
        watch.cancel()

    # uvicorn restores the previous handlers and re-raises the signal after shutdown: make that
    # a no-op so the `finally` of launch_server still stops the children and removes the sockets
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    uvloop.run(main())
    return exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radixlm serve", description="Serve a model over HTTP (SGLang-native and OpenAI APIs).")
    add_cli_args(parser)
    try:
        args = from_cli_args(parser.parse_args(argv))
    except ValueError as e:
        parser.error(str(e))  # exits 2 with the message, no traceback
    return launch_server(args)


if __name__ == "__main__":
    sys.exit(main())
