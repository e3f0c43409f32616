"""The big-MoE serving demonstration's harness (runtime/bench/moe_serve.py) end to end at the tiny
shape: `radixlm serve --model-path FILE.gguf` with no other flag in a child process, requests over
HTTP, the table and the results file. (Its figures come from the 30B-A3B shape, never from here.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixlm.runtime.bench import moe_serve


def test_serves_the_generated_gguf_and_writes_its_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from radixlm.runtime.model.model_files import cache_dir

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "extensions").symlink_to(cache_dir() / "extensions")  # the built C++ kernels, shared
    monkeypatch.setenv("RADIXLM_CACHE", str(cache))
    out = tmp_path / "run.json"
    assert moe_serve.main(["--shape", "tiny", "--workloads", "M1", "--repeats", "1", "--new-tokens", "3",
                           "--no-peer", "--results", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| M1 decode tok/s |" in printed and "| load s |" in printed
    (table,) = json.loads(out.read_text())["tables"]
    value = {(row["workload"], row["metric"]): row["systems"]["radixlm"]["value"] for row in table["rows"]}
    assert value["M1", "decode tok/s"] > 0 and value["serve", "load s"] > 0
    assert value["serve", "load peak resident GiB"] > 0.1  # the server's processes, summed
