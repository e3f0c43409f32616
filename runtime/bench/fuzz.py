"""`python -m radixlm.runtime.bench.fuzz`: schemathesis against a server's own `/openapi.json`.

For every operation the document lists and both generation modes (positive: bodies the schema
allows; negative: bodies it refuses), schemathesis generates requests with a pinned seed and
checks each response: `not_a_server_error` (no 5xx), `status_code_conformance`,
`content_type_conformance`, `response_schema_conformance` and `response_headers_conformance`
(the status, media type, body and headers are documented), and `negative_data_rejection` (what
the schema refuses, the server refuses: 4xx). `positive_data_acceptance` (what the schema allows,
the server takes) is run on the operations of POSITIVE_ACCEPTANCE only: elsewhere a body valid
by the schema may still be refused with a 400 for what no schema can say (a regex that does not
compile, a prompt over the context length, a token id beyond the vocabulary). Besides, each path
gets OPTIONS and an undocumented method, which must be answered 405 with an `Allow` header
listing exactly the documented methods (`allow_header_conformance`, and our own check of the
405: schemathesis' `unsupported_method` runs only in its coverage phase, not used here).

The suite runs a few examples per operation on the tiny-model server
(tests/server/test_openapi_contract.py); this command runs the long version and prints one line
per operation and mode: requests sent, statuses seen, failures. By default it starts its own
server on the embedded model with a 256-token context (a short generation per request); or
point it at one with --url.

    python -m radixlm.runtime.bench.fuzz --examples 500      # ~12 operations x 2 modes x 500
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

CHECK_NAMES = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
               "response_schema_conformance", "response_headers_conformance", "negative_data_rejection")
# operations whose every refusal the schema can say: valid data must be accepted (2xx)
POSITIVE_ACCEPTANCE = frozenset({
    "GET /health", "GET /get_model_info", "GET /model_info", "GET /get_server_info", "GET /server_info",
    "GET /get_load", "GET /v1/models", "GET /metrics", "GET /cache_tree", "GET /dashboard", "GET /traces",
    "GET /health_generate", "POST /traces", "GET /flush_cache", "POST /flush_cache", "POST /abort_request",
    "POST /separate_reasoning"})
UNDOCUMENTED_METHODS = ("OPTIONS", "PATCH")  # no route serves PATCH
SERVER_FLAGS = ("--context-length", "256", "--max-running-requests", "16")


@dataclass
class OperationRun:
    """What one operation got in one generation mode."""

    label: str
    mode: str
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def num_requests(self) -> int:
        return sum(self.statuses.values())


def checks(names: tuple[str, ...] = CHECK_NAMES) -> list[Any]:
    from schemathesis import checks as builtin
    from schemathesis.specs.openapi import checks as openapi_checks

    return [getattr(builtin, name) if hasattr(builtin, name) else getattr(openapi_checks, name)
            for name in names]


def fuzz(base_url: str, examples: int, seed: int = 0, modes: tuple[str, ...] = ("positive", "negative"),
         operations: tuple[str, ...] = (), headers: dict[str, str] | None = None) -> list[OperationRun]:
    """Run schemathesis on every operation of `base_url`'s /openapi.json (or those whose label,
    e.g. "POST /generate", is in `operations`), `examples` generated requests per operation and
    mode, derandomized from `seed`. Returns what each got; failures are collected, not raised."""
    import requests
    import schemathesis
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", headers=headers or {})
    runs: list[OperationRun] = []
    session = requests.Session()
    check_functions = checks()
    with_acceptance = checks(CHECK_NAMES + ("positive_data_acceptance",))

    def send(case: Any, run: OperationRun) -> None:
        try:
            response = case.call(base_url=base_url, session=session, headers=headers, timeout=120)
        except requests.RequestException as e:
            run.failures.append(f"no response: {e}")
            return
        run.statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=with_acceptance if run.label in POSITIVE_ACCEPTANCE
                                   else check_functions, headers=headers)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # the failed checks, as one schemathesis FailureGroup (a BaseExceptionGroup)
            run.failures.append(f"{response.status_code}: {str(e).strip()[:2000]}\n  body sent: "
                                f"{getattr(case, 'body', None)!r:.500}")

    paths_seen: set[str] = set()
    for result in schema.get_all_operations():
        operation = result.ok()
        if operations and operation.label not in operations:
            continue
        if operation.path not in paths_seen:
            paths_seen.add(operation.path)
            runs.append(_undocumented_methods(schema, operation, base_url, session, headers))
        for mode in modes:
            run = OperationRun(operation.label, mode)
            runs.append(run)
            strategy = operation.as_strategy(generation_mode=GenerationMode(mode))
            try:
                _run_cases(strategy, examples, seed, lambda case, run=run: send(case, run))
            except Unsatisfiable:  # negative mode of an operation without body or parameters
                run.note = "nothing to negate"
    return runs


def _undocumented_methods(schema: Any, operation: Any, base_url: str, session: Any,
                          headers: dict[str, str] | None) -> OperationRun:
    """OPTIONS and another undocumented method on `operation`'s path: each must get 405 with an
    `Allow` header naming exactly the methods the document lists for the path."""
    import requests
    from schemathesis import Case

    run = OperationRun(f"* {operation.path}", "methods")
    documented = {m.upper() for m in schema.raw_schema["paths"][operation.path]} - {"HEAD", "OPTIONS"}
    for method in UNDOCUMENTED_METHODS:
        # a path's parameters (e.g. /v1/responses/{response_id}) get a placeholder: the method
        # decides the answer before any id is looked up
        params = {name: "x" for name in re.findall(r"{(\w+)}", operation.path)}
        case = Case(operation, method=method, path=operation.path, path_parameters=params or None)
        try:
            response = case.call(base_url=base_url, session=session, headers=headers, timeout=120)
        except requests.RequestException as e:
            run.failures.append(f"{method}: no response: {e}")
            continue
        run.statuses[response.status_code] += 1
        allow_header = ", ".join(response.headers.get("allow", []))  # schemathesis: each header's values
        allow = {m.strip().upper() for m in allow_header.split(",") if m.strip()}
        if response.status_code != 405 or allow - {"HEAD"} != documented:
            run.failures.append(f"{method} {operation.path}: {response.status_code}, Allow: {allow_header!r}; "
                                f"expected 405, Allow: {', '.join(sorted(documented))}")
        try:
            case.validate_response(response, checks=checks(("allow_header_conformance",)), headers=headers)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            run.failures.append(f"{method}: {str(e).strip()[:2000]}")
    return run


def _run_cases(strategy: Any, examples: int, seed: int, send: Callable[[Any], None]) -> None:
    """`send` each of `examples` cases drawn from `strategy`, reproducibly from `seed`."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(case=strategy)
    def one(case: Any) -> None:
        send(case)

    one()


def format_runs(runs: list[OperationRun]) -> list[str]:
    lines = ["| operation | mode | requests | statuses | failures |", "|---|---|---|---|---|"]
    for run in runs:
        statuses = ", ".join(f"{code}: {count}" for code, count in sorted(run.statuses.items())) or run.note
        lines.append(f"| {run.label} | {run.mode} | {run.num_requests} | {statuses} | {len(run.failures)} |")
    total = sum(r.num_requests for r in runs)
    lines.append(f"total: {total} requests, {sum(len(r.failures) for r in runs)} failures, "
                 f"{sum(c for r in runs for s, c in r.statuses.items() if s >= 500)} responses 5xx")
    return lines


@contextmanager
def own_server(model_path: str | None, extra: tuple[str, ...]) -> Iterator[str]:
    """A `radixlm serve` on a free port of 127.0.0.1 for the run's length; yields its URL."""
    import socket

    import requests

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, "-m", "radixlm.runtime.server.cli", "serve", "--port", str(port), *SERVER_FLAGS, *extra]
    if model_path:
        args += ["--model-path", model_path]
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", prefix="radixlm-fuzz-")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the server exited ({proc.returncode}):\n{log.read()[-3000:]}")
            try:
                if requests.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--model-path", default=None, help="the model of the server started (default: embedded)")
    parser.add_argument("--examples", type=int, default=500, help="requests per operation and mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--operations", default="", help="comma-separated labels, e.g. 'POST /generate'")
    parser.add_argument("--server-flag", action="append", default=[], help="one more flag for the server started")
    args = parser.parse_args(argv)
    operations = tuple(o.strip() for o in args.operations.split(",") if o.strip())
    started = time.perf_counter()
    if args.url:
        runs = fuzz(args.url.rstrip("/"), args.examples, args.seed, operations=operations)
    else:
        with own_server(args.model_path, tuple(args.server_flag)) as url:
            runs = fuzz(url, args.examples, args.seed, operations=operations)
    print("\n".join(format_runs(runs)))
    print(f"(seed {args.seed}, {args.examples} examples per operation and mode, {time.perf_counter() - started:.0f} s)")
    for run in runs:
        for failure in run.failures[:3]:
            print(f"\n{run.label} [{run.mode}]: {failure}")
    return 1 if any(r.failures for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
