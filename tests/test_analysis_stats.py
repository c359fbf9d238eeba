"""analysis.stats: mean ± std with ddof=1, per-seed ratios then averaged, paired bootstrap, Leviathan's bound."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd
import pytest

from analysis import stats
from pipeline import bounds


def test_mean_std_uses_ddof_1_and_skips_nan():
    assert stats.mean_std([10.0, 12.0, 11.0]) == (11.0, 1.0, 3)  # sum of squares 2, over n-1 = 2
    mean, std, n = stats.mean_std([1.0, float("nan"), 3.0])
    assert (mean, n) == (2.0, 2) and std == pytest.approx(math.sqrt(2.0))
    mean, std, n = stats.mean_std([5.0])
    assert mean == 5.0 and math.isnan(std) and n == 1
    assert stats.mean_std([])[2] == 0


def _runs(rows):
    return pd.DataFrame(rows, columns=["pair", "dataset", "label", "method", "seed", "device", "tokens_per_s"])


def test_speedup_is_per_seed_then_averaged():
    rows = [("p", "d", "ar", "ar", s, "gpu", v) for s, v in enumerate((10.0, 12.0, 11.0))]
    rows += [("p", "d", "spd", "spd", s, "gpu", v) for s, v in enumerate((20.0, 18.0, 25.0))]
    runs = _runs(rows)
    ratio = stats.per_seed_ratio(runs, "tokens_per_s")
    assert ratio[runs["label"] == "spd"].tolist() == pytest.approx([2.0, 1.5, 25.0 / 11.0])
    agg = stats.aggregate(runs.assign(speedup=ratio), ["speedup"]).set_index("label")
    per_seed = [2.0, 1.5, 25.0 / 11.0]
    assert agg.at["spd", "speedup_mean"] == pytest.approx(statistics.mean(per_seed))  # 1.9242...
    assert agg.at["spd", "speedup_std"] == pytest.approx(statistics.stdev(per_seed))  # 0.3919...
    assert agg.at["spd", "speedup_mean"] != pytest.approx(21.0 / 11.0)  # not the ratio of the means
    assert agg.at["ar", "speedup_mean"] == 1.0 and agg.at["ar", "speedup_std"] == 0.0


def test_ratio_needs_the_same_seed_and_device():
    runs = _runs([("p", "d", "ar", "ar", 0, "A100", 10.0), ("p", "d", "spd", "spd", 0, "H100", 30.0),
                  ("p", "d", "spd", "spd", 1, "A100", 30.0), ("p", "d", "spd", "spd", 0, "A100", 20.0)])
    ratio = stats.per_seed_ratio(runs, "tokens_per_s").tolist()
    assert math.isnan(ratio[1]) and math.isnan(ratio[2]) and ratio[3] == 2.0


def test_bootstrap_constant_difference_gives_a_point_interval():
    ref = np.arange(1.0, 21.0)[:, None]
    res = stats.paired_bootstrap(ref, ref + 3.0, stats.mean_of_column, n_boot=500, seed=0)
    assert (res.diff, res.low, res.high) == pytest.approx((3.0, 3.0, 3.0)) and res.significant and res.n_units == 20


def test_bootstrap_resamples_within_strata():
    # difference 1 in stratum A, 3 in stratum B, 5 units each: every stratified replicate has a mean difference of 2
    ref = np.zeros((10, 1))
    new = np.array([1.0] * 5 + [3.0] * 5)[:, None]
    strata = np.array(["A"] * 5 + ["B"] * 5)
    res = stats.paired_bootstrap(ref, new, stats.mean_of_column, strata=strata, n_boot=300, seed=1)
    assert (res.low, res.diff, res.high) == pytest.approx((2.0, 2.0, 2.0))
    free = stats.paired_bootstrap(ref, new, stats.mean_of_column, n_boot=300, seed=1)
    assert free.low < 2.0 < free.high  # without strata the mix varies


def test_bootstrap_is_seeded_and_close_to_the_normal_interval():
    rng = np.random.default_rng(7)
    ref = rng.integers(0, 2, 400).astype(float)[:, None]
    new = np.where(rng.random(400) < 0.2, 1.0, ref[:, 0])[:, None]  # new passes 20 % of ref's failures
    a = stats.paired_bootstrap(ref, new, stats.mean_of_column, n_boot=2000, seed=3)
    b = stats.paired_bootstrap(ref, new, stats.mean_of_column, n_boot=2000, seed=3)
    assert (a.low, a.high) == (b.low, b.high)
    d = (new - ref)[:, 0]
    half = 1.96 * d.std(ddof=1) / math.sqrt(d.size)
    assert a.diff == pytest.approx(d.mean())
    assert a.low == pytest.approx(d.mean() - half, abs=0.01) and a.high == pytest.approx(d.mean() + half, abs=0.01)


def test_ratio_of_sums_is_pooled_tokens_per_second():
    units = np.array([[20.0, 2.0], [80.0, 4.0]])
    assert stats.ratio_of_sums(units) == pytest.approx(100.0 / 6.0)  # not the mean of 10 and 20


def test_alpha_inversion_and_leviathan_bound():
    e = bounds.expected_tokens(0.6, 4)
    assert e == pytest.approx((1 - 0.6**5) / 0.4)  # 2.3056
    assert bounds.alpha_from_tokens_per_step(e, 4) == pytest.approx(0.6, abs=1e-9)
    assert bounds.alpha_from_tokens_per_step(1.0, 4) == 0.0 and bounds.alpha_from_tokens_per_step(5.0, 4) == 1.0
    assert math.isnan(bounds.alpha_from_tokens_per_step(float("nan"), 4))
    assert bounds.leviathan_bound(0.6, 4, 0.1) == pytest.approx(2.3056 / 1.4)
    assert bounds.leviathan_bound(1.0, 4, 0.0) == 5.0
    assert math.isnan(bounds.leviathan_bound(0.6, 4, float("nan")))


def test_bound_frame_says_why_it_is_missing():
    runs = pd.DataFrame({"pair": "p", "dataset": "d", "label": ["ar", "spd", "spd"], "method": ["ar", "spd", "spd"],
                         "seed": [0, 0, 1], "gamma": [None, 4, 4], "accepted_per_step": [1.0, 2.3056, 2.3056],
                         "speedup": [1.0, 1.5, 1.7]})
    frame = stats.bound_frame(runs).set_index("label")
    assert frame.at["spd", "alpha_mean"] == pytest.approx(0.6, abs=1e-4)
    assert math.isnan(frame.at["spd", "bound_mean"]) and frame.at["spd", "bound_note"] == stats.NO_C_REASON
    assert frame.at["ar", "bound_note"] == stats.NO_GAMMA_REASON
    given = stats.bound_frame(runs, cost_ratio=0.1).set_index("label")
    assert given.at["spd", "bound_mean"] == pytest.approx(2.3056 / 1.4, abs=1e-4) and given.at["spd", "c"] == 0.1
