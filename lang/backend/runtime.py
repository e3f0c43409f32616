"""Runtime: start a radixlm server in a subprocess and use it as a RuntimeEndpoint (SGLang's
`sgl.Runtime(model_path=...)`), for programs that want a server without running one by hand."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

from radixlm.backend.base import BackendError
from radixlm.backend.runtime_endpoint import RuntimeEndpoint


class Runtime(RuntimeEndpoint):
    """`Runtime(model_path=None, **server_args)`: keyword arguments are the server's flags by
    their ServerArgs names (`max_total_tokens=4096`, `random_seed=0`; True booleans become
    `--flag`). The server binds 127.0.0.1 on a free port; `shutdown()` stops it."""

    def __init__(self, model_path: str | None = None, startup_timeout: float = 300.0, **server_args: Any):
        port = server_args.pop("port", None) or _free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="radixlm-runtime-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = [sys.executable, "-m", "radixlm.runtime.server.serve", "--port", str(port)]
        if model_path is not None:
            cmd += ["--model-path", str(model_path)]
        for name, value in server_args.items():
            flag = "--" + name.replace("_", "-")
            if value is True:
                cmd.append(flag)
            elif value is False:
                cmd.append("--no-" + name.replace("_", "-"))
            elif value is not None:
                cmd += [flag, str(value)]
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        url = f"http://127.0.0.1:{port}"
        self._wait_healthy(url, startup_timeout, server_args.get("api_key"))
        super().__init__(url, api_key=server_args.get("api_key"))

    def _wait_healthy(self, url: str, timeout: float, api_key: str | None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BackendError(f"the server exited with {self.process.returncode}; its log: {self.log.name}\n{self._log_tail()}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.process.kill()
        raise BackendError(f"the server did not become healthy in {timeout:.0f} s; its log: {self.log.name}\n{self._log_tail()}")

    def _log_tail(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()[-2000:]

    def shutdown(self) -> None:
        super().shutdown()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
