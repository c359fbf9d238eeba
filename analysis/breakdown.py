"""Where a token's time goes, by the decoding loop's own clock: per method and batch size, the four phases (draft,
verify, rule, other) in milliseconds per token, beside the bound that the model work alone allows.

    table = breakdown_table(runs)            # per (pair, dataset, label, batch_size): ms/token by phase, speedups
    breakdown_markdown(table)                # the table as markdown, with how to read it
    paths = breakdown_figure(runs, out_dir)  # figures/time_breakdown.png|pdf: stacked bars, the bound marked

The phases are the cells' ``time_<phase>_s`` (``pipeline.measure.costs.cost_model``: they sum to the loop's wall
time), divided by the tokens the window emitted. ``speedup_normalized`` is the ratio of tokens per own target step
(machine phases between a cell and its ar cancel in it), ``speedup_bound`` the speedup the draft and verify phases
alone allow (rule and other free), and ``efficiency`` their quotient. Cells logged before the clock have no phases
and are left out.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis import schema, stats
from analysis.runs import label_methods, order_labels

PHASES = ("draft", "verify", "rule", "other")
COLORS = {"draft": "#4c72b0", "verify": "#dd8452", "rule": "#55a868", "other": "#8c8c8c"}


def _num(frame: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(frame[col], errors="coerce") if col in frame else pd.Series(math.nan, index=frame.index)


def breakdown_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (pair, dataset, label, batch_size) of the cells with a phase clock (undisturbed timing only):
    ``ms_<phase>`` (milliseconds per token, pooled over seeds), ``ms_total``, ``share_<phase>``, the means over seeds
    of ``speedup`` (raw tokens/s ratio to ar), ``speedup_normalized``, ``speedup_bound``, ``c``, ``v``, and
    ``efficiency`` = speedup_normalized / speedup_bound."""
    if runs.empty or "time_verify_s" not in runs:
        return pd.DataFrame()
    data = stats.without_disturbed_timing(stats.add_ratios(runs))
    data = data[_num(data, "time_verify_s").notna()].copy()
    if data.empty:
        return pd.DataFrame()
    data["batch_size"] = _num(data, "batch_size").fillna(1).astype(int)
    rows = []
    for key, g in data.groupby(["pair", "dataset", "label", "batch_size"], sort=False):
        tokens = _num(g, "new_tokens").sum()
        if not tokens > 0:
            continue
        row = dict(zip(("pair", "dataset", "label", "batch_size"), key))
        row["method"] = str(g["method"].iloc[0]) if "method" in g else row["label"]
        row["seeds"] = int(g["seed"].nunique()) if "seed" in g else len(g)
        for p in PHASES:
            row[f"ms_{p}"] = 1e3 * _num(g, f"time_{p}_s").sum() / tokens
        row["ms_total"] = sum(row[f"ms_{p}"] for p in PHASES)
        for p in PHASES:
            row[f"share_{p}"] = row[f"ms_{p}"] / row["ms_total"] if row["ms_total"] > 0 else math.nan
        for col, name in (
            ("speedup", "speedup"),
            ("speedup_normalized", "speedup_normalized"),
            ("speedup_bound", "speedup_bound"),
            ("cost_ratio", "c"),  # cost_ratio_c as the analysis names it (schema.METRICS)
            ("row_cost_v", "v"),
            ("t_target_step_ms", "t_step_ms"),
        ):
            row[name] = float(_num(g, col).mean())
        bound = row["speedup_bound"]
        row["efficiency"] = row["speedup_normalized"] / bound if bound and math.isfinite(bound) else math.nan
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    order = order_labels(table["label"], label_methods(data))
    table["_o"] = table["label"].map({lb: i for i, lb in enumerate(order)})
    return table.sort_values(["pair", "dataset", "batch_size", "_o"]).drop(columns="_o").reset_index(drop=True)


def breakdown_markdown(table: pd.DataFrame) -> str:
    """The breakdown table as markdown, with how to read it."""
    if table.empty:
        return "No cell with the loop's phase clock in this sweep (cells logged before it have no time breakdown).\n"
    f = lambda v, d=2: "–" if v is None or not math.isfinite(float(v)) else f"{float(v):.{d}f}"  # noqa: E731
    lines = [
        "Where a token's time goes, by the decoding loop's own clock (`pipeline.decoding.phase_clock`; the phases "
        "sum to the loop's wall time): milliseconds per token in each phase, pooled over seeds. *raw*: tokens/s over "
        "ar's at the same batch size; *normalized*: tokens per own target step over ar's (a machine phase between "
        "the two cells cancels); *bound*: the speedup the draft and verify phases alone allow (rule and other "
        "free); *eff.*: normalized / bound; c and v: the cost model read off the same clock.",
        "",
        "| pair | dataset | batch | method | seeds | draft | verify | rule | other | ms/token | raw | normalized | "
        "bound | eff. | c | v |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.to_dict("records"):
        lines.append(
            f"| {r['pair']} | {r['dataset']} | {r['batch_size']} | {r['label']} | {r['seeds']} | "
            + " | ".join(f"{f(r[f'ms_{p}'])} ({100 * r[f'share_{p}']:.0f}%)" for p in PHASES)
            + f" | {f(r['ms_total'])} | {f(r['speedup'])} | {f(r['speedup_normalized'])} | {f(r['speedup_bound'])} | "
            f"{f(r['efficiency'])} | {f(r['c'], 3)} | {f(r['v'], 3)} |"
        )
    return "\n".join(lines) + "\n"


def breakdown_figure(runs: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """``time_breakdown.png|pdf``: per (pair, dataset) a panel, per method and batch size a stacked bar of
    milliseconds per token by phase; a black tick where the bound puts it (ar's time per token at the cell's own
    measured speed, its plain step over the batch's requests, divided by its speedup_bound: machine phases between
    cells do not move it). Returns the paths ([] when no cell has the clock)."""
    from analysis.figures import savefig  # noqa: PLC0415 - figures imports the report's other modules

    table = breakdown_table(runs)
    if table.empty:
        return []
    blocks = list(table[["pair", "dataset"]].drop_duplicates().itertuples(index=False, name=None))
    fig, axes = plt.subplots(
        len(blocks),
        1,
        figsize=(8.5, 0.9 + 0.32 * table.groupby(["pair", "dataset"]).size().max() * len(blocks)),
        squeeze=False,
    )
    for ax, (pair, dataset) in zip(axes[:, 0], blocks):
        t = table[(table["pair"] == pair) & (table["dataset"] == dataset)].reset_index(drop=True)
        y = np.arange(len(t))[::-1]
        left = np.zeros(len(t))
        for p in PHASES:
            ax.barh(y, t[f"ms_{p}"], left=left, color=COLORS[p], label=p, height=0.7)
            left += t[f"ms_{p}"].to_numpy()
        for yi, r in zip(y, t.to_dict("records")):
            # ar's time per token at this cell's own speed (a plain step per token of each of the batch's requests),
            # over the bound: where the token would end if rule and other cost nothing
            if r["method"] != schema.BASELINE and r["speedup_bound"] > 0 and r["t_step_ms"] > 0:
                x = r["t_step_ms"] / r["batch_size"] / r["speedup_bound"]
                ax.plot([x, x], [yi - 0.42, yi + 0.42], color="black", lw=2)
        ax.set_yticks(y, [str(r["label"]) for r in t.to_dict("records")], fontsize=8)
        ax.set_xlabel("milliseconds per token (the loop's clock)")
        ax.set_title(f"{pair} / {dataset}: where a token's time goes", fontsize=9)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    handles.append(plt.Line2D([], [], color="black", lw=2))
    labels.append("the bound (draft + verify only)")
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    paths = savefig(fig, out_dir, "time_breakdown")
    plt.close(fig)
    return paths
