"""The bench's results as data (radixlm.runtime.bench.results) and the pages rendered from them
(radixlm.runtime.bench.report): docs/bench-results.md and README.md's current figures are what the
result files in docs/results/ render; each printer records the rows it prints, unrounded, and
prints as before; `--results` writes a real run's file (the default model, W1, one repeat), which
renders. No timing is asserted."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from radixlm.runtime.bench import __main__ as bench
from radixlm.runtime.bench import frontend, grammar, neighbour, report, results, serving
from radixlm.runtime.bench import llamacpp_peer as lp
from radixlm.runtime.bench.grammar_json import row_from_json, row_to_json
from radixlm.runtime.bench.llamacpp_peer import PeerConfig

ROOT = Path(__file__).resolve().parents[2]
RESULT_FILES = sorted((ROOT / "docs" / "results").glob("*.json"))
PAGE = ROOT / "docs" / "bench-results.md"


# ---------------------------------------------------------------- the pages


def test_the_results_page_is_generated_from_the_result_files() -> None:
    assert RESULT_FILES, "no result files in docs/results/"
    assert PAGE.read_text() == report.render_page(RESULT_FILES), (
        "docs/bench-results.md is out of date with docs/results/*.json; regenerate it with\n"
        f"    .venv/bin/{report.PAGE_COMMAND}"
    )


def test_the_readme_figures_are_generated_from_their_result_files() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = report.headline_blocks(text, ROOT)
    assert len(blocks) == 1, "README.md lacks its <!-- generated: bench headline from ... --> block"
    for start, end, rendered in blocks:
        assert text[start:end] == rendered, (
            "README.md's current figures are out of date with their result files; regenerate them with\n"
            f"    .venv/bin/{report.PAGE_COMMAND}"
        )


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.name)
def test_each_result_file_is_one_run_in_the_format(path: Path) -> None:
    data = results.load(path)
    assert set(data) == {"format", "source", "command", "env", "date", "commit", "is_dirty", "machine", "notes",
                         "tables"}
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}:\d{2}Z)?", data["date"])
    assert path.name.startswith(data["date"][:10])
    assert data["source"].endswith("--results") or data["source"].startswith("transcribed from ")
    assert data["tables"] and all(t["rows"] for t in data["tables"])
    for table in data["tables"]:
        if table["kind"] in results.COMPARISON_KINDS:
            assert all({"workload", "metric", "systems", "ratios"} <= set(row) for row in table["rows"])
    assert path.read_text() == results.dumps(data)  # as the writer writes it: a row per line


# ---------------------------------------------------------------- rendering


def test_numbers_keep_four_significant_digits_and_counts_exactly() -> None:
    assert [report.number(v) for v in (306.2871, 0.022, 1416.0, 2.0, 0.0, 13990, 0.0266231, None)] == [
        "306.3", "0.022", "1,416", "2", "0", "13,990", "0.02662", "-"]
    assert [report.ratio(v) for v in (2.0, 30.2, 1.8734, 10.08, None)] == ["2.0x", "30.2x", "1.87x", "10.08x", "-"]


def _paired_run(date: str = "2026-11-27T10:00:00Z") -> dict[str, Any]:
    rows = [results.comparison_row(key, {"radixlm": (ours, None), "llama.cpp": (theirs, f"{precision} b32")},
                                   {"llama.cpp": r}, precision)
            for precision, key, ours, theirs, r in (
                ("q4_1", "W1 decode tok/s", 300.0, 160.0, 1.9), ("q8_0", "W1 decode tok/s", 200.0, 170.0, 1.2),
                ("q4_1", "W1 TTFT s", 0.02, 0.06, 3.1), ("q8_0", "W1 TTFT s", 0.03, 0.05, 1.6))]
    return {"format": results.FORMAT, "source": "python -m radixlm.runtime.bench --results",
            "command": "python -m radixlm.runtime.bench --paired", "env": {"RADIXLM_CPU_ISA": "avx2"}, "date": date,
            "commit": "0" * 40, "is_dirty": False,
            "machine": {"cpu": "Some CPU", "cpu_family": 6, "cpu_model": 1, "num_cpus": 2, "isa_level": "avx2",
                        "isa_features": ["avx2", "f16c", "fma"]},
            "notes": [], "tables": [{"kind": "paired", "title": "paired", "meta": {"turns": 3}, "rows": rows}]}


def test_the_headline_takes_each_side_best_and_their_ratio() -> None:
    figures = report.headline_figures(_paired_run())
    # radixlm's best W1 decode is q4_1's 300 against llama.cpp's best, 170 (its q8_0): 1.76x, not a
    # per-precision ratio; times: the lowest of each side
    assert figures["W1 decode tok/s"] == (300.0, "q4_1", pytest.approx(300 / 170))
    assert figures["W1 TTFT s"] == (0.02, "q4_1", pytest.approx(0.05 / 0.02))


def test_a_page_has_a_section_per_run_newest_first(tmp_path: Path) -> None:
    older, newer = tmp_path / "2026-11-26-a.json", tmp_path / "2026-11-27-b.json"
    older.write_text(results.dumps(_paired_run("2026-11-26T10:00:00Z")))
    newer.write_text(results.dumps(_paired_run()))
    page = report.render_page([older, newer])
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert headings == ["## Some CPU, avx2: radixlm and llama.cpp in turns, W1 (2026-11-27)",
                        "## Some CPU, avx2: radixlm and llama.cpp in turns, W1 (2026-11-26)"]
    assert "RADIXLM_CPU_ISA=avx2 python -m radixlm.runtime.bench --paired" in page
    assert "| q4_1 | q4_1 b32 | 300 / 160, 1.9x | 0.02 / 0.06, 3.1x |" in page
    assert page == report.render_page([newer, older])  # the order of the arguments does not matter
    assert f"](#{report.anchor(headings[0][3:])})" in page


def test_the_readme_block_is_rewritten_between_its_markers(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(results.dumps(_paired_run()))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- generated: bench headline from run.json -->\nold\n<!-- end generated -->\nrest\n")
    report.rewrite_headlines(readme)
    text = readme.read_text()
    assert text.startswith("intro\n<!-- generated: bench headline from run.json -->\n| CPU, ISA level (date) |")
    assert "| Some CPU, avx2 (2026-11-27) | 300 q4_1, 1.76x | 0.02 q4_1, 2.5x | - | - | - |" in text
    assert text.endswith("<!-- end generated -->\nrest\n") and "old" not in text


# ---------------------------------------------------------------- the printers record what they print


def test_the_peer_tables_record_their_rows_and_print_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    ours = {"bfloat16": {"W2 output tok/s": 180.0, "W3 wall s": 4.0, "W4 json_schema valid /16": 16.0}}
    base = {"bfloat16": {"W2 output tok/s": 90.0, "W3 wall s": 40.0}}
    peer = {PeerConfig("bf16", 32, True, 512): {"W2 output tok/s": 360.0, "W3 wall s": 2.0}}
    lp.print_peer_summary(ours, base, peer)
    lp.print_same_precision(ours, peer)
    printed = capsys.readouterr().out
    recorded = results.ResultTables()
    lp.print_peer_summary(ours, base, peer, recorded)
    lp.print_same_precision(ours, peer, recorded)
    assert capsys.readouterr().out == printed
    best, same = recorded.tables
    assert (best.kind, same.kind) == ("best", "same_precision")
    assert best.rows[0] == {"workload": "W2", "metric": "output tok/s", "systems": {
        "radixlm": {"value": 180.0, "config": "bfloat16"}, "transformers": {"value": 90.0, "config": "bfloat16"},
        "llama.cpp": {"value": 360.0, "config": "bf16 b32 fa-on ub512"}}, "ratios": {"transformers": 2.0, "llama.cpp": 0.5}}
    assert best.rows[2]["ratios"] == {}  # a count: no ratio, as printed
    assert same.rows[1] == {"precision": "bfloat16", "workload": "W3", "metric": "wall s", "systems": {
        "radixlm": {"value": 4.0}, "llama.cpp": {"value": 2.0, "config": "bf16 b32 fa-on ub512"}},
        "ratios": {"llama.cpp": 0.5}}


def test_the_engine_and_neighbour_tables_record_their_rows(capsys: pytest.CaptureFixture[str]) -> None:
    recorded = results.ResultTables()
    for dtype in ("float32", "q4_1"):
        bench._print_table(dtype, {"W1 decode tok/s": 100.123, "W4 json_schema valid /16": 15.0},
                           {"W1 decode tok/s": 20.0, "W4 json_schema valid /16": 0.0} if dtype == "float32" else None,
                           recorded)
    neighbour.print_neighbour_table("float32", {"radixlm": ({"W2 output tok/s": 400.0}, {"W2 output tok/s": 200.0})},
                                    recorded)
    engine, loaded = recorded.tables
    assert [(r["precision"], r["metric"], r["ratios"]) for r in engine.rows] == [
        ("float32", "decode tok/s", {"transformers": pytest.approx(5.00615)}), ("float32", "json_schema valid /16", {}),
        ("q4_1", "decode tok/s", {}), ("q4_1", "json_schema valid /16", {})]
    assert engine.rows[0]["systems"]["radixlm"] == {"value": 100.123}  # unrounded; printed 100.12
    assert "| W1 decode tok/s | 100.12 | 20.00 | 5.01x |" in capsys.readouterr().out
    assert loaded.rows == [{"precision": "float32", "workload": "W2", "metric": "output tok/s",
                            "systems": {"radixlm": {"quiet": 400.0, "loaded": 200.0, "slowdown": 2.0}}}]


def test_the_paired_table_records_both_sides_and_the_median_of_the_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    class Fake:
        def __init__(self, *args: Any) -> None:
            pass

        def shutdown(self) -> None:
            pass

        close = shutdown

    ours = {"W1": [{"W1 decode tok/s": 100.0}, {"W1 decode tok/s": 50.0}, {"W1 decode tok/s": 40.0}]}
    theirs = {"W1": [{"W1 decode tok/s": 50.0}, {"W1 decode tok/s": 100.0}, {"W1 decode tok/s": 20.0}]}
    monkeypatch.setattr(bench, "Ours", Fake)
    monkeypatch.setattr(bench, "LlamaCppPeer", Fake)
    monkeypatch.setattr(bench, "run_paired", lambda *args: (ours, theirs))
    recorded = results.ResultTables()
    bench.run_paired_table(["q4_1", "bfloat16"], ["W1"], lp.parse_peer_configs("q4_1:32:on:512"), 3, recorded)
    (table,) = recorded.tables
    assert (table.kind, table.meta) == ("paired", {"turns": 3})
    assert table.rows == [{"precision": "q4_1", "workload": "W1", "metric": "decode tok/s", "systems": {
        "radixlm": {"value": 50.0}, "llama.cpp": {"value": 50.0, "config": "q4_1 b32 fa-on ub512"}},
        "ratios": {"llama.cpp": 2.0}}]  # per turn 2.0, 0.5, 2.0; bfloat16 had no configuration: no row


def test_the_serving_tables_record_each_level(monkeypatch: pytest.MonkeyPatch) -> None:
    async def replay(url: str, prompts: list[str], new_tokens: int, concurrency: int,
                     client: str = "aiohttp") -> dict[str, float]:
        return {"requests/s": 1.0, "output tok/s": 10.0 * concurrency, "wall s": 1.0, "TTFT p50 s": 0.1,
                "TTFT p99 s": 0.2, "ITL p50 ms": 20.0, "ITL p99 ms": float("nan")}

    monkeypatch.setattr(serving, "replay", replay)
    monkeypatch.setattr(serving.httpx, "post", lambda *a, **k: None)
    recorded = results.ResultTables()
    served = serving.run_serving("http://127.0.0.1:9", [1, 4], [], repeats=1, results=recorded)
    tables = [t for t in recorded.tables if t.rows]  # no CPU table: not its own server
    assert [(t.kind, t.meta["concurrency"]) for t in tables] == [("serving", 1), ("serving", 4)]
    assert tables[1].meta == {"concurrency": 4, "client": "aiohttp", "repeats": 1, "server": "http://127.0.0.1:9"}
    assert tables[1].rows[0] == {"workload": "W2", "served": served[4]["W2"]}
    assert json.loads(results.dumps({"tables": [{"rows": tables[1].rows}]}))["tables"][0]["rows"][0]["served"][
        "ITL p99 ms"] is None  # NaN is not JSON


def test_the_frontend_table_records_each_report(capsys: pytest.CaptureFixture[str]) -> None:
    run = frontend.SystemRun(seconds=[2.0, 4.0], outputs=[{"x": "a"}, {"x": "b"}], prompt_tokens=200, cached_tokens=150)
    naive = frontend.SystemRun(seconds=[8.0], outputs=[{"x": "a"}, {"x": "c"}], prompt_tokens=90)
    reports = [frontend.WorkloadReport("F9", "a title", 2, run, naive, "ok", "")]
    recorded = results.ResultTables()
    frontend.print_reports(reports, "dtype float32", recorded)
    (table,) = recorded.tables
    assert table.rows == [{**reports[0].row(), "title": "a title"}]
    assert table.rows[0]["speedup"] == 8.0 / 3.0 and table.rows[0]["identical programs"] == (1, 2)
    rendered = "\n".join(report.frontend_table(json.loads(results.dumps({"tables": [{"rows": table.rows}]}))
                                               ["tables"][0]["rows"]))
    assert "| F9 | 2 | 1.5 | 4 | 2.67x | 0.6667 | 75.0% (75 / 100) | 25 / 90 | 1/2 | 1/2 |" in rendered


def test_grammar_rows_round_trip_and_render_as_the_bench_prints_them() -> None:
    rows = [
        grammar.BackendRow("outlines", {"4-field": 0.25, "200-property": grammar.Failure("refused", "out of memory")},
                           grammar.Percentiles(19.0, 193.0, 40, 1), grammar.Failure("error", "boom"),
                           grammar.W4Figures(0.54, 16, 16, 1.05, 4.0),
                           grammar.Coverage(6, 5, 4, [("s1", "refused", "too big"), ("s2", "invalid output", "bad")])),
        grammar.BackendRow("xgrammar", grammar.Failure("timeout", "no answer within 1 s")),
    ]
    config = grammar.QUICK
    recorded = results.ResultTables()
    results.table_rows(recorded, "grammar", "grammar backends", **dataclasses.asdict(config)).extend(
        map(row_to_json, rows))
    data = json.loads(results.dumps({"tables": [{"kind": t.kind, "meta": t.meta, "rows": t.rows}
                                                for t in recorded.tables]}))
    table = data["tables"][0]
    assert [row_from_json(row) for row in table["rows"]] == rows
    assert report.grammar_table(table["rows"], table["meta"]) == grammar.format_table(rows, config)


# ---------------------------------------------------------------- a real run


@pytest.mark.slow
def test_the_bench_writes_a_real_run_that_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from radixlm.runtime.model.kernel_policy import cpu_isa

    path = tmp_path / "run.json"
    argv = ["--workloads", "W1", "--dtypes", "float32", "--repeats", "1", "--no-baseline", "--results", str(path)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    data = results.load(path)
    assert data["command"] == "python -m radixlm.runtime.bench " + " ".join(argv)
    assert data["commit"] == subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                            text=True, check=True).stdout.strip()
    chosen = cpu_isa()
    assert data["machine"]["isa_level"] == (chosen.level if chosen else None)
    with open("/proc/cpuinfo") as f:
        assert data["machine"]["cpu"] in f.read()
    (table,) = data["tables"]
    assert table["kind"] == "engine"
    assert [(r["precision"], r["workload"], r["metric"]) for r in table["rows"]] == [
        ("float32", "W1", "TTFT s"), ("float32", "W1", "decode tok/s")]
    for row in table["rows"]:  # what the table printed, unrounded
        value = row["systems"]["radixlm"]["value"]
        assert value > 0 and f"| W1 {row['metric']} | {value:.2f} | - | - |" in printed
    page = report.render_page([path])
    assert f"python -m radixlm.runtime.bench {' '.join(argv)}" in page
    assert "| float32 | W1 decode tok/s |" in page


def test_a_results_path_in_no_folder_is_refused_before_the_run() -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--workloads", "W1", "--results", "/no/such/folder/run.json"])
    assert exc.value.code == 2
