"""The examples run end to end (tiny model / tiny server), so they cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ServerHandle

ROOT = Path(__file__).resolve().parents[2]


def run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_offline_engine_example(tiny_model_dir: Path) -> None:
    out = run("offline_engine.py", "--model-path", str(tiny_model_dir), "--max-new-tokens", "8")
    assert "constrained: {" in out and "cached prompt tokens" in out


def test_openai_client_example(tiny_server: ServerHandle) -> None:
    out = run("openai_client.py", "--url", tiny_server.url)
    assert "json: {'capital':" in out and "tool call: get_weather {'city':" in out
