"""The bench's figures (`--plot out.png`). Engine bench: its table as radixlm's ratio against
transformers for each metric that has one (throughput: ours / theirs; times: theirs / ours; so
right of the 1.0 line is radixlm faster), one bar per dtype; with peers (llama.cpp), one more bar
per peer: radixlm's best over its precisions against the peer's best over its configurations. Serving bench (`--serving
--concurrency 1,8,32`): output throughput and TTFT / inter-token latency against concurrency.
Needs matplotlib (the `plot` extra: `pip install 'radixlm[plot]'`), imported only when a figure
is asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

Result = dict[str, float]


def speed_ratio(key: str, ours: float, base: float) -> float | None:
    """radixlm's speed over the baseline's for one table row (None: a count, or a zero)."""
    lower_is_better = key.endswith(" s") or key.endswith("s/request")
    if not (lower_is_better or key.endswith("tok/s")) or min(ours, base) <= 0:
        return None
    return base / ours if lower_is_better else ours / base


def ratios(ours_by_dtype: dict[str, Result], base_by_dtype: dict[str, Result]) -> dict[str, dict[str, float]]:
    """metric -> dtype -> ratio, for the metrics both systems measured."""
    out: dict[str, dict[str, float]] = {}
    for dtype, ours in ours_by_dtype.items():
        base = base_by_dtype.get(dtype, {})
        for key, value in ours.items():
            ratio = speed_ratio(key, value, base[key]) if key in base else None
            if ratio is not None:
                out.setdefault(key, {})[dtype] = ratio
    return out


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display
    import matplotlib.pyplot as plt

    return plt


def best_ratios(ours_by_dtype: dict[str, Result], peer_best: Result) -> dict[str, float]:
    """metric -> radixlm's best figure over its dtypes against a peer's best (`peer_best`)."""
    out: dict[str, float] = {}
    for key, theirs in peer_best.items():
        mine = [r[key] for r in ours_by_dtype.values() if key in r]
        if not mine:
            continue
        lower_is_better = key.endswith(" s") or key.endswith("s/request")
        ratio = speed_ratio(key, min(mine) if lower_is_better else max(mine), theirs)
        if ratio is not None:
            out[key] = ratio
    return out


def plot_ratios(path: str | Path, ours_by_dtype: dict[str, Result], base_by_dtype: dict[str, Result],
                peers: dict[str, Result] | None = None) -> int:
    """Write the figure to `path` (PNG, SVG or PDF by its suffix); returns the number of bars.
    `peers`: peer name -> its best figure per metric (e.g. llama.cpp's over its configurations)."""
    plt = _pyplot()
    table = {key: {f"vs transformers, {d}": r for d, r in row.items()} for key, row in ratios(ours_by_dtype, base_by_dtype).items()}
    for name, best in (peers or {}).items():
        for key, ratio in best_ratios(ours_by_dtype, best).items():
            table.setdefault(key, {})[f"vs {name}, best of each"] = ratio
    metrics = list(table)
    dtypes = list(dict.fromkeys(series for row in table.values() for series in row))
    height = 0.8 / max(1, len(dtypes))
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.5 * max(1, len(metrics)) * max(1, len(dtypes)) ** 0.5))
    num_bars = 0
    for i, dtype in enumerate(dtypes):
        ys = [m - 0.4 + height * (i + 0.5) for m, key in enumerate(metrics) if dtype in table[key]]
        values = [table[key][dtype] for key in metrics if dtype in table[key]]
        bars = ax.barh(ys, values, height=height, label=dtype)
        ax.bar_label(bars, labels=[f"{v:.2f}x" for v in values], padding=3, fontsize=8)
        num_bars += len(values)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.margins(x=0.15)  # room for the bar labels
    ax.set_yticks(range(len(metrics)), metrics)
    ax.invert_yaxis()
    ax.set_xlabel("radixlm speed / the other system's speed (right of 1.0: radixlm faster)")
    ax.set_title("radixlm against " + " and ".join(["transformers", *(peers or {})]) + ", per workload")
    if dtypes:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return num_bars


def plot_serving(path: str | Path, served: dict[int, dict[str, dict[str, float]]]) -> int:
    """`served`: concurrency -> workload -> the serving bench's figures. Left: output tok/s;
    right: TTFT p50 (solid) and ITL p50 (dashed), against concurrency. Returns the lines drawn."""
    plt = _pyplot()
    levels = sorted(served)
    workloads = sorted({name for by_name in served.values() for name in by_name})
    fig, (tput, lat) = plt.subplots(1, 2, figsize=(10, 3.8))
    lines = 0
    for name in workloads:
        xs = [c for c in levels if name in served[c]]
        (line,) = tput.plot(xs, [served[c][name]["output tok/s"] for c in xs], marker="o", label=name)
        color = line.get_color()  # one colour per workload in both panels
        lat.plot(xs, [served[c][name]["TTFT p50 s"] for c in xs], marker="o", color=color, label=f"{name} TTFT p50")
        lat.plot(xs, [served[c][name]["ITL p50 ms"] / 1000 for c in xs], marker="s", linestyle="--", color=color,
                 label=f"{name} ITL p50")
        lines += 3
    for ax, title, ylabel in ((tput, "throughput", "output tokens / s"), (lat, "latency", "seconds")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent streaming clients")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("radixlm serving bench")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return lines
