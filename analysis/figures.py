"""Figures of a sweep (matplotlib only), each saved as PNG and PDF.

One panel per (pair, dataset); each method is a point at its mean over seeds with ±std error bars.

- ``speed_vs_perplexity``: tokens/s against perplexity.
- ``energy_vs_speed``: J/token against tokens/s (MTAD Figure 5).
- ``score_vs_perplexity``: score against perplexity (MTAD Figure 4).
- ``acceptance_length``: tokens per target step per method (bars).
- ``ablation_curves``: a metric against a hyper-parameter (tau, num_beams, gamma) that varies within a method.

    paths = save_all(runs, "reports/smoke/figures")      # {name: [png, pdf]}
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from PIL import Image

from analysis import batching, schema, stats
from analysis.runs import label_methods, order_labels, varying_params

MARKERS = "osD^v<>pPX*h"
PNG_DPI = 120


def savefig(fig, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``<name>.png`` (120 dpi, a 256-colour palette: see ``palette_png``; a committed report's pictures, kept
    small) and ``<name>.pdf`` (vector, for print) under ``out_dir``; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    fig.savefig(paths[0], dpi=PNG_DPI, bbox_inches="tight")
    palette_png(paths[0])
    fig.savefig(paths[1], bbox_inches="tight")
    return paths


def palette_png(path: Path) -> None:
    """Re-encode a PNG in place with a 256-colour palette (the same size, no dithering): a plot's few colours and
    their anti-aliasing fit it, at about 40% of the RGBA file (reports are committed; the PDF is the vector copy)."""
    with Image.open(path) as image:
        palette = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    palette.save(path, "PNG", optimize=True)


def _blocks(runs: pd.DataFrame) -> list[tuple[str, str]]:
    return list(
        runs[["pair", "dataset"]].drop_duplicates().sort_values(["pair", "dataset"]).itertuples(index=False, name=None)
    )


def _grid(n: int, width: float = 4.2, height: float = 3.4):
    cols = min(3, max(n, 1))
    rows = max(1, math.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def _styles(runs: pd.DataFrame) -> dict[str, tuple]:
    labels = order_labels(runs["label"], label_methods(runs)) if len(runs) else []
    colors = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]  # a ListedColormap
    return {lb: (colors[i % len(colors)], MARKERS[i % len(MARKERS)]) for i, lb in enumerate(labels)}


def _empty(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, fontsize=9, color="0.35", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def scatter(runs: pd.DataFrame, x: str, y: str, title: str, missing: str | None = None):
    """Mean ± std (over seeds) of ``y`` against ``x`` per method, a panel per (pair, dataset)."""
    blocks = _blocks(runs)
    fig, axes = _grid(len(blocks))
    styles = _styles(runs)
    agg = stats.aggregate(runs, [x, y]) if len(runs) else pd.DataFrame()
    handles = {}
    for ax, (pair, dataset) in zip(axes, blocks):
        block = agg[(agg["pair"] == pair) & (agg["dataset"] == dataset)]
        ok = block[np.isfinite(block[f"{x}_mean"]) & np.isfinite(block[f"{y}_mean"])]
        ax.set_title(f"{pair} · {dataset}", fontsize=9)
        if ok.empty:
            absent = [schema.DISPLAY.get(m, m) for m in (x, y) if not np.isfinite(block[f"{m}_mean"]).any()]
            _empty(ax, missing or f"no {' / '.join(absent) or 'paired values'} for this pair and dataset")
            continue
        for r in ok.to_dict("records"):
            color, marker = styles[r["label"]]
            h = ax.errorbar(
                r[f"{x}_mean"],
                r[f"{y}_mean"],
                xerr=_nan0(r[f"{x}_std"]),
                yerr=_nan0(r[f"{y}_std"]),
                fmt=marker,
                color=color,
                capsize=3,
                label=r["label"],
            )
            handles[r["label"]] = h
        ax.set_xlabel(schema.DISPLAY.get(x, x))
        ax.set_ylabel(schema.DISPLAY.get(y, y))
        ax.grid(alpha=0.3)
    if handles:
        order = [lb for lb in styles if lb in handles]
        fig.legend(
            [handles[lb] for lb in order],
            order,
            loc="upper center",
            ncol=min(6, len(order)),
            fontsize=8,
            bbox_to_anchor=(0.5, 1.0 + 0.06 / max(1, math.ceil(len(blocks) / 3))),
            frameon=False,
        )
    fig.suptitle(title, y=1.0 + 0.12 / max(1, math.ceil(len(blocks) / 3)), fontsize=10)
    fig.tight_layout()
    return fig


def _nan0(v: float) -> float:
    return 0.0 if v is None or not math.isfinite(v) else float(v)


def speed_vs_perplexity(runs: pd.DataFrame):
    """tokens/s against perplexity (mean ± std over seeds)."""
    return scatter(runs, "perplexity", "tokens_per_s", "Speed vs perplexity")


def energy_vs_speed(runs: pd.DataFrame, energy: str = "j_per_token"):
    """J/token against tokens/s (MTAD Figure 5); an explanatory panel where energy was not measured."""
    missing = None if runs[energy].notna().any() else "no energy measurements in this sweep (meter unavailable)"
    return scatter(runs, "tokens_per_s", energy, "Energy vs speed", missing)


def score_vs_perplexity(runs: pd.DataFrame):
    """Score against perplexity (MTAD Figure 4); datasets without a score say so."""
    return scatter(runs, "perplexity", "score", "Score vs perplexity")


def acceptance_length(runs: pd.DataFrame, metric: str = "accepted_per_step"):
    """Bars of tokens per target step (mean ± std over seeds) per method, a panel per (pair, dataset)."""
    blocks = _blocks(runs)
    fig, axes = _grid(len(blocks))
    styles = _styles(runs)
    for ax, (pair, dataset) in zip(axes, blocks):
        block = runs[(runs["pair"] == pair) & (runs["dataset"] == dataset)]
        agg = stats.aggregate(block, [metric], by=("label",)).set_index("label")
        labels = [lb for lb in styles if lb in agg.index and np.isfinite(agg.at[lb, f"{metric}_mean"])]
        ax.set_title(f"{pair} · {dataset}", fontsize=9)
        if not labels:
            _empty(ax, "no acceptance data")
            continue
        means = [agg.at[lb, f"{metric}_mean"] for lb in labels]
        errs = [_nan0(agg.at[lb, f"{metric}_std"]) for lb in labels]
        ax.bar(range(len(labels)), means, yerr=errs, capsize=3, color=[styles[lb][0] for lb in labels])
        ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(schema.DISPLAY.get(metric, metric))
        ax.axhline(1.0, color="0.5", lw=0.8, ls="--")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Acceptance length: tokens per target step", fontsize=10)
    fig.tight_layout()
    return fig


def ablation_curves(
    runs: pd.DataFrame, param: str, metrics: Sequence[str] = ("tokens_per_s", "speedup", "score", "perplexity")
):
    """``metrics`` (rows) against ``param`` (x), a line per (method, pair, dataset); None when nothing varies."""
    if "speedup" in metrics and "speedup" not in runs:
        runs = stats.add_ratios(runs)
    methods = [m for m, ps in varying_params(runs).items() if param in ps]
    if not methods:
        return None
    data = runs[runs["method"].isin(methods)].copy()
    data[param] = pd.to_numeric(data[param], errors="coerce")
    metrics = [m for m in metrics if m in data and data[m].notna().any()]
    blocks = _blocks(data)
    fig, axes = plt.subplots(len(metrics), 1, figsize=(5.5, 2.8 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics):
        for i, (pair, dataset) in enumerate(blocks):
            for j, method in enumerate(methods):
                g = data[(data["pair"] == pair) & (data["dataset"] == dataset) & (data["method"] == method)]
                others = [p for p in varying_params(g).get(method, []) if p != param]
                groups = g.groupby([g[p].astype(str) for p in others]) if others else [((), g)]
                for k, (okey, sub) in enumerate(groups):
                    agg = stats.aggregate(sub, [metric], by=(param,)).sort_values(param)
                    values = okey if isinstance(okey, tuple) else (okey,)
                    name = f"{method} {pair}·{dataset}" + (
                        f" ({', '.join(f'{p}={v}' for p, v in zip(others, values))})" if others else ""
                    )
                    ax.errorbar(
                        agg[param],
                        agg[f"{metric}_mean"],
                        yerr=agg[f"{metric}_std"].fillna(0.0),
                        marker=MARKERS[(i + k) % len(MARKERS)],
                        capsize=3,
                        label=name,
                    )
        ax.set_xlabel(param)
        ax.set_ylabel(schema.DISPLAY.get(metric, metric))
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="best")
    fig.suptitle(f"Ablation over {param} (mean ± std over seeds)", fontsize=10)
    fig.tight_layout()
    return fig


def all_figures(runs: pd.DataFrame) -> dict[str, Any]:
    """name -> Figure for every figure the sweep's runs support (ablations only where a param varies)."""
    runs = stats.add_ratios(runs) if "speedup" not in runs else runs
    figs = {
        "speed_vs_perplexity": speed_vs_perplexity(runs),
        "energy_vs_speed": energy_vs_speed(runs),
        "score_vs_perplexity": score_vs_perplexity(runs),
        "acceptance_length": acceptance_length(runs),
    }
    batch = batching.speedup_vs_batch_size(runs)  # a sweep over batch sizes (conf/sweep/batching.yaml)
    if batch is not None:
        figs["speedup_vs_batch_size"] = batch
    for param in schema.ablation_params(runs):
        fig = ablation_curves(runs, param)
        if fig is not None:
            figs[f"ablation_{param}"] = fig
    return figs


def save_all(runs: pd.DataFrame, out_dir: str | Path, close: bool = True) -> dict[str, list[Path]]:
    """Write every figure of ``all_figures`` as PNG and PDF under ``out_dir``."""
    out = {}
    for name, fig in all_figures(runs).items():
        out[name] = savefig(fig, out_dir, name)
        if close:
            plt.close(fig)
    return out
