"""The MTAD paper's Table 5 layout and the companion speed-up table, as Markdown and LaTeX.

Table 5: one block per (pair, dataset), a column per method, rows tokens/s, J/token and score
(mean ± std over seeds, ddof=1), best in bold and second underlined (per row, by the metric's
direction). Companion table, one row per method: per-seed speedup and energy ratio against the
``ar`` cells, tokens per target step (block efficiency) and accepted drafts per step (MTAD Table 8),
the derived alpha and Leviathan's bound, and paired-bootstrap differences against a reference method.

    tables = build_tables(runs, samples, reference="ar")
    tables.markdown(); tables.latex(); tables.write("reports/smoke")
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from analysis import schema, stats
from analysis.runs import label_methods, order_labels
from pipeline.formatting import MISSING, fmt_mean_std

TABLE5_ROWS = ("tokens_per_s", "j_per_token", "score")
SUMMARY_COLUMNS = ("speedup", "energy_ratio", "accepted_per_step", "accepted_drafts_per_step")
DIGITS = {
    "tokens_per_s": 2,
    "j_per_token": 3,
    "dynamic_j_per_token": 3,
    "score": 3,
    "perplexity": 2,
    "speedup": 2,
    "energy_ratio": 2,
    "accepted_per_step": 2,
    "accepted_drafts_per_step": 2,
    "alpha": 3,
    "bound": 2,
}


def rank_marks(means: dict[str, float], direction: int, digits: int | None = None) -> dict[str, str]:
    """label -> ``best`` / ``second`` / ``""`` by mean; NaN never ranked.

    With ``digits`` the means are compared as shown (rounded), so equal-looking cells share a mark.
    """

    def shown(v: float) -> float:
        return round(v, digits if digits is not None else 12)

    if direction == 0:  # no direction (scorers that disagree): nothing is best
        return {label: "" for label in means}
    finite = {lb: shown(v) for lb, v in means.items() if v is not None and math.isfinite(v)}
    values = sorted(set(finite.values()), reverse=direction > 0)
    out = {}
    for label in means:
        if label not in finite or len(values) < 2:
            out[label] = ""
        elif finite[label] == values[0]:
            out[label] = "best"
        elif finite[label] == values[1]:
            out[label] = "second"
        else:
            out[label] = ""
    return out


def mark(text: str, how: str, latex: bool) -> str:
    """Bold the best, underline the second: ``**x**`` / ``<u>x</u>`` or ``\\textbf{x}`` / ``\\underline{x}``."""
    if not how or text == MISSING:
        return text
    if latex:
        return f"\\textbf{{{text}}}" if how == "best" else f"\\underline{{{text}}}"
    return f"**{text}**" if how == "best" else f"<u>{text}</u>"


def latex_escape(text: str) -> str:
    """Escape LaTeX's special characters in a label."""
    repl = {
        "\\": r"\textbackslash{}",
        "&": r"\&",
        "%": r"\%",
        "$": r"\$",
        "#": r"\#",
        "_": r"\_",
        "{": r"\{",
        "}": r"\}",
        "~": r"\textasciitilde{}",
        "^": r"\textasciicircum{}",
        MISSING: "--",
        "Δ": r"$\Delta$",
        "÷": r"$\div$",
        "±": r"$\pm$",
        "·": r"$\cdot$",
    }
    return "".join(repl.get(ch, ch) for ch in str(text))


def _blocks(runs: pd.DataFrame) -> list[tuple[str, str]]:
    return list(
        runs[["pair", "dataset"]].drop_duplicates().sort_values(["pair", "dataset"]).itertuples(index=False, name=None)
    )


@dataclass
class Tables:
    """Table 5 and the companion table as frames (numbers) with their renderings."""

    table5: pd.DataFrame  # pair, dataset, metric, label, mean, std, n, mark
    summary: pd.DataFrame  # pair, dataset, label, <col>_mean/_std/_mark, alpha, bound, significance ...
    reference: str
    sweep: str = ""
    notes: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ Table 5

    def table5_markdown(self) -> str:
        out = []
        for pair, dataset in self._blocks(self.table5):
            block = self.table5[(self.table5["pair"] == pair) & (self.table5["dataset"] == dataset)]
            labels = list(dict.fromkeys(block["label"]))
            seeds = block.groupby("label")["seeds"].max()
            out.append(f"#### {pair} · {dataset}\n")
            out.append("| | " + " | ".join(labels) + " |")
            out.append("|---|" + "---|" * len(labels))
            for metric in dict.fromkeys(block["metric"]):
                cells = block[block["metric"] == metric].set_index("label")
                row = [
                    mark(
                        fmt_mean_std(cells.at[lb, "mean"], cells.at[lb, "std"], DIGITS.get(metric, 2)),
                        cells.at[lb, "mark"],
                        False,
                    )
                    for lb in labels
                ]
                out.append(f"| {schema.DISPLAY.get(metric, metric)} | " + " | ".join(row) + " |")
            out.append("| seeds | " + " | ".join(str(int(seeds[lb])) for lb in labels) + " |\n")
        return "\n".join(out)

    def table5_latex(self) -> str:
        out = [
            "% Table 5 layout (mean $\\pm$ std over seeds, ddof=1; best bold, second underlined); needs "
            "\\usepackage{booktabs}"
        ]
        for pair, dataset in self._blocks(self.table5):
            block = self.table5[(self.table5["pair"] == pair) & (self.table5["dataset"] == dataset)]
            labels = list(dict.fromkeys(block["label"]))
            out.append(f"% {pair} / {dataset}")
            out.append("\\begin{tabular}{l" + "c" * len(labels) + "}")
            out.append("\\toprule")
            out.append(
                f"\\multicolumn{{{len(labels) + 1}}}{{l}}{{\\textit{{{latex_escape(pair)} / "
                f"{latex_escape(dataset)}}}}} \\\\"
            )
            out.append(" & " + " & ".join(latex_escape(lb) for lb in labels) + " \\\\")
            out.append("\\midrule")
            for metric in dict.fromkeys(block["metric"]):
                cells = block[block["metric"] == metric].set_index("label")
                row = [
                    mark(
                        fmt_mean_std(cells.at[lb, "mean"], cells.at[lb, "std"], DIGITS.get(metric, 2), latex=True),
                        cells.at[lb, "mark"],
                        True,
                    )
                    for lb in labels
                ]
                out.append(
                    latex_escape(schema.DISPLAY.get(metric, metric))
                    + " & "
                    + " & ".join(c.replace(MISSING, "--") for c in row)
                    + " \\\\"
                )
            out.append("\\bottomrule")
            out.append("\\end{tabular}\n")
        return "\n".join(out)

    # ------------------------------------------------------------------ companion table

    def _summary_cells(self, latex: bool) -> tuple[list[str], list[tuple[str, str, list[list[str]]]]]:
        ref = self.reference
        header = [
            "method",
            "seeds",
            "disturbed cells",
            schema.DISPLAY["speedup"],
            schema.DISPLAY["energy_ratio"],
            "tokens/step (block eff.)",
            "accepted drafts/step",
            "alpha (derived)",
            "Leviathan bound",
            f"Δ tokens/s vs {ref} [95% CI]",
            f"Δ score vs {ref} [95% CI]",
        ]
        blocks = []
        for pair, dataset in self._blocks(self.summary):
            block = self.summary[(self.summary["pair"] == pair) & (self.summary["dataset"] == dataset)]
            rows = []
            for r in block.to_dict("records"):
                cells = [latex_escape(r["label"]) if latex else r["label"], str(int(r["seeds"])), _disturbed_cell(r)]
                for col in SUMMARY_COLUMNS:
                    cells.append(
                        mark(
                            fmt_mean_std(r[f"{col}_mean"], r[f"{col}_std"], DIGITS[col], latex),
                            r.get(f"{col}_mark", ""),
                            latex,
                        )
                    )
                cells.append(fmt_mean_std(r["alpha_mean"], r["alpha_std"], DIGITS["alpha"], latex))
                if math.isfinite(r["bound_mean"]):
                    above = stats.ABOVE_BOUND in str(
                        r["bound_note"]
                    )  # the speedup above it: the measurement, not the method
                    cells.append(
                        fmt_mean_std(r["bound_mean"], r.get("bound_std", math.nan), DIGITS["bound"], latex)
                        + (" (below the speedup: measurement problem)" if above else "")
                    )
                else:
                    cells.append("n/a" if r["bound_note"] == stats.NO_C_REASON else MISSING)
                for metric in ("tokens_per_s", "score"):
                    cells.append(_sig_cell(r, metric, r["label"] == ref, latex))
                rows.append(cells)
            blocks.append((pair, dataset, rows))
        return header, blocks

    def summary_markdown(self) -> str:
        header, blocks = self._summary_cells(latex=False)
        out = []
        for pair, dataset, rows in blocks:
            out.append(f"#### {pair} · {dataset}\n")
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "---|" * len(header))
            out.extend("| " + " | ".join(r) + " |" for r in rows)
            out.append("")
        out.extend(f"- {n}" for n in self.notes)
        return "\n".join(out) + "\n"

    def summary_latex(self) -> str:
        header, blocks = self._summary_cells(latex=True)
        out = [
            "% speed-up, energy ratio and acceptance (mean $\\pm$ std over seeds); bootstrap differences: * = 95% "
            "interval excludes 0"
        ]
        for pair, dataset, rows in blocks:
            out.append(f"% {pair} / {dataset}")
            out.append("\\begin{tabular}{l" + "c" * (len(header) - 1) + "}")
            out.append("\\toprule")
            out.append(
                f"\\multicolumn{{{len(header)}}}{{l}}{{\\textit{{{latex_escape(pair)} / {latex_escape(dataset)}}}}} "
                "\\\\"
            )
            out.append(" & ".join(latex_escape(h) for h in header) + " \\\\")
            out.append("\\midrule")
            out.extend(" & ".join(c.replace(MISSING, "--") for c in r) + " \\\\" for r in rows)
            out.append("\\bottomrule")
            out.append("\\end{tabular}\n")
        out.extend(f"% {latex_escape(n)}" for n in self.notes)
        return "\n".join(out) + "\n"

    # ------------------------------------------------------------------ files

    def markdown(self) -> str:
        title = f"# {self.sweep}\n\n" if self.sweep else ""
        return (
            title
            + "## Table 5 layout: mean ± std over seeds (ddof=1); best **bold**, second <u>underlined</u>\n\n"
            + self.table5_markdown()
            + "\n## Speed-up, energy, acceptance and significance\n\n"
            + self.summary_markdown()
        )

    def latex(self) -> str:
        return self.table5_latex() + "\n" + self.summary_latex()

    def write(self, out_dir: str | Path) -> list[Path]:
        """``table5.md`` and ``table5.tex`` under ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        md, tex = out / "table5.md", out / "table5.tex"
        md.write_text(self.markdown())
        tex.write_text(self.latex())
        return [md, tex]

    @staticmethod
    def _blocks(frame: pd.DataFrame) -> list[tuple[str, str]]:
        return list(frame[["pair", "dataset"]].drop_duplicates().itertuples(index=False, name=None))


def _disturbed_cell(row: dict) -> str:
    """``k/n``: the label's cells measured on a disturbed machine (their timing left out); ``0/n`` when none,
    ``–`` when none was checked (no probes or calibration)."""
    checked = row.get("checked_cells", 0)
    return f"{int(row.get('disturbed_cells', 0))}/{int(row.get('cells', 0))}" if checked else MISSING


def _sig_cell(row: dict, metric: str, is_reference: bool, latex: bool) -> str:
    if is_reference:
        return "ref"
    diff, low, high = (
        row.get(f"{metric}_diff", math.nan),
        row.get(f"{metric}_low", math.nan),
        row.get(f"{metric}_high", math.nan),
    )
    if diff is None or not math.isfinite(diff):
        return MISSING
    digits = DIGITS.get(metric, 2)
    star = ("$^{*}$" if latex else " \\*") if row.get(f"{metric}_significant") else ""
    return f"{diff:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]{star}"


def table5_frame(runs: pd.DataFrame, metrics: Sequence[str] = TABLE5_ROWS) -> pd.DataFrame:
    """Long frame of Table 5: one row per (pair, dataset, metric, label) with mean, std, seeds and mark."""
    methods = label_methods(runs) if len(runs) else {}
    rows = []
    for pair, dataset in _blocks(runs):
        block = runs[(runs["pair"] == pair) & (runs["dataset"] == dataset)]
        labels = order_labels(block["label"], methods)
        agg = stats.aggregate(block, list(metrics), by=("label",)).set_index("label")
        for metric in metrics:
            means = {lb: agg.at[lb, f"{metric}_mean"] for lb in labels}
            marks = rank_marks(means, schema.direction(metric, block), DIGITS.get(metric, 2))
            for lb in labels:
                rows.append(
                    {
                        "pair": pair,
                        "dataset": dataset,
                        "metric": metric,
                        "label": lb,
                        "mean": means[lb],
                        "std": agg.at[lb, f"{metric}_std"],
                        "n": int(agg.at[lb, f"{metric}_n"]),
                        "seeds": int(agg.at[lb, "seeds"]),
                        "mark": marks[lb],
                    }
                )
    return pd.DataFrame(rows, columns=["pair", "dataset", "metric", "label", "mean", "std", "n", "seeds", "mark"])


def summary_frame(
    runs: pd.DataFrame,
    samples: pd.DataFrame | None,
    reference: str,
    *,
    cost_ratio=None,
    n_boot: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per (pair, dataset, label): ratios and acceptance (mean/std/mark), alpha, bound, bootstrap."""
    if "speedup" not in runs:
        runs = stats.add_ratios(runs)
    methods = label_methods(runs) if len(runs) else {}
    bound = stats.bound_frame(runs, cost_ratio).set_index(["pair", "dataset", "label"]) if len(runs) else None
    sig = {}
    disturbed_runs = set(runs.loc[runs["disturbed"], "run_id"]) if "disturbed" in runs and "run_id" in runs else set()
    if samples is not None and len(samples):
        for metric in ("tokens_per_s", "score"):
            sig[metric] = stats.significance(
                samples,
                reference,
                metric,
                n_boot=n_boot,
                seed=seed,
                exclude_runs=disturbed_runs if metric == "tokens_per_s" else (),
            ).set_index(["pair", "dataset", "label"])
    rows = []
    for pair, dataset in _blocks(runs):
        block = runs[(runs["pair"] == pair) & (runs["dataset"] == dataset)]
        labels = order_labels(block["label"], methods)
        agg = stats.aggregate(block, list(SUMMARY_COLUMNS), by=("label",)).set_index("label")
        marks = {
            col: rank_marks(
                {
                    lb: agg.at[lb, f"{col}_mean"]
                    for lb in labels
                    if lb != schema.BASELINE and methods.get(lb) != schema.BASELINE
                },
                schema.direction(col),
                DIGITS[col],
            )
            for col in ("speedup", "energy_ratio", "accepted_per_step")
        }
        for lb in labels:
            row = {
                "pair": pair,
                "dataset": dataset,
                "label": lb,
                "method": methods.get(lb, lb),
                "seeds": int(agg.at[lb, "seeds"]),
            }
            own = block[block["label"] == lb]
            row["cells"] = len(own)
            row["disturbed_cells"] = int(own["disturbed"].sum()) if "disturbed" in own else 0
            row["checked_cells"] = int(own["step_slowdown"].notna().sum()) if "step_slowdown" in own else 0
            for col in SUMMARY_COLUMNS:
                row[f"{col}_mean"], row[f"{col}_std"] = agg.at[lb, f"{col}_mean"], agg.at[lb, f"{col}_std"]
                row[f"{col}_mark"] = marks.get(col, {}).get(lb, "")
            b = bound.loc[(pair, dataset, lb)] if bound is not None else {}
            for col in ("gamma", "alpha_mean", "alpha_std", "c", "bound_mean", "bound_std", "bound_note"):
                row[col] = b.get(col, math.nan) if hasattr(b, "get") else math.nan
            for metric, frame in sig.items():
                if (pair, dataset, lb) in frame.index:
                    s = frame.loc[(pair, dataset, lb)]
                    for k in ("diff", "low", "high", "significant", "n_units", "n_prompts"):
                        row[f"{metric}_{k}"] = s[k]
            rows.append(row)
    out = pd.DataFrame(rows)
    if "bound_std" in out:
        out["bound_std"] = pd.to_numeric(out["bound_std"], errors="coerce")
    return out


def build_tables(
    runs: pd.DataFrame,
    samples: pd.DataFrame | None = None,
    reference: str = schema.BASELINE,
    *,
    cost_ratio=None,
    n_boot: int = 2000,
    seed: int = 0,
) -> Tables:
    """Both tables for finished runs (``analysis.runs.load_runs``) and their generations (``load_samples``).

    Cells measured on a disturbed machine (``stats.mark_disturbed``) keep their acceptance and score; their
    timing (tokens/s, J/token, speedup, energy ratio) is left out of the means and the tokens/s bootstrap."""
    runs = stats.without_disturbed_timing(stats.mark_disturbed(runs))
    runs = stats.add_ratios(runs) if "speedup" not in runs else runs
    labels = set(runs["label"])
    if reference not in labels:
        matches = sorted(runs.loc[runs["method"] == reference, "label"].unique())
        if len(matches) == 1:
            reference = matches[0]
    summary = summary_frame(runs, samples, reference, cost_ratio=cost_ratio, n_boot=n_boot, seed=seed)
    notes = [
        (
            "speedup, J/token ÷ ar: per seed against the ar cell of the same pair, dataset, seed and device, then "
            "mean ± std over seeds."
        ),
        (
            "tokens/step (block efficiency): new tokens per target forward pass, bonus token included; accepted "
            "drafts/step = tokens/step - 1 for methods with a draft."
        ),
        (
            "alpha: per seed, the acceptance rate whose expected tokens/step (1 - a^(g+1))/(1 - a) equals the measured "
            "one (an effective alpha for non-chain verification)."
        ),
        (
            f"Δ vs {reference}: paired bootstrap over generations (seed, sample, turn) that resamples whole prompts (a "
            f"prompt's generations of every seed move together), {n_boot} replicates, seed {seed}; tokens/s as total "
            "tokens / total decode time, score as the mean per-sample score; * = the 95% interval excludes 0 with at "
            f"least {stats.MIN_PROMPTS} prompts (fewer cannot decide; analysis/claims.py decides with an exact test "
            "over prompts)."
        ),
        (
            "disturbed cells: cells whose target step, probed just before and after the window, was at least "
            f"{stats.DISTURBED_SLOWDOWN}x the pair's step calibrated at the sweep's start; their timing is left out of "
            "every mean above."
        ),
    ]
    if runs["disturbed"].any():
        flagged = runs[runs["disturbed"]]
        notes.append(
            "disturbed: "
            + ", ".join(f"{r.label}/{r.dataset}/seed {r.seed} ({r.step_slowdown:.1f}x)" for r in flagged.itertuples())
        )
    if len(summary) and summary["bound_note"].astype(str).str.contains(stats.ABOVE_BOUND, regex=False).any():
        notes.append(f"Leviathan bound: {stats.ABOVE_BOUND}.")
    if len(summary) and (summary["bound_note"] == stats.NO_C_REASON).any():
        notes.append(
            f"Leviathan bound n/a: {stats.NO_C_REASON}. Without c, the bound at c = 0 is the tokens/step column itself."
        )
    if runs["j_per_token"].isna().all():
        notes.append("J/token: no energy measurements in this sweep (energy meter unavailable on its devices).")
    return Tables(
        table5=table5_frame(runs),
        summary=summary,
        reference=reference,
        sweep=str(runs.attrs.get("sweep", "")),
        notes=notes,
    )
