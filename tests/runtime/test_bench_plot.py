"""The bench's `--plot`: the ratios it draws are the table's (speed over the baseline's, times
inverted, counts left out), and the figure is written with one bar per metric and dtype."""

from __future__ import annotations

from pathlib import Path

from radixlm.runtime.bench.plot import plot_ratios, ratios, speed_ratio

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


def test_the_figure_is_written(tmp_path: Path) -> None:
    out = tmp_path / "bench.png"
    assert plot_ratios(out, OURS, BASE) == 5
    assert out.read_bytes().startswith(b"\x89PNG") and out.stat().st_size > 5_000
    assert plot_ratios(tmp_path / "empty.png", {"float32": {"W1 decode tok/s": 1.0}}, {}) == 0
