"""The sweep's closing tables: one row per cell, and mean ± std over seeds with the speedup."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from pipeline.formatting import fmt_mean_std
from pipeline.measure.costs import DISTURBED_DRIFT
from pipeline.tracking.layout import STATUS_FINISHED, TAG_STATUS


def summary_tables(rows: list[dict[str, Any]], baseline: str | Mapping[str, str] | None) -> tuple[str, str]:
    """(per-cell table, mean ± std table over seeds) as text. ``baseline``: each cell's key -> its baseline cell's key
    (``Plan.baselines``: the same pair, dataset, seed, batch size, rate and temperature), or one baseline label whose
    cells pair by pair, dataset and seed."""
    if not rows:
        return "(no cells)", "(no cells)"
    df = pd.DataFrame(rows)
    for col in ("tokens_per_s", "tokens_per_s_decode", "j_per_token", "score", "accepted_per_step", "perplexity"):
        if col not in df:
            df[col] = float("nan")
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df["seed"] = pd.to_numeric(df["seed"], errors="coerce").astype("Int64")
    df = df.drop_duplicates(subset=["cell_key"], keep="first") if "cell_key" in df else df
    # a cell whose own step moved during its window (measure.costs.step_drift): its timing is shown but kept out of
    # the means below, as the report and the claims keep it out
    drift = df.get("step_drift", df.get("step_slowdown", pd.Series(float("nan"), index=df.index)))
    slowdown = pd.to_numeric(drift, errors="coerce")
    df["disturbed"] = pd.to_numeric(df.get("disturbed", pd.Series(0.0, index=df.index)), errors="coerce").fillna(0) > 0
    df["slowdown"] = [
        f"{v:.1f}x" + (" disturbed" if d else "") if v == v else "-" for v, d in zip(slowdown, df["disturbed"])
    ]
    per_cell = df[
        ["label", "pair", "dataset", "seed", TAG_STATUS, "tokens_per_s", "j_per_token", "score", "slowdown", "cell_key"]
    ].copy()
    per_cell = per_cell.sort_values(["pair", "dataset", "label", "seed"])
    per_cell.columns = [
        "method",
        "pair",
        "dataset",
        "seed",
        "status",
        "tokens/s",
        "J/token",
        "score",
        "step drift",
        "cell_key",
    ]
    cell_text = per_cell.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-")

    ok = df[df[TAG_STATUS] == STATUS_FINISHED].copy()
    if ok.empty:
        return cell_text, "(no finished cells)"
    if "tokens_per_target_step" not in ok:
        ok["tokens_per_target_step"] = float("nan")
    ok["tokens_per_target_step"] = pd.to_numeric(ok["tokens_per_target_step"], errors="coerce").astype(float)
    # raw timing of a disturbed cell: not a figure; its tokens per own target step stays (a phase slows the steps and
    # the tokens alike, analysis/disturbed.py)
    for col in ("tokens_per_s", "tokens_per_s_decode", "j_per_token"):
        ok.loc[ok["disturbed"], col] = float("nan")
    if isinstance(baseline, Mapping):  # each cell over its own group's baseline cell
        by_key = ok.set_index("cell_key")
        for col, name in (("tokens_per_s", "speedup"), ("tokens_per_target_step", "speedup_normalized")):
            of = by_key[col]
            ok[name] = [row[col] / of.get(baseline.get(row["cell_key"], ""), float("nan")) for _, row in ok.iterrows()]
    elif baseline is not None:
        base = ok[ok["label"] == baseline].set_index(["pair", "dataset", "seed"])
        for col, name in (("tokens_per_s", "speedup"), ("tokens_per_target_step", "speedup_normalized")):
            ok[name] = [
                getattr(row, col) / base[col].get((row.pair, row.dataset, row.seed), float("nan"))
                for row in ok.itertuples()
            ]
    else:
        ok["speedup"] = ok["speedup_normalized"] = float("nan")
    out = []
    for (pair, dataset, label), g in ok.groupby(["pair", "dataset", "label"], sort=True):
        sp = g["speedup"].dropna()  # only seeds whose baseline finished count towards the speedup
        speedup = fmt_mean_std(sp.mean(), sp.std()) if len(sp) else "-"
        if 0 < len(sp) < len(g):
            speedup += f" ({len(sp)}/{len(g)} seeds timed with a baseline)"
        out.append(
            {
                "pair": pair,
                "dataset": dataset,
                "method": label,
                "seeds": len(g),
                "tokens/s": fmt_mean_std(g["tokens_per_s"].mean(), g["tokens_per_s"].std()),
                "speedup": speedup,
                # tokens per own target step over the baseline's (the loop's clock): machine phases cancel in it
                "speedup (own steps)": fmt_mean_std(g["speedup_normalized"].mean(), g["speedup_normalized"].std()),
                # without the prompts' prefill: comparable with the bench's short-prompt rate
                "decode tok/s": fmt_mean_std(g["tokens_per_s_decode"].mean(), g["tokens_per_s_decode"].std()),
                "tokens/step": fmt_mean_std(g["accepted_per_step"].mean(), g["accepted_per_step"].std()),
                "J/token": fmt_mean_std(g["j_per_token"].mean(), g["j_per_token"].std(), 4),
                "perplexity": fmt_mean_std(g["perplexity"].mean(), g["perplexity"].std()),
                "score": fmt_mean_std(g["score"].mean(), g["score"].std()),
            }
        )
    mean_text = pd.DataFrame(out).to_string(index=False)
    if ok["disturbed"].any():
        mean_text += (
            f"\n(timing of {int(ok['disturbed'].sum())} disturbed cell(s) left out: their own target step moved by "
            f"{DISTURBED_DRIFT}x or more during the window, in the loop's clock or the probes before and after it)"
        )
    return cell_text, mean_text
