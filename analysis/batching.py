"""Batch size as an axis: each method's speedup over ``ar`` at the same batch size, its CI, and the crossover.

A sweep with ``batch_sizes`` (conf/sweep/batching.yaml) labels its cells ``spd (batch 4)``
(``pipeline.cell_types.batch_label``); here a label is split back into the method's label and the batch size.
Per (pair, dataset, method label, batch size): the speedup per seed (``stats.add_ratios``: over the ar cell of the
same seed and batch size), its mean and a 95% t-interval over seeds (the seeds are the independent repeats of a
cell). The crossover batch size is the smallest batch size whose mean speedup is below 1 (speculation no longer
pays); none when it pays at every batch size measured.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy import stats as sstats

from analysis import schema, stats
from pipeline.cell_types import split_batch_label

COLUMNS = [
    "pair",
    "dataset",
    "method",
    "batch_size",
    "seeds",
    "speedup",
    "low",
    "high",
    "tokens_per_s",
    "accepted_per_step",
]


def with_batch(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with ``method_label`` (the label without its batch suffix) and a numeric ``batch_size`` (1 when
    absent)."""
    out = stats.add_ratios(runs) if "speedup" not in runs else runs.copy()
    split = out["label"].astype(str).map(split_batch_label)
    out["method_label"] = split.map(lambda t: t[0])
    logged = (
        pd.to_numeric(out["batch_size"], errors="coerce") if "batch_size" in out else pd.Series(np.nan, index=out.index)
    )
    out["batch_size"] = logged.fillna(split.map(lambda t: t[1])).astype(int)
    return out


def varies(runs: pd.DataFrame) -> bool:
    """Whether the sweep measured more than one batch size."""
    return with_batch(runs)["batch_size"].nunique() > 1 if len(runs) else False


def _interval(values: np.ndarray) -> tuple[float, float, float]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if values.size < 2:
        return mean, math.nan, math.nan
    half = float(sstats.t.ppf(0.975, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size))
    return mean, mean - half, mean + half


def speedup_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (pair, dataset, method label, batch size): mean speedup over ar at that batch size and its 95% CI."""
    data = with_batch(runs)
    rows = []
    for (pair, dataset, method, b), g in data.groupby(["pair", "dataset", "method_label", "batch_size"], sort=True):
        mean, low, high = _interval(g["speedup"].to_numpy(dtype=float))
        rows.append(
            {
                "pair": pair,
                "dataset": dataset,
                "method": method,
                "batch_size": int(b),
                "seeds": int(g["seed"].nunique()),
                "speedup": mean,
                "low": low,
                "high": high,
                "tokens_per_s": float(g["tokens_per_s"].mean()),
                "accepted_per_step": float(g["accepted_per_step"].mean()),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def crossover(table: pd.DataFrame) -> pd.DataFrame:
    """Per (pair, dataset, method): the smallest batch size whose mean speedup is below 1 (NaN: none measured)."""
    rows = []
    for (pair, dataset, method), g in table[table["method"] != schema.BASELINE].groupby(
        ["pair", "dataset", "method"], sort=True
    ):
        below = g[g["speedup"] < 1.0]["batch_size"]
        rows.append(
            {
                "pair": pair,
                "dataset": dataset,
                "method": method,
                "crossover_batch_size": int(below.min()) if len(below) else math.nan,
                "largest_batch_measured": int(g["batch_size"].max()),
            }
        )
    return pd.DataFrame(rows, columns=["pair", "dataset", "method", "crossover_batch_size", "largest_batch_measured"])


def markdown(runs: pd.DataFrame) -> str:
    """The speedup-vs-batch-size table and the crossover per method."""
    table, cross = speedup_table(runs), None
    cross = crossover(table)
    f = lambda v: "–" if not math.isfinite(v) else f"{v:.2f}"  # noqa: E731
    lines = [
        "# Speedup vs batch size",
        "",
        "Tokens/s over all requests divided by ar's at the same batch size, per seed; mean and "
        "95% t-interval over seeds. Crossover: the smallest batch size whose mean speedup is below 1.",
        "",
        "| pair | dataset | method | batch | seeds | speedup [95% CI] | tokens/s | tokens/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.pair} | {r.dataset} | {r.method} | {r.batch_size} | {r.seeds} | {f(r.speedup)} [{f(r.low)}, "
            f"{f(r.high)}] | {f(r.tokens_per_s)} | {f(r.accepted_per_step)} |"
        )
    lines += [
        "",
        "| pair | dataset | method | crossover batch size | largest batch measured |",
        "|---|---|---|---|---|",
    ]
    for r in cross.itertuples():
        shown = (
            f"{int(r.crossover_batch_size)}"
            if math.isfinite(r.crossover_batch_size)
            else f"none (> {r.largest_batch_measured})"
        )
        lines.append(f"| {r.pair} | {r.dataset} | {r.method} | {shown} | {r.largest_batch_measured} |")
    return "\n".join(lines) + "\n"


def speedup_vs_batch_size(runs: pd.DataFrame):
    """The figure: speedup over ar (y, with 95% CIs) against batch size (x, log2), a line per method, a panel per
    (pair, dataset); the crossover batch size marked. None when one batch size only."""
    if not varies(runs):
        return None
    table = speedup_table(runs)
    table = table[table["method"] != schema.BASELINE]
    cross = crossover(table)
    blocks = list(table.groupby(["pair", "dataset"], sort=True).groups)
    fig, axes = plt.subplots(1, len(blocks), figsize=(5.0 * len(blocks), 3.6), squeeze=False)
    for ax, (pair, dataset) in zip(axes[0], blocks):
        g = table[(table["pair"] == pair) & (table["dataset"] == dataset)]
        for method, m in g.groupby("method", sort=True):
            m = m.sort_values("batch_size")
            err = np.vstack([(m["speedup"] - m["low"]).fillna(0.0), (m["high"] - m["speedup"]).fillna(0.0)])
            c = cross[(cross["pair"] == pair) & (cross["dataset"] == dataset) & (cross["method"] == method)][
                "crossover_batch_size"
            ]
            label = method + (f" (crossover at {int(c.iloc[0])})" if len(c) and math.isfinite(c.iloc[0]) else "")
            line = ax.errorbar(m["batch_size"], m["speedup"], yerr=err, marker="o", capsize=3, label=label)
            if len(c) and math.isfinite(c.iloc[0]):
                ax.axvline(c.iloc[0], color=line[0].get_color(), linestyle=":", alpha=0.6)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        if np.isfinite(pd.to_numeric(g["speedup"], errors="coerce")).any():
            ax.set_xscale("log", base=2)
        else:  # every cell of the panel disturbed (no timing): no log axis over nothing
            ax.text(0.5, 0.5, "no undisturbed cells", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("batch size")
        ax.set_ylabel(schema.DISPLAY["speedup"] + " (same batch size)")
        ax.set_title(f"{pair} · {dataset}", fontsize=9)
        ax.grid(alpha=0.3)
    # one legend below the panels, never over the data (in-axes legends covered the intervals)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    for ax in axes[0, 1:]:
        for h, lb in zip(*ax.get_legend_handles_labels()):
            if lb not in labels:
                handles.append(h)
                labels.append(lb)
    fig.legend(handles, labels, loc="lower center", ncol=min(4, max(1, len(labels))), fontsize=7, frameon=False)
    fig.suptitle("Speedup vs batch size (mean, 95% CI over seeds)", fontsize=10)
    rows = math.ceil(len(labels) / min(4, max(1, len(labels)))) if labels else 0
    fig.tight_layout(rect=(0, 0.04 + 0.05 * rows, 1, 1))
    return fig
