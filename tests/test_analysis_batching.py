"""Batch size as an axis in the analysis: speedup over ar at the same batch size, its CI, the crossover, the claims."""

from __future__ import annotations

import math

import matplotlib
import pandas as pd
import pytest

from analysis import batching, stats
from analysis.claims import evaluate_claim
from analysis.claims_spec import Claim, load_claims
from pipeline.cell_types import batch_label, split_batch_label

matplotlib.use("Agg")

# tokens/s per (method, batch size): ar scales best, speculation's edge shrinks and crosses 1 for spd at 8
RATES = {
    "ar": {1: 100, 2: 190, 4: 360, 8: 640},
    "spd": {1: 150, 2: 260, 4: 400, 8: 600},
    "block": {1: 155, 2: 270, 4: 410, 8: 620},
}


def runs(seeds=(0, 1, 2)) -> pd.DataFrame:
    rows = []
    for method, by_b in RATES.items():
        for b, rate in by_b.items():
            for seed in seeds:
                rows.append(
                    {
                        "pair": "p",
                        "dataset": "d",
                        "label": batch_label(method, b),
                        "method": method,
                        "seed": seed,
                        "device": "cpu",
                        "batch_size": b,
                        "tokens_per_s": rate * (1 + 0.01 * seed),
                        "j_per_token": math.nan,
                        "dynamic_j_per_token": math.nan,
                        "draft_steps": 0 if method == "ar" else 10,
                        "accepted_per_step": 1.5,
                    }
                )
    return pd.DataFrame(rows)


def test_labels_carry_the_batch_size_and_split_back():
    assert batch_label("spd", 1) == "spd" and batch_label("mtad(tau=0.3)", 4) == "mtad(tau=0.3) (batch 4)"
    assert split_batch_label("mtad(tau=0.3) (batch 4)") == ("mtad(tau=0.3)", 4) and split_batch_label("spd") == (
        "spd",
        1,
    )


def test_speedup_is_over_ar_at_the_same_batch_size():
    r = stats.add_ratios(runs())
    got = r[(r["label"] == "spd (batch 8)") & (r["seed"] == 0)]["speedup"].iloc[0]
    assert got == pytest.approx(600 / 640)
    assert r[r["method"] == "ar"]["speedup"].tolist() == pytest.approx([1.0] * 12)


def test_speedup_table_crossover_and_figure():
    table = batching.speedup_table(runs())
    spd = table[table["method"] == "spd"].set_index("batch_size")
    assert (
        spd.loc[4, "speedup"] == pytest.approx(400 / 360)
        and spd.loc[4, "low"] <= spd.loc[4, "speedup"] <= spd.loc[4, "high"]
    )
    cross = batching.crossover(table).set_index("method")
    assert cross.loc["spd", "crossover_batch_size"] == 8 and cross.loc["block", "crossover_batch_size"] == 8
    text = batching.markdown(runs())
    assert "| p | d | spd | 8 |" in text and "crossover" in text
    assert batching.speedup_vs_batch_size(runs()) is not None
    one = runs()[runs()["batch_size"] == 1]
    assert batching.speedup_vs_batch_size(one) is None  # nothing to plot at one batch size


def test_the_batching_claims_get_verdicts():
    """Cells are paired by seed (the seed is the cluster): 8 seeds decide, 3 are too few for the exact test."""
    claims = {c.id: c for c in load_claims()}
    frame = runs(seeds=range(8))
    falls = dict(claims["speedup_falls_with_batch_size"].__dict__, method="spd (batch 8)")
    result = evaluate_claim(Claim(**falls), frame, pd.DataFrame(), n_boot=200)
    assert result["status"] == "tested" and result["effect"] < 0 and result["verdict"] == "supported"
    block = evaluate_claim(claims["block_at_least_token_at_batch_4"], frame, pd.DataFrame(), n_boot=200)
    assert block["status"] == "tested" and block["effect"] > 0
    few = evaluate_claim(Claim(**falls), runs(), pd.DataFrame(), n_boot=200)
    assert few["verdict"] == "too few prompts" and few["samples_needed"] >= 6
