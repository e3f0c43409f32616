"""`python -m radixlm.runtime.bench.report docs/results/*.json --markdown docs/bench-results.md
--readme README.md`: the bench's result files (radixlm.runtime.bench.results) as markdown.

--markdown PAGE writes the whole page: one section per result file, newest first (ties by file
name), each titled from the machine, what ran and the date, with the command, the machine and
the code it ran, the notes and every table. --readme FILE rewrites the block between
`<!-- generated: bench headline from PATH ... -->` and `<!-- end generated -->` (paths relative to
FILE's folder): per result file named there, radixlm's best figure of each headline metric and
its ratio to llama.cpp's best in the same run. Output depends only on the files: tests fail when a
page differs from what this renders (tests/runtime/test_bench_results.py).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from radixlm.runtime.bench.plot import speed_ratio
from radixlm.runtime.bench.results import COMPARISON_KINDS, load

PAGE_COMMAND = ("python -m radixlm.runtime.bench.report docs/results/*.json --markdown docs/bench-results.md "
                "--readme README.md")
HEADLINE_BEGIN = re.compile(r"<!-- generated: bench headline from (.+?) -->\n")
HEADLINE_END = "<!-- end generated -->"
HEADLINE_METRICS = {"W1 decode tok/s": "W1 decode tok/s", "W1 TTFT s": "W1 TTFT s", "W2 output tok/s": "W2 tok/s",
                    "W3 wall s": "W3 s", "W5 prefill tok/s": "W5 tok/s"}
Data = dict[str, Any]


# ---------------------------------------------------------------- numbers


def number(value: float | int | None) -> str:
    """A figure as the pages show it: counts exactly, other values to 4 significant digits (no
    trailing zeros), thousands separated; None as "-"."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    text = f"{value:,.{max(0, 3 - math.floor(math.log10(abs(value))))}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def ratio(value: float | None) -> str:
    """A ratio: two decimals at most, one at least ("2.0x", "30.2x", "1.87x")."""
    if value is None:
        return "-"
    text = f"{value:.2f}"
    return (text[:-1] if text.endswith("0") else text) + "x"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|---" * len(header) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# ---------------------------------------------------------------- tables, by kind


def _system_cell(figure: dict[str, Any] | None) -> str:
    if figure is None:
        return "-"
    config = figure.get("config")
    return number(figure.get("value")) + (f" ({config})" if config else "")


def comparison_table(rows: list[Data]) -> list[str]:
    """engine, best, same_precision: a row per (precision,) metric, a column per system and per ratio."""
    systems = list(dict.fromkeys(name for row in rows for name in row["systems"]))
    others = list(dict.fromkeys(name for row in rows for name in row["ratios"]))
    has_precision = any("precision" in row for row in rows)
    header = [*(["precision"] if has_precision else []), "metric", *systems, *(f"vs {name}" for name in others)]
    return _table(header, [
        [*([row.get("precision", "-")] if has_precision else []), f"{row['workload']} {row['metric']}",
         *(_system_cell(row["systems"].get(name)) for name in systems),
         *(ratio(row["ratios"].get(name)) for name in others)]
        for row in rows])


def paired_table(rows: list[Data]) -> list[str]:
    """A row per (precision, llama.cpp configuration), a column per metric: radixlm / llama.cpp, ratio."""
    metrics = list(dict.fromkeys(f"{row['workload']} {row['metric']}" for row in rows))
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for row in rows:
        ours, theirs = row["systems"]["radixlm"], row["systems"]["llama.cpp"]
        key = (row["precision"], theirs.get("config") or "-")
        cells.setdefault(key, {})[f"{row['workload']} {row['metric']}"] = (
            f"{number(ours['value'])} / {number(theirs['value'])}, {ratio(row['ratios'].get('llama.cpp'))}")
    return _table(["precision", "llama.cpp", *metrics],
                  [[precision, config, *(by_metric.get(m, "-") for m in metrics)]
                   for (precision, config), by_metric in cells.items()])


def neighbour_table(rows: list[Data]) -> list[str]:
    systems = list(dict.fromkeys(name for row in rows for name in row["systems"]))

    def cell(figures: dict[str, Any] | None) -> str:
        if figures is None:
            return "-"
        return f"{number(figures['quiet'])} -> {number(figures['loaded'])}, {ratio(figures['slowdown'])}"

    return _table(["precision", "metric", *(f"{name}: quiet -> loaded, slowdown" for name in systems)],
                  [[row["precision"], f"{row['workload']} {row['metric']}",
                    *(cell(row["systems"].get(name)) for name in systems)] for row in rows])


SERVED_METRICS = ("requests/s", "output tok/s", "wall s", "TTFT p50 s", "TTFT p99 s", "ITL p50 ms", "ITL p99 ms")


def serving_table(rows: list[Data]) -> list[str]:
    return _table(["workload", *SERVED_METRICS, "in-process output tok/s", "served / in-process"], [
        [row["workload"], *(number(row["served"].get(m)) for m in SERVED_METRICS),
         number(row.get("in-process", {}).get("output tok/s")), number(row.get("served / in-process"))]
        for row in rows])


def serving_cpu_table(rows: list[Data]) -> list[str]:
    processes = list(dict.fromkeys(row["process"] for row in rows))
    by_workload: dict[str, dict[str, Data]] = {}
    for row in rows:
        by_workload.setdefault(row["workload"], {})[row["process"]] = row

    def cell(row: Data | None) -> str:
        if row is None:
            return "-"
        per_token = f"{number(row['cpu us/output token'])} us/token"
        return per_token if row.get("cpu s/run") is None else f"{number(row['cpu s/run'])} s ({per_token})"

    return _table(["workload", *processes],
                  [[workload, *(cell(by_process.get(p)) for p in processes)] for workload, by_process in by_workload.items()])


def frontend_table(rows: list[Data]) -> list[str]:
    def pair(value: list[int] | None) -> str:
        return "-" if value is None else f"{value[0]}/{value[1]}"

    def hit(row: Data) -> str:
        return (f"{row['cache hit rate']:.1%} ({number(row['radixlm cached tokens'])} / "
                f"{number(row['radixlm prompt tokens'])})")

    table = _table(
        ["workload", "programs", "radixlm s/program", "naive s/program", "speedup", "radixlm programs/s",
         "cache hit rate (cached / prompt tokens)", "prompt tokens computed, radixlm / naive", "identical programs",
         "identical values"],
        [[row["workload"], number(row["programs"]), number(row["radixlm s/program"]),
          number(row.get("naive s/program")), ratio(row.get("speedup")), number(row.get("radixlm programs/s")), hit(row),
          f"{number(row['radixlm prompt tokens'] - row['radixlm cached tokens'])} / {number(row.get('naive prompt tokens'))}",
          pair(row.get("identical programs")), pair(row.get("identical values"))] for row in rows])
    return table + [""] + [
        f"- {row['workload']}: {row['title']}" + "".join(f"; {who} {row[f'{who} check']}" for who in ("radixlm", "naive")
                                                         if row.get(f"{who} check")) for row in rows]


def grammar_table(rows: list[Data], meta: Data) -> list[str]:
    from radixlm.runtime.bench.grammar import GrammarBenchConfig, format_table
    from radixlm.runtime.bench.grammar_json import row_from_json

    config = GrammarBenchConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in meta.items()})
    return format_table([row_from_json(row) for row in rows], config)


def _caption(table: Data) -> str:
    meta, kind = table["meta"], table["kind"]
    if kind == "paired":
        return (f"{table['title']}, {meta['turns']} turns: radixlm / llama.cpp (medians), the median of the "
                "per-turn ratios (>1: radixlm is better)")
    if kind in COMPARISON_KINDS:
        has_ratios = any(row["ratios"] for row in table["rows"])
        return table["title"] + (" (ratios: radixlm's over the other's, >1: radixlm is better)" if has_ratios else "")
    if kind == "serving":
        return f"{table['title']} ({meta['client']}), {meta['server']}, median of {meta['repeats']}"
    if kind == "serving_cpu":
        mean = "" if meta.get("repeats") is None else f" (mean of {meta['repeats']})"
        return f"{table['title']}{mean}: CPU seconds, and microseconds per output token"
    return table["title"]


def render_table(table: Data) -> list[str]:
    kind, rows = table["kind"], table["rows"]
    if kind == "paired":
        body = paired_table(rows)
    elif kind in COMPARISON_KINDS:
        body = comparison_table(rows)
    elif kind == "grammar":
        body = grammar_table(rows, table["meta"])
    else:
        body = {"neighbour": neighbour_table, "serving": serving_table, "serving_cpu": serving_cpu_table,
                "frontend": frontend_table}[kind](rows)
    return [f"**{_caption(table)}**", "", *body]


# ---------------------------------------------------------------- sections


def machine_text(machine: Data) -> str:
    """e.g. "AMD EPYC, avx512 (BF16, VNNI)": the CPU, radixlm's ISA level and what it adds that counts."""
    features = set(machine.get("isa_features") or ())
    extras = [name for name, present in (("BF16", "avx512_bf16" in features),
                                         ("VNNI", bool({"avx512_vnni", "avx_vnni"} & features)),
                                         ("AMX", any(f.startswith("amx") for f in features))) if present]
    level = machine.get("isa_level")
    isa = "" if level is None else f", {level}" + (f" ({', '.join(extras)})" if extras else "")
    return f"{machine.get('cpu') or 'machine not recorded'}{isa}"


def what_ran(data: Data) -> str:
    tables = data["tables"]
    kinds = [t["kind"] for t in tables]
    systems = list(dict.fromkeys(name for t in tables if t["kind"] in (*COMPARISON_KINDS, "neighbour")
                                 for row in t["rows"] for name in row["systems"]))
    workloads = sorted({row["workload"] for t in tables if t["kind"] in (*COMPARISON_KINDS, "neighbour")
                        for row in t["rows"]})
    parts = []
    if systems:
        parts.append(_and(systems) + (" in turns" if "paired" in kinds else "")
                     + (" beside a busy neighbour" if "neighbour" in kinds else "") + ", " + " ".join(workloads))
    for table in tables:
        if table["kind"] == "serving":
            parts.append(f"served to {table['meta']['concurrency']} {table['meta']['client']} clients, "
                         + " ".join(row["workload"] for row in table["rows"]))
    if "serving_cpu" in kinds and "serving" not in kinds:
        parts.append("serving: CPU per process")
    if "frontend" in kinds:
        parts.append("frontend programs")
    if "grammar" in kinds:
        parts.append("grammar backends")
    return "; ".join(parts)


def title(data: Data) -> str:
    return f"{machine_text(data['machine'])}: {what_ran(data)} ({data['date'][:10]})"


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading (as tests/test_docs.py reads them)."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")


def section(heading: str, data: Data) -> list[str]:
    machine = data["machine"]
    env = " ".join(f"{k}={v}" for k, v in data.get("env", {}).items())
    command = data.get("command")
    lines = [f"## {heading}", ""]
    lines += ["```", f"{env} {command}".strip(), "```", ""] if command else ["The command was not recorded.", ""]
    cpu_ids = [f"{name} {machine[key]}" for name, key in (("family", "cpu_family"), ("model", "cpu_model"))
               if machine.get(key) is not None]
    about = [f"Machine: {machine.get('cpu') or 'not recorded'}" + (f" ({', '.join(cpu_ids)})" if cpu_ids else "")
             + (f", {machine['num_cpus']} CPUs" if machine.get("num_cpus") else "")
             + (f", ISA level {machine['isa_level']}" if machine.get("isa_level") else "")
             + (f" ({', '.join(machine['isa_features'])})" if machine.get("isa_features") else "") + "."]
    if machine.get("description"):
        about.append(machine["description"].rstrip(".") + ".")
    commit = data.get("commit")
    about.append(f"Code: {commit[:12]}" + (" with uncommitted changes." if data.get("is_dirty") else ".")
                 if commit else "Code: not recorded.")
    if not data.get("source", "").endswith("--results"):
        about.append(f"Source: {data['source']}.")
    lines += [" ".join(about), ""]
    lines += [f"- {note}" for note in data.get("notes", [])] + ([""] if data.get("notes") else [])
    for table in data["tables"]:
        lines += [*render_table(table), ""]
    return lines


def sections(paths: Sequence[Path]) -> list[tuple[str, Data]]:
    """(heading, data) per file, newest first, ties by file name; a heading two files share gets
    the file's name."""
    loaded = sorted(((path, load(path)) for path in paths), key=lambda item: item[0].name)
    loaded.sort(key=lambda item: item[1]["date"][:10], reverse=True)
    headings = [title(data) for _, data in loaded]
    return [(heading if headings.count(heading) == 1 else f"{heading} [{path.stem}]", data)
            for heading, (path, data) in zip(headings, loaded)]


def render_page(paths: Sequence[Path]) -> str:
    found = sections(paths)
    lines = [
        "# Bench results",
        "",
        "<!-- generated: edit the result files in docs/results/, then run",
        f"     {PAGE_COMMAND} -->",
        "",
        "The bench's current results, one section per result file in [`docs/results/`](results) (written by",
        "`python -m radixlm.runtime.bench ... --results FILE.json`), newest first. How to run the bench and",
        "read its tables: [performance](performance.md). Earlier results are in the git history of the",
        "result files.",
        "",
        *(f"- [{heading}](#{anchor(heading)})" for heading, _ in found),
        "",
    ]
    for heading, data in found:
        lines += section(heading, data)
    return "\n".join(lines).rstrip("\n") + "\n"


# ---------------------------------------------------------------- the README's headline


def headline_figures(data: Data) -> dict[str, tuple[float, str, float | None]]:
    """Headline metric -> (radixlm's best value, its precision, its ratio to llama.cpp's best):
    from the run's best table, else from its paired or same-precision rows."""
    tables = {t["kind"]: t for t in data["tables"]}
    out: dict[str, tuple[float, str, float | None]] = {}
    if "best" in tables:
        for row in tables["best"]["rows"]:
            ours = row["systems"].get("radixlm")
            key = f"{row['workload']} {row['metric']}"
            if key in HEADLINE_METRICS and ours and ours["value"] is not None:
                out[key] = (ours["value"], ours.get("config", ""), row["ratios"].get("llama.cpp"))
        return out
    table = tables.get("paired") or tables.get("same_precision")
    for key in HEADLINE_METRICS:
        rows = [r for r in (table["rows"] if table else []) if f"{r['workload']} {r['metric']}" == key]
        ours = [(r["systems"]["radixlm"]["value"], r["precision"]) for r in rows if r["systems"]["radixlm"]["value"]]
        theirs = [r["systems"]["llama.cpp"]["value"] for r in rows if r["systems"]["llama.cpp"]["value"]]
        if ours and theirs:
            pick = min if key.endswith(" s") else max
            value, precision = pick(ours, key=lambda pair: pair[0])
            out[key] = (value, precision, speed_ratio(key, value, pick(theirs)))
    return out


def headline(paths: Sequence[Path]) -> str:
    rows = []
    for path in paths:
        data = load(path)
        figures = headline_figures(data)
        rows.append([f"{machine_text(data['machine'])} ({data['date'][:10]})", *(
            "-" if key not in figures else f"{number(figures[key][0])} {figures[key][1]}, {ratio(figures[key][2])}"
            for key in HEADLINE_METRICS)])
    return "\n".join(_table(["CPU, ISA level (date)", *HEADLINE_METRICS.values()], rows)) + "\n"


def headline_blocks(text: str, base: Path) -> list[tuple[int, int, str]]:
    """(start, end, rendered) of each headline block's content in `text`; its paths relative to `base`."""
    blocks = []
    for begin in HEADLINE_BEGIN.finditer(text):
        end = text.find(HEADLINE_END, begin.end())
        if end < 0:
            raise ValueError(f"{begin.group(0).strip()} has no {HEADLINE_END}")
        blocks.append((begin.end(), end, headline([base / p for p in begin.group(1).split()])))
    return blocks


def rewrite_headlines(path: Path) -> None:
    text = path.read_text()
    blocks = headline_blocks(text, path.parent)
    if not blocks:
        raise ValueError(f"{path} has no <!-- generated: bench headline from ... --> block")
    for start, end, rendered in reversed(blocks):
        text = text[:start] + rendered + text[end:]
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixlm.runtime.bench.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help="result files (docs/results/*.json)")
    parser.add_argument("--markdown", metavar="PAGE", help="write the page of the files here (default: print it)")
    parser.add_argument("--readme", metavar="FILE", type=Path, help="rewrite FILE's headline blocks")
    args = parser.parse_args(argv)
    if args.files:
        page = render_page(args.files)
        if args.markdown:
            Path(args.markdown).write_text(page)
        else:
            sys.stdout.write(page)
    if args.readme:
        rewrite_headlines(args.readme)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
