"""analysis.tables: best bold / second underlined by the metric's direction, Markdown and LaTeX, escaping."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import tables


def test_rank_marks_follow_the_direction_and_skip_nan():
    means = {"ar": 10.0, "spd": 20.0, "mtad": 30.0, "x": float("nan")}
    assert tables.rank_marks(means, +1) == {"ar": "", "spd": "second", "mtad": "best", "x": ""}
    assert tables.rank_marks(means, -1) == {"ar": "best", "spd": "second", "mtad": "", "x": ""}
    assert tables.rank_marks({"a": 1.0, "b": 1.0, "c": 0.5}, +1) == {
        "a": "best",
        "b": "best",
        "c": "second",
    }  # ties share
    assert tables.rank_marks({"a": 1.0, "b": float("nan")}, +1) == {"a": "", "b": ""}  # nothing to compare


def test_format_and_marks():
    assert tables.fmt_mean_std(21.0, 3.605551, 2) == "21.00 ± 3.61"
    assert tables.fmt_mean_std(21.0, float("nan"), 2) == "21.00"  # one seed
    assert tables.fmt_mean_std(float("nan"), 1.0) == tables.MISSING
    assert tables.fmt_mean_std(1.0, 0.5, 1, latex=True) == "1.0 $\\pm$ 0.5"
    assert tables.mark("x", "best", False) == "**x**" and tables.mark("x", "second", False) == "<u>x</u>"
    assert tables.mark("x", "best", True) == "\\textbf{x}" and tables.mark("x", "second", True) == "\\underline{x}"
    assert tables.latex_escape("mt_bench & 5%") == "mt\\_bench \\& 5\\%"


def _runs():
    rows = []
    for label, tps, jpt in (
        ("ar", (10.0, 12.0, 11.0), (2.0, 2.2, 2.1)),
        ("spd", (20.0, 18.0, 25.0), (1.0, 1.2, 0.9)),
        ("mtad", (30.0, 33.0, 27.0), (0.8, 0.7, 0.9)),
    ):
        for seed in range(3):
            rows.append(
                {
                    "pair": "p",
                    "dataset": "humaneval",
                    "label": label,
                    "method": label,
                    "seed": seed,
                    "device": "g",
                    "tokens_per_s": tps[seed],
                    "j_per_token": jpt[seed],
                    "score": 0.5,
                    "accepted_per_step": 1.0,
                    "draft_steps": 0.0,
                    "dynamic_j_per_token": math.nan,
                    "gamma": 4,
                    "perplexity": 3.0,
                }
            )
    return pd.DataFrame(rows)


def test_table5_markdown_and_latex():
    t = tables.build_tables(_runs())
    md, tex = t.table5_markdown(), t.table5_latex()
    assert "| | ar | spd | mtad |" in md
    assert "| tokens/s | 11.00 ± 1.00 | <u>21.00 ± 3.61</u> | **30.00 ± 3.00** |" in md
    assert "| J/token | 2.100 ± 0.100 | <u>1.033 ± 0.153</u> | **0.800 ± 0.100** |" in md  # lower is better
    assert "| score | 0.500 ± 0.000 | 0.500 ± 0.000 | 0.500 ± 0.000 |" in md  # all tied: nothing marked
    assert "| seeds | 3 | 3 | 3 |" in md
    assert "tokens/s & 11.00 $\\pm$ 1.00 & \\underline{21.00 $\\pm$ 3.61} & \\textbf{30.00 $\\pm$ 3.00} \\\\" in tex
    assert "\\begin{tabular}{lccc}" in tex and "\\bottomrule" in tex
    summary = t.summary_markdown()
    assert "n/a" not in summary.split("####")[1].splitlines()[4]  # ar has no bound: '–', not 'n/a'
    assert (
        "| spd | 3 | – | <u>1.92 ± 0.39</u> |" in summary
    )  # per-seed speedup, then mean ± std; second of the non-baseline rows
    assert "| mtad | 3 | – | **2.73 ± 0.27** |" in summary


def test_disturbed_cells_are_a_column_and_out_of_the_timing_means():
    runs = _runs()
    runs["calibrated_target_step_ms"], runs["probe_before_ms"], runs["probe_after_ms"] = 10.0, 10.0, 10.0
    disturbed = (runs["label"] == "spd") & (
        runs["seed"] == 2
    )  # measured beside a CPU-heavy job: 25 tokens/s is not spd's
    runs.loc[disturbed, "probe_after_ms"] = 30.0
    t = tables.build_tables(runs)
    summary = t.summary_markdown()
    assert "| spd | 3 | 1/3 |" in summary and "| ar | 3 | 0/3 |" in summary
    spd = t.summary.set_index("label").loc["spd"]
    assert (
        spd["speedup_mean"] == pytest.approx((20 / 10 + 18 / 12) / 2) and spd["disturbed_cells"] == 1
    )  # seeds 0 and 1 only
    assert "| tokens/s | 11.00 ± 1.00 | <u>19.00 ± 1.41</u> |" in t.table5_markdown()
    assert any("spd/humaneval/seed 2 (3.0x)" in n for n in t.notes)


def test_marks_compare_the_shown_values():
    assert tables.rank_marks({"a": 1.021, "b": 1.024, "c": 0.9}, +1, digits=2) == {
        "a": "best",
        "b": "best",
        "c": "second",
    }
    assert tables.rank_marks({"a": 1.021, "b": 1.024, "c": 0.9}, +1) == {"a": "second", "b": "best", "c": ""}
