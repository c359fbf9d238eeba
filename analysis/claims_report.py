"""The claims part of a sweep's report: ``claims.md``, ``claims.csv``, ``acceptance.md|csv`` and the forest plot.

    written = write_claims(runs, samples, "reports/claims")     # called by analysis.report.write_report

- ``claims.md``: per claim and (pair, dataset) the measured effect (the mean of the prompt-level effects), its
  exact 95% CI over prompts, the verdict (supported / contradicted / inconclusive at this size / too few prompts /
  measurement problem), the prompts a decisive answer would need and the minimum detectable effect at this
  size; then the claims untested here (no data, needs a GPU, only disturbed cells...) with the command that
  tests them; then the acceptance table.
- ``acceptance.md|csv``: per method (pooled over its cells) and per cell, the acceptance metrics of
  ``pipeline.measure.acceptance`` (pooled over tokens and per-request means, conventions named) and Leviathan's
  i.i.d. check (alpha from the per-position rates against alpha implied by tokens per step).
- ``figures/claims_forest.png|pdf``: one line per tested claim, effect and CI, the claim's boundary marked.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis import batching, frontier, schema, transfer
from analysis.claims import evaluate_claims
from analysis.claims_spec import CONTRADICTED, MEASUREMENT_PROBLEM, SUPPORTED, TOO_FEW, Claim, load_claims
from analysis.figures import savefig
from analysis.runs import label_methods, order_labels
from analysis.stats import MIN_PROMPTS
from pipeline.measure.acceptance import CONVENTIONS, PER_REQUEST, POOLED, records_metrics

COLORS = {
    SUPPORTED: "tab:green",
    CONTRADICTED: "tab:red",
    "inconclusive": "tab:gray",
    TOO_FEW: "tab:gray",
    MEASUREMENT_PROBLEM: "tab:orange",
}
SHOWN = ("tested", TOO_FEW)  # statuses with a row in the claims table (the others are untested here)
SYMBOL = {">": "greater", "<": "less", ">=": "at_least", "<=": "at_most", "~": "equivalent"}
CLAIM_SYMBOL = {v: k for k, v in SYMBOL.items()}


def _fmt(value: Any, pct: bool = False, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–" if value is None or not (isinstance(value, float) and math.isinf(value)) else "∞"
    if pct:
        return f"{100 * value:+.1f}%"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _boundary(row: pd.Series) -> str:
    margin = row["margin"]
    sign = CLAIM_SYMBOL.get(row["direction"], row["direction"])
    pct = row["scale"] == "relative"
    if row["direction"] in ("greater", "less"):
        return f"{sign} 0"
    if row["direction"] == "equivalent":
        return f"|effect| < {_fmt(margin, pct) if pct else _fmt(margin)}".replace("+", "")
    bound = -margin if row["direction"] == "at_least" else margin
    return f"{sign} {_fmt(bound, pct) if pct else _fmt(bound)}"


# ----------------------------------------------------------------------------------- acceptance


def acceptance_tables(runs: pd.DataFrame, samples: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per method pooled over its cells, per cell): the acceptance metrics of ``pipeline.measure.acceptance``."""

    def metrics(recs: pd.DataFrame, gamma, mnt) -> dict[str, float]:
        gamma = int(gamma) if isinstance(gamma, (int, float)) and not pd.isna(gamma) else None
        mnt = int(mnt) if isinstance(mnt, (int, float)) and not pd.isna(mnt) else None
        return records_metrics(recs.to_dict("records"), gamma, mnt)

    per_cell, per_method = [], []
    for run in runs.itertuples(index=False):
        m = metrics(
            samples[samples["run_id"] == run.run_id], getattr(run, "gamma", None), getattr(run, "max_new_tokens", None)
        )
        if m:
            per_cell.append({"pair": run.pair, "dataset": run.dataset, "label": run.label, "seed": run.seed, **m})
    for (pair, dataset, label), g in runs.groupby(["pair", "dataset", "label"], sort=False):
        m = metrics(
            samples[samples["run_id"].isin(set(g["run_id"]))],
            g["gamma"].iloc[0] if "gamma" in g else None,
            g["max_new_tokens"].iloc[0] if "max_new_tokens" in g else None,
        )
        if m:
            per_method.append({"pair": pair, "dataset": dataset, "label": label, "cells": len(g), **m})
    order = {lb: i for i, lb in enumerate(order_labels(runs["label"], label_methods(runs)))} if len(runs) else {}
    method_df = pd.DataFrame(per_method)
    if len(method_df):
        method_df = method_df.sort_values(
            ["pair", "dataset", "label"], key=lambda s: s.map(order) if s.name == "label" else s
        ).reset_index(drop=True)
    return method_df, pd.DataFrame(per_cell)


def acceptance_markdown(per_method: pd.DataFrame) -> str:
    """The acceptance table (per method) with its conventions and the Leviathan check."""
    if per_method.empty:
        return "No method in this sweep drafts tokens: no acceptance metrics.\n"
    depth = max(int(c.split("pos")[1].split("_")[0]) for c in per_method.columns if c.startswith("acceptance_rate_pos"))
    lines = [
        (
            "Conventions: *acceptance length* = tokens emitted per target verification step, bonus token included "
            "(vLLM's mean acceptance length, Spec-Bench's mean accepted tokens); *draft acceptance rate* = accepted "
            "drafts / drafted tokens (vLLM); *position i* = accepted at draft position i / drafts reaching position "
            f"i. **pooled** = {CONVENTIONS[POOLED]}; **per-request** = {CONVENTIONS[PER_REQUEST]}."
        ),
        "",
        (
            "| pair | dataset | method | acc. length pooled | acc. length per-request | draft acc. rate pooled | draft "
            "acc. rate per-request | "
        )
        + " | ".join(f"pos {i} pooled / per-request" for i in range(1, depth + 1))
        + (
            " | alpha (positions) | alpha (implied by tokens/step) | Leviathan E[tokens/step] | acceptance falls with "
            "position? |"
        ),
        "|" + "---|" * (7 + depth + 4),
    ]
    for r in per_method.to_dict("records"):
        pos = []
        for i in range(1, depth + 1):
            a, b = (
                r.get(f"acceptance_rate_pos{i}_{POOLED}", math.nan),
                r.get(f"acceptance_rate_pos{i}_{PER_REQUEST}", math.nan),
            )
            pos.append(f"{_fmt(a)} / {_fmt(b)}" if isinstance(a, float) and math.isfinite(a) else "–")
        falls = r.get("acceptance_falls", math.nan)
        z = r.get("acceptance_falls_z", math.nan)
        falls_text = (
            "–"
            if not math.isfinite(falls)
            else (
                f"**falls** (z = {z:.2f}): the i.i.d. assumption fails"
                if falls
                else f"no, it rises (z = {z:.2f}): not i.i.d. either"
                if z > 1.96
                else f"no, flat (z = {z:.2f})"
            )
        )
        lines.append(
            f"| {r['pair']} | {r['dataset']} | {r['label']} | {_fmt(r[f'acceptance_length_{POOLED}'])} | "
            f"{_fmt(r[f'acceptance_length_{PER_REQUEST}'])} | {_fmt(r[f'draft_acceptance_rate_{POOLED}'])} | "
            f"{_fmt(r[f'draft_acceptance_rate_{PER_REQUEST}'])} | {' | '.join(pos)} | {_fmt(r['alpha_positions'])} | "
            f"{_fmt(r['alpha_implied'])} | {_fmt(r['leviathan_tokens_per_step'])} | {falls_text} |"
        )
    lines += [
        "",
        (
            "Leviathan check: under an i.i.d. acceptance rate the two alphas agree and the per-position rates are "
            "flat (z: rate at positions >= 2 minus rate at position 1, two-proportion test; below -1.96 acceptance "
            "falls with position); alpha (implied) uses the method's gamma, and only means something for chain drafts "
            "(spd, block, mtad, typical, bild)."
        ),
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------- claims


def _predicted_text(r: dict) -> str:
    """A speed claim's memory-bound answer: effect [CI] verdict (– for claims that are not about speed)."""
    verdict = r.get("predicted_verdict")
    if not isinstance(verdict, str) or not verdict:
        return "–"
    pct = r["scale"] == "relative"
    if r.get("predicted_status") not in SHOWN:
        return str(r.get("predicted_status") or verdict)
    e, lo, hi = (r.get(f"predicted_{k}", math.nan) for k in ("effect", "low", "high"))
    show = (lambda v: _fmt(v, pct)) if pct else _fmt
    ci = f" [{show(lo)}, {show(hi)}]" if isinstance(lo, float) and math.isfinite(lo) else ""
    return f"{show(e)}{ci} **{verdict}**"


def claims_markdown(table: pd.DataFrame, sweep: str = "", header: str = "", sections: Sequence[str] = ()) -> str:
    """claims.md's claims sections: ``header`` (provenance, the methods in plain words), the tested claims with
    their memory-bound prediction, ``sections`` (markdown blocks: the one-sided claims, the frontier, the batch
    crossover, the sizes undecided claims need), then the claims' wording and those untested here."""
    tested = table[table["status"].isin(SHOWN)]
    predicted_only = (
        table[(~table["status"].isin(SHOWN)) & table.get("predicted_status", pd.Series(dtype=str)).isin(SHOWN)]
        if "predicted_status" in table
        else table.iloc[0:0]
    )
    untested = table[~table["status"].isin(SHOWN)].drop_duplicates("claim")
    lines = [
        f"# Claims{f' — sweep `{sweep}`' if sweep else ''}",
        "",
        *([header, ""] if header else []),
        "## Verdicts",
        "",
        (
            "The unit is the prompt (generations of one prompt are not independent): per prompt, the statistic of the "
            "method's generations of every seed and turn against the reference's generations of the same (seed, "
            "prompt, turn), as a log ratio (relative) or a difference (absolute). Effect = the mean of those "
            "prompt-level effects (relative: shown as ratio - 1, in %). 95% CI: the exact sign-flip interval over "
            "prompts (every sign pattern up to 14 prompts, 10,000 random ones above; exact at any size when the "
            f"effects are symmetric under the null). Below {MIN_PROMPTS} prompts no interval can exclude anything: "
            "*too few prompts*. Verdict: the CI against the claim's boundary. *Needed* = prompts for a decisive "
            "verdict at 80% power if the measured effect is the true one; *MDE* = the smallest effect this size "
            "detects at 80% power (2.8 standard errors). Timing claims use only cells not measured on a disturbed "
            "machine; a speedup above its own bound is a *measurement problem*. *Predicted (memory-bound)*: a speed "
            "claim's second answer, the same test on what the measured acceptance and draft lengths give on a "
            "memory-bound accelerator with a compute roof (c the pair's bytes ratio, v = 0, each verified row adding "
            "1/153 of a step, A100's roof: `pipeline.measure.bounds.predicted_speedup`; the roof is what lets a batch "
            "effect appear)."
        ),
        "",
        (
            "| pair | dataset | claim | method vs reference | statistic | claim | effect | 95% CI | verdict | n "
            "prompts (pairs) | needed | MDE | paper's figure (in CI?) | predicted (memory-bound) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in tested.to_dict("records"):
        pct = r["scale"] == "relative"
        ci = f"[{_fmt(r['low'], pct)}, {_fmt(r['high'], pct)}]" if pct else f"[{_fmt(r['low'])}, {_fmt(r['high'])}]"
        claimed = (
            "–"
            if r["claimed"] is None or pd.isna(r["claimed"])
            else (
                f"{_fmt(r['claimed'], pct) if pct else _fmt(r['claimed'])} "
                f"({'yes' if r['claimed_in_ci'] else 'no' if r['claimed_in_ci'] is not None else '–'})"
            )
        )
        need = float(r["samples_needed"]) if pd.notna(r["samples_needed"]) else math.nan
        undecided = r["verdict"] in ("inconclusive", TOO_FEW)
        needed = (
            "decided"
            if not undecided
            else (str(int(need)) if math.isfinite(need) else "∞" if math.isinf(need) else "–")
        )
        vs = (
            f"{r['method']} vs {r['reference']}"
            if isinstance(r["reference"], str) and r["reference"]
            else f"{r['method']} (one-sample)"
        )
        verdict = f"**{r['verdict']}**" + (f" ({r['note']})" if r["note"] else "")
        lines.append(
            f"| {r['pair']} | {r['dataset']} | {r['claim']} | {vs} | {r['statistic']} ({r['scale']}) | "
            f"{_boundary(pd.Series(r))} | {_fmt(r['effect'], pct) if pct else _fmt(r['effect'])} | {ci} | {verdict} | "
            f"{r['n']} ({r.get('n_pairs', '–')}) | {needed} | "
            f"{_fmt(r['mde'], pct).replace('+', '') if pct else _fmt(r['mde'])} | {claimed} | {_predicted_text(r)} |"
        )
    if len(predicted_only):
        lines += [
            "",
            "Speed claims untested on this machine (a GPU claim, or no undisturbed cells) with a memory-bound "
            "prediction from the measured acceptance:",
            "",
            "| pair | dataset | claim | method vs reference | why untested here | predicted (memory-bound) |",
            "|---|---|---|---|---|---|",
        ]
        for r in predicted_only.to_dict("records"):
            lines.append(
                f"| {r['pair']} | {r['dataset']} | {r['claim']} | {r['method']} vs {r['reference']} | {r['status']} | "
                f"{_predicted_text(r)} |"
            )
    for block in sections:
        lines += ["", block.rstrip("\n")]
    lines += ["", "## Claims", ""]
    for r in table.drop_duplicates("claim").to_dict("records"):
        lines.append(f"- **{r['claim']}** ({r['source']}): {r['wording']}")
    if len(untested):
        lines += ["", "## Untested here", "", "| claim | why | how to test it |", "|---|---|---|"]
        for r in untested.to_dict("records"):
            why, _, how = str(r["note"]).partition("; test it with: ")
            lines.append(f"| {r['claim']} | {r['status']}: {why} | {f'`{how}`' if how else '–'} |")
    return "\n".join(lines) + "\n"


def forest_plot(table: pd.DataFrame):
    """One row per tested claim: the effect and its 95% CI coloured by verdict, the claim's boundary dashed,
    the paper's figure as a cross; relative and absolute effects in two panels."""
    tested = table[(table["status"] == "tested") & table["effect"].notna()]
    scales = [s for s in ("relative", "absolute") if (tested["scale"] == s).any()] or ["relative"]
    heights = [max(1, int((tested["scale"] == s).sum())) for s in scales]
    fig, axes = plt.subplots(
        len(scales), 1, figsize=(8.5, 1.2 + 0.42 * sum(heights)), squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    for ax, scale in zip(axes[:, 0], scales):
        rows = tested[tested["scale"] == scale].reset_index(drop=True)

        def x(v: float, rel: bool = scale == "relative") -> float:  # relative effects as ratios on a log axis
            return 1.0 + v if rel else v

        if rows.empty:
            ax.text(0.5, 0.5, "no claim tested", ha="center", va="center", transform=ax.transAxes)
            continue
        for i, r in rows.iterrows():
            y = len(rows) - 1 - i
            color = COLORS.get(r["verdict"], "tab:gray")
            ax.plot([x(r["low"]), x(r["high"])], [y, y], color=color, lw=2.2)
            ax.plot(x(r["effect"]), y, "o", color=color)
            bounds = {
                "greater": [0.0],
                "less": [0.0],
                "at_least": [-r["margin"]],
                "at_most": [r["margin"]],
                "equivalent": [-r["margin"], r["margin"]],
            }[r["direction"]]
            for b in bounds:
                ax.plot([x(b)] * 2, [y - 0.35, y + 0.35], color="0.3", ls="--", lw=1)
            if r["claimed"] is not None and pd.notna(r["claimed"]):
                ax.plot(x(r["claimed"]), y, "x", color="black", ms=7)
        ax.axvline(x(0.0), color="0.6", lw=0.8)
        if scale == "relative" and (rows[["low", "high", "effect"]].astype(float) > -1.0).all(axis=None):
            ax.set_xscale("log")  # ratios on a log axis (a ratio at or below 0 has no place there: linear then)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"{r['claim']} ({r['dataset']})" for r in rows.iloc[::-1].to_dict("records")], fontsize=8)
        ax.set_xlabel(
            "ratio method / reference (relative effect + 1, log scale)"
            if scale == "relative"
            else "effect (absolute difference)"
        )
    axes[0, 0].set_title(
        "Claims: effect and exact 95% CI over prompts (green supported, red contradicted, grey inconclusive,\n"
        "orange a measurement problem; "
        "dashed: the claim's boundary; x: the paper's figure)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def write_claims(
    runs: pd.DataFrame,
    samples: pd.DataFrame,
    out_dir: str | Path,
    *,
    claims: Sequence[Claim] | None = None,
    claims_file: str | Path | None = None,
    cost_ratio: float | None = None,
    n_boot: int = 2000,
    sweep: str = "",
    gpu_cost_ratio: float | None = None,
    command: str = "",
    bandwidth_gbs: float | None = None,
) -> dict[str, Any]:
    """Evaluate the claims and write claims.md|csv, acceptance.md|csv and figures/claims_forest.png|pdf under
    ``out_dir``. claims.md opens with the provenance (``command``, commit, machine, measured costs, date) and one
    paragraph per method, and carries each speed claim's memory-bound prediction (c: ``gpu_cost_ratio``, else each
    pair's bytes ratio), the claims that hold on one side only, the frontier (where the sweep has cells of rules the
    exact calculator declares), the batch crossover (where batch size varies) and the sizes undecided claims need."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    claims = list(claims) if claims is not None else load_claims(claims_file)
    gpu_c = transfer.gpu_cost_ratios(runs, gpu_cost_ratio)
    full = runs.reindex(columns=list(dict.fromkeys([*runs.columns, *schema.METRICS])))  # a frame built by hand
    table = evaluate_claims(claims, runs, samples, cost_ratio=cost_ratio, n_boot=n_boot, gpu_cost_ratio=gpu_c)
    header = "\n".join(
        [
            transfer.provenance_markdown(
                full,
                sweep,
                command or f"python -m analysis.report --sweep={sweep}",
                gpu_c=gpu_c,
                bandwidth_gbs=bandwidth_gbs,
            ),
            "## What each method does here",
            "",
            transfer.method_paragraphs(full, samples, gpu_c),
        ]
    )
    sections = []
    sided = transfer.one_sided(table)
    sections.append(
        "## Holds on one side only\n\n"
        + (
            "\n".join(sided)
            if sided
            else "No speed claim is supported on one side and not on the other (measured here vs predicted for a "
            "memory-bound accelerator)."
        )
        + "\n"
    )
    if frontier.frontier_rules(full):
        sections.append(
            "## The frontier: the exact calculator's rules beside their cells\n\n"
            + frontier.frontier_markdown(full, samples)
        )
    if batching.varies(full):
        sections.append(
            "## Batch size: throughput, latency, acceptance and the crossover\n\n"
            + transfer.crossover_markdown(full, samples, gpu_c)
        )
    sections.append("## Undecided claims: the size they need\n\n" + transfer.sizing_markdown(table, full))
    per_method, per_cell = acceptance_tables(runs, samples)
    paths = {
        "claims_md": out / "claims.md",
        "claims_csv": out / "claims.csv",
        "acceptance_md": out / "acceptance.md",
        "acceptance_csv": out / "acceptance.csv",
    }
    acc_md = acceptance_markdown(per_method)
    paths["claims_md"].write_text(
        claims_markdown(table, sweep, header=header, sections=sections)
        + "\n## Acceptance (per method, pooled over its cells)\n\n"
        + acc_md
    )
    table.to_csv(paths["claims_csv"], index=False)
    paths["acceptance_md"].write_text("# Acceptance\n\n" + acc_md)
    per_cell.to_csv(paths["acceptance_csv"], index=False)
    fig = forest_plot(table)
    figure = savefig(fig, out / "figures", "claims_forest")
    plt.close(fig)
    return {
        "table": table,
        "methods": header,
        "acceptance": per_method,
        "paths": list(paths.values()),
        "figure": figure,
        "counts": table["verdict"].value_counts().to_dict() if len(table) else {},
    }


def claim_metrics(table: pd.DataFrame) -> dict[str, float]:
    """MLflow metrics of the parent run: ``claim.<id>.<dataset>.effect|low|high|verdict`` (verdict +1 supported,
    -1 contradicted, 0 inconclusive)."""
    code = {SUPPORTED: 1.0, CONTRADICTED: -1.0, "inconclusive": 0.0, TOO_FEW: 0.0, MEASUREMENT_PROBLEM: 0.0}
    out = {}
    for r in table[table["status"].isin(SHOWN)].to_dict("records"):
        name = f"claim.{r['claim']}.{r['dataset']}".replace("[", "_").replace("]", "")
        for key in ("effect", "low", "high"):
            if isinstance(r[key], float) and np.isfinite(r[key]):
                out[f"{name}.{key}"] = float(r[key])
        out[f"{name}.verdict"] = code.get(r["verdict"], 0.0)
    return out
