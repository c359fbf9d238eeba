"""analysis/serving.py on synthetic runs of known TPOTs: the per-rate table, the TPOT gain and its interval, the
crossover rate and the load claims' verdicts."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest

from analysis import serving, stats
from pipeline.sweep.axes import rate_label

matplotlib.use("Agg")
RATES = (0.3, 0.6, 1.2, 2.0)
TPOT = {  # ms, per rate: ar flat, spd better at low load and worse past 0.6/s, spd-load the better of the two
    "ar": (50.0, 50.0, 50.0, 50.0),
    "spd": (40.0, 44.0, 60.0, 75.0),
    "spd-load": (40.0, 44.0, 50.0, 50.0),
    "worse": (60.0, 60.0, 60.0, 60.0),
}


def runs() -> pd.DataFrame:
    rows = []
    for seed, jitter in zip((0, 1, 2), (-0.5, 0.0, 0.5)):
        for method, tpots in TPOT.items():
            for rate, tpot in zip(RATES, tpots):
                rows.append(
                    {
                        "pair": "p",
                        "dataset": "d",
                        "label": rate_label(f"{method} (batch 4)", rate),
                        "seed": seed,
                        "device": "cpu",
                        "batch_size": 4,
                        "rate": rate,
                        "tpot_ms_p50": tpot + jitter,
                        "tpot_ms_p99": 2 * tpot,
                        "ttft_s_p50": 0.1 * rate,
                        "throughput_tok_s": 40 * rate,
                        "tokens_per_s": 40 * rate,
                        "goodput_rps": rate,
                        "mean_batch_occupancy": rate,
                    }
                )
    return pd.DataFrame(rows)


def test_the_table_pairs_each_cell_with_ar_at_its_rate():
    t = serving.table(runs())
    spd = t[t["method"] == "spd"].set_index("rate")
    assert list(spd.index) == list(RATES) and (spd["seeds"] == 3).all()
    assert spd.loc[0.3, "gain"] == pytest.approx(np.mean([49.5 / 39.5, 50 / 40, 50.5 / 40.5]))
    assert spd.loc[0.3, "low"] < spd.loc[0.3, "gain"] < spd.loc[0.3, "high"]
    assert t[t["method"] == "ar"]["gain"].tolist() == pytest.approx([1.0] * 4)
    # the generic speedup pairs by rate too (stats.MATCH): ar at 2/s is not ar at 0.3/s
    ratios = stats.add_ratios(
        runs().assign(
            j_per_token=math.nan, dynamic_j_per_token=math.nan, draft_steps=0, accepted_per_step=1.0, method="x"
        )
    )
    assert ratios[ratios["label"].str.startswith("spd ")]["speedup"].tolist() == pytest.approx([1.0] * 12)


def test_the_crossover_is_each_seeds_first_rate_below_one():
    cross = serving.crossover(runs()).set_index("method")
    assert cross.loc["spd", "crossover_rate"] == 1.2 and cross.loc["spd", "seeds_with_one"] == 3
    assert math.isnan(cross.loc["spd-load", "crossover_rate"])  # never below ar (equal past 0.6/s)
    assert cross.loc["worse", "crossover_rate"] == 0.3  # below 1 already at the lowest rate
    md = serving.markdown(runs(), serving.load_serving_claims())
    assert "| p | d | spd | 1.20" in md and "none (> 2)" in md and "(at the lowest rate, 0.3)" in md


def test_the_load_claims():
    claims = [
        {"id": "holds", "kind": "gain_holds_up_to", "wording": "w", "method": m} for m in ("spd", "worse", "ghost")
    ] + [
        {"id": "never", "kind": "never_worse", "wording": "w", "method": m, "references": ["ar", "spd"]}
        for m in ("spd-load", "worse")
    ]
    got = serving.evaluate(runs(), claims)
    assert got["verdict"].tolist() == ["supported", "contradicted", "no data", "supported", "contradicted"]
    assert got["R"].iloc[0] == 0.6  # spd's gain holds at 0.3 and 0.6/s, not at 1.2
    assert "worse than the best reference at 0.3/s" in got["note"].iloc[4]


def test_the_shipped_serving_claims_load_and_a_bad_one_is_refused(tmp_path):
    ids = [c["id"] for c in serving.load_serving_claims()]
    assert "load_aware_draft_length_never_worse" in ids and "speculation_tpot_gain_holds_up_to_rate[spd]" in ids
    bad = tmp_path / "claims.yaml"
    bad.write_text("serving_claims:\n  - {id: x, kind: never_worse, wording: w, method: spd}\n")
    with pytest.raises(ValueError, match="names its references"):
        serving.load_serving_claims(bad)


def test_offline_runs_have_no_rate_axis_and_the_figure_draws():
    offline = runs().assign(rate=math.nan)
    assert not serving.varies(offline) and serving.serving_vs_rate(offline) is None
    assert serving.varies(runs()) and serving.serving_vs_rate(runs()) is not None
    assert serving.method_label("spd-load (batch 4) @ 0.3/s") == "spd-load" and serving.method_label("ar") == "ar"
