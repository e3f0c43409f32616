"""The bench's `--plot`: the ratios it draws are the table's (speed over the baseline's, times
inverted, counts left out), and the figure is written with one bar per metric and dtype."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixlm.runtime.bench.plot import best_ratios, plot_ratios, ratios, speed_ratio

OURS = {"float32": {"W1 decode tok/s": 100.0, "W1 TTFT s": 0.5, "W4 json_schema valid /16": 16.0,
                    "W4 json_schema s/request": 1.0, "W5 prefill tok/s": 900.0},
        "bfloat16": {"W1 decode tok/s": 150.0, "W1 TTFT s": 0.25}}
BASE = {"float32": {"W1 decode tok/s": 50.0, "W1 TTFT s": 1.0, "W4 json_schema valid /16": 15.0,
                    "W4 json_schema s/request": 2.0},
        "bfloat16": {"W1 decode tok/s": 100.0, "W1 TTFT s": 0.5}}


def test_ratios_are_the_tables() -> None:
    assert speed_ratio("W1 decode tok/s", 100.0, 50.0) == 2.0
    assert speed_ratio("W1 TTFT s", 0.5, 1.0) == 2.0  # a time: lower is better
    assert speed_ratio("W4 json_schema valid /16", 16.0, 15.0) is None  # a count
    assert speed_ratio("W1 decode tok/s", 0.0, 50.0) is None
    assert ratios(OURS, BASE) == {
        "W1 decode tok/s": {"float32": 2.0, "bfloat16": 1.5}, "W1 TTFT s": {"float32": 2.0, "bfloat16": 2.0},
        "W4 json_schema s/request": {"float32": 2.0}}  # W5: no baseline figure


def test_a_peer_is_compared_best_against_best() -> None:
    """radixlm's best over its dtypes against the peer's best over its configurations."""
    peer = {"W1 decode tok/s": 120.0, "W1 TTFT s": 0.5, "W3 wall s": 2.0}
    assert best_ratios(OURS, peer) == {"W1 decode tok/s": 1.25, "W1 TTFT s": 2.0}  # 150 / 120; 0.5 / 0.25; no W3


def test_the_figure_is_written(tmp_path: Path) -> None:
    out = tmp_path / "bench.png"
    assert plot_ratios(out, OURS, BASE) == 5
    assert plot_ratios(tmp_path / "peers.png", OURS, BASE, {"llama.cpp": {"W1 decode tok/s": 120.0}}) == 6
    assert out.read_bytes().startswith(b"\x89PNG") and out.stat().st_size > 5_000
    assert plot_ratios(tmp_path / "empty.png", {"float32": {"W1 decode tok/s": 1.0}}, {}) == 0


def test_the_serving_sweep_runs_each_concurrency_and_draws_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`--serving --concurrency 1,4,16 --plot`: every workload at every level, a table each, one
    figure (the HTTP replay is replaced by figures that depend on the level)."""
    from radixlm.runtime.bench import serving

    async def replay(url: str, prompts: list[str], new_tokens: int, concurrency: int,
                     client: str = "aiohttp") -> dict[str, float]:
        return {"requests/s": concurrency / 2, "output tok/s": 10.0 * concurrency, "wall s": 1.0,
                "TTFT p50 s": 0.1 * concurrency, "TTFT p99 s": 0.2 * concurrency, "ITL p50 ms": 20.0,
                "ITL p99 ms": 40.0}

    monkeypatch.setattr(serving, "replay", replay)
    monkeypatch.setattr(serving.httpx, "post", lambda *a, **k: None)
    out = tmp_path / "serving.png"
    served = serving.run_serving("http://127.0.0.1:9", [1, 4, 16], [], repeats=1, plot=str(out))
    assert sorted(served) == [1, 4, 16] and all(set(by_name) == {"W2", "W3"} for by_name in served.values())
    assert served[16]["W3"]["output tok/s"] == 160.0
    printed = capsys.readouterr().out
    assert all(f"## serving, {c} concurrent" in printed for c in (1, 4, 16))
    assert out.read_bytes().startswith(b"\x89PNG")


def test_a_bad_concurrency_list_is_refused() -> None:
    from radixlm.runtime.bench.__main__ import main

    for bad in ("0", "1,x", ""):
        with pytest.raises(SystemExit) as exc:
            main(["--serving", "--concurrency", bad])
        assert exc.value.code == 2
