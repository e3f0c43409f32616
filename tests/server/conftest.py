"""Server fixtures: the real server as a subprocess on 127.0.0.1 (one per model per session)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from radixlm_testing import process_tree

from radixlm.runtime.ipc.parent_death import set_parent_death_signal

SGLANG = "sglang==0.5.23"
FRONTEND_DEPS = ["orjson", "requests", "setproctitle", "psutil", "pybase64", "IPython", "msgspec", "pillow", "aiohttp"]


def ipc_dirs_of(pid: int) -> set[Path]:
    """The radixlm-ipc-* directories of the sockets process `pid` has bound (Linux /proc): what
    a server killed with SIGKILL cannot remove itself."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if (match := re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))) is not None:
                inodes.add(match.group(1))
    paths = [line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:]]
    return {Path(p[7]).parent for p in paths if len(p) >= 8 and p[6] in inodes
            and Path(p[7]).parent.name.startswith("radixlm-ipc-")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerHandle:
    proc: subprocess.Popen[str]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_exit(self, limit_s: float = 120) -> int:
        """The server's exit code; a server still running after `limit_s` (a bound on a hang, not a
        speed) fails the test with its processes and its log."""
        try:
            return self.proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the server did not exit within {limit_s:.0f} s (processes "
                                 f"{process_tree(self.proc.pid)}); its log:\n{self.log()[-12000:]}") from None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


def stop_with_parent_thread() -> Callable[[], None] | None:
    """For a test's child process, before it runs: SIGTERM it when the test process dies (a pytest
    worker killed for memory would otherwise leave its servers running, holding theirs). Only
    from the main thread: the signal follows the thread that started the child, and a pool thread
    that starts servers ends long before they should."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return partial(set_parent_death_signal, signal.SIGTERM)


def start_server(model_path: Path | None, log_path: Path, *extra: str, timeout: float = 240,
                 port: int | None = None) -> ServerHandle:
    """Start `python -m radixlm.runtime.server.serve` (on a free port unless given) and wait until /health answers."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "radixlm.runtime.server.serve", "--port", str(port), *extra]
    if model_path is not None:
        cmd += ["--model-path", str(model_path)]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=stop_with_parent_thread())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return ServerHandle(proc, url, log_path)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not become healthy in {timeout}s:\n{log_path.read_text()}")


@contextmanager
def running_server(model_path: Path | None, tmp_path_factory: pytest.TempPathFactory, name: str,
                   *flags: str) -> Iterator[ServerHandle]:
    """A server for a module's tests (its log under a temp folder `name`), stopped at the end."""
    handle = start_server(model_path, tmp_path_factory.mktemp(name) / "server.log", *flags)
    try:
        yield handle
    finally:
        handle.stop()


def stream_while_killing(url: str, body: dict[str, Any], pid: int) -> list[Any]:
    """Stream `body` from `url`/generate, SIGKILL `pid` once the response has started, and return
    the events read (parsed; the error's type name if the connection drops as the server exits)."""
    events: list[Any] = []
    with httpx.stream("POST", url + "/generate", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        os.kill(pid, signal.SIGKILL)
        try:
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[len("data: "):]))
        except httpx.HTTPError as e:
            events.append(type(e).__name__)
    return events


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """The tiny random model behind a real server, small KV pool, metrics on."""
    log = tmp_path_factory.mktemp("server") / "tiny.log"
    # float32 by name, as tiny_engine (tests/conftest.py): its tests compare outputs across batches
    server = start_server(tiny_model_dir, log, "--max-total-tokens", "4096", "--random-seed", "0", "--log-level", "info",
                          "--dtype", "float32")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_model_name(tiny_server: ServerHandle) -> str:
    """The id `tiny_server` serves its model under (from its /v1/models)."""
    return str(httpx.get(tiny_server.url + "/v1/models").json()["data"][0]["id"])


@pytest.fixture(scope="session")
def tiny_outlines_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """`tiny_server` with `--grammar-backend outlines` (the default is xgrammar)."""
    log = tmp_path_factory.mktemp("server") / "tiny-outlines.log"
    server = start_server(tiny_model_dir, log, "--max-total-tokens", "4096", "--random-seed", "0",
                          "--grammar-backend", "outlines", "--dtype", "float32")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def reasoning_server(scripted_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """The scripted tiny model (it reasons, then answers: radixlm_testing.REASONING_SCRIPT) behind a
    real server with `--reasoning-parser deepseek-r1`."""
    log = tmp_path_factory.mktemp("server") / "reasoning.log"
    server = start_server(scripted_model_dir, log, "--reasoning-parser", "deepseek-r1", "--max-total-tokens", "2048")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def default_server(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """The real default model behind a real server."""
    log = tmp_path_factory.mktemp("server") / "default.log"
    server = start_server(None, log, "--max-total-tokens", "8192")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sglang_paths(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The real `sglang` frontend: its wheel's `sglang/` package (unpacked, not installed: its
    full install pulls CUDA packages) and the pure-Python modules its frontend imports, in side
    directories cached under the radixlm cache."""
    from radixlm.runtime.model.model_files import cache_dir

    root = cache_dir() / "test-sglang-frontend" / SGLANG.replace("==", "-")
    pkg, deps, done = root / "pkg", root / "deps", root / "complete"
    if not done.exists():
        wheels = tmp_path_factory.mktemp("sglang-wheel")
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "download", "--no-deps", SGLANG, "-d", str(wheels)], check=True, timeout=600)
        with zipfile.ZipFile(next(wheels.glob("sglang-*.whl"))) as wheel:
            wheel.extractall(pkg, [n for n in wheel.namelist() if n.startswith("sglang/")])
        subprocess.run([*pip, "install", "--target", str(deps), *FRONTEND_DEPS], check=True, timeout=600)
        done.write_text("ok")
    return pkg, deps
