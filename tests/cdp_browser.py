"""Headless Chromium driven over the Chrome DevTools Protocol (CDP), for tests of the dashboard.

Debian's `chromium` at /usr/bin/chromium (the Makefile's test setup installs it), started with
--no-sandbox (CI runs as root) and --disable-background-networking (no traffic but the page's),
on a private profile directory. The protocol is JSON messages over one WebSocket per page target:
`Browser.cdp(method, **params)` sends one command and returns its result; events are skipped.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from base64 import b64decode
from pathlib import Path
from types import TracebackType
from typing import Any

from radixlm_testing import wait_until
from websockets.sync.client import ClientConnection, connect

CHROMIUM = Path("/usr/bin/chromium")
START_GUARD_S = 60  # failure guards, not speed checks
COMMAND_GUARD_S = 60


class Browser:
    def __init__(self, width: int = 1280, height: int = 1000) -> None:
        self.profile = tempfile.mkdtemp(prefix="radixlm-chromium-")
        args = [str(CHROMIUM), "--headless=new", "--no-sandbox", "--disable-background-networking",
                "--disable-gpu", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--remote-debugging-port=0", f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
                "about:blank"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port = self._wait_for_port()
        self._exit = contextlib.ExitStack()
        self.ws: ClientConnection = self._exit.enter_context(
            connect(self._page_socket(port), max_size=64 * 1024 * 1024, open_timeout=COMMAND_GUARD_S))
        self._ids = itertools.count(1)

    def _wait_for_port(self) -> int:
        """Chromium writes the port it chose to DevToolsActivePort in the profile."""
        marker = Path(self.profile) / "DevToolsActivePort"

        def written() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            return marker.exists() and bool(marker.read_text().strip())

        wait_until(written, "chromium opened its DevTools port", START_GUARD_S)
        return int(marker.read_text().split()[0])

    def _page_socket(self, port: int) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=COMMAND_GUARD_S) as resp:
            targets = json.load(resp)
        return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")

    def cdp(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=COMMAND_GUARD_S))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.cdp("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.cdp("Page.enable")
        self.cdp("Page.navigate", url=url)
        self.wait_for_function("document.readyState === 'complete'")

    def wait_for_function(self, expression: str, timeout: float = 120) -> Any:
        """Evaluate `expression` until it is truthy (each try waits for the page's next animation
        frame, so the page runs between tries); the timeout only guards against a hang."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(f"new Promise(r => requestAnimationFrame(() => r({expression})))")
            if value:
                return value
        raise TimeoutError(f"not true within {timeout} s: {expression}")

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        width, height = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
        clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}  # the whole page
        shot = self.cdp("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)
        path.write_bytes(b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self._exit.close()
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, 15)
                self.proc.wait(timeout=30)
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
