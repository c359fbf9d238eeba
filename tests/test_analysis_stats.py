"""analysis.stats: mean ± std with ddof=1, per-seed ratios then averaged, paired bootstrap, Leviathan's bound."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pandas as pd
import pytest

from analysis import stats
from pipeline.measure import bounds


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
    runs = _runs(
        [
            ("p", "d", "ar", "ar", 0, "A100", 10.0),
            ("p", "d", "spd", "spd", 0, "H100", 30.0),
            ("p", "d", "spd", "spd", 1, "A100", 30.0),
            ("p", "d", "spd", "spd", 0, "A100", 20.0),
        ]
    )
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
    runs = pd.DataFrame(
        {
            "pair": "p",
            "dataset": "d",
            "label": ["ar", "spd", "spd"],
            "method": ["ar", "spd", "spd"],
            "seed": [0, 0, 1],
            "gamma": [None, 4, 4],
            "accepted_per_step": [1.0, 2.3056, 2.3056],
            "speedup": [1.0, 1.5, 1.7],
        }
    )
    frame = stats.bound_frame(runs).set_index("label")
    assert frame.at["spd", "alpha_mean"] == pytest.approx(0.6, abs=1e-4)
    assert math.isnan(frame.at["spd", "bound_mean"]) and frame.at["spd", "bound_note"] == stats.NO_C_REASON
    assert frame.at["ar", "bound_note"] == stats.NO_GAMMA_REASON
    given = stats.bound_frame(runs, cost_ratio=0.1).set_index("label")
    assert given.at["spd", "bound_mean"] == pytest.approx(2.3056 / 1.4, abs=1e-4) and given.at["spd", "c"] == 0.1


def test_bound_frame_calls_a_speedup_above_its_bound_a_measurement_problem():
    runs = pd.DataFrame(
        {
            "pair": "p",
            "dataset": "d",
            "label": ["spd", "spd"],
            "method": ["spd", "spd"],
            "seed": [0, 1],
            "gamma": [4, 4],
            "accepted_per_step": [2.3056, 2.3056],
            "speedup": [3.5, 3.7],
        }
    )  # bound ~1.65
    row = stats.bound_frame(runs, cost_ratio=0.1).iloc[0]
    assert row["speedup_mean"] > row["bound_mean"] and stats.ABOVE_BOUND in row["bound_note"]
    runs["speedup"] = [1.5, 1.6]
    assert stats.ABOVE_BOUND not in stats.bound_frame(runs, cost_ratio=0.1).iloc[0]["bound_note"]


# ----------------------------------------------------------------------------------- the exact test over prompts


def _rejects(ci: stats.ClusterInterval) -> bool:
    return bool(ci.low > 0 or ci.high < 0)


def test_six_prompts_are_the_fewest_the_exact_test_can_decide_with():
    assert stats.MIN_PROMPTS == 6 and stats.min_clusters(0.005) == 8  # 2^-n <= the tail
    five = stats.sign_flip_interval([0.3, 0.4, 0.5, 0.6, 0.7])
    assert (
        five.low == -math.inf and five.high == math.inf and five.mean == pytest.approx(0.5)
    )  # every effect positive: still undecided
    six = stats.sign_flip_interval([0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    # 64 sign patterns, K = floor(0.025 x 64) = 1: the bounds are the smallest and largest subset means, min and max
    assert (six.low, six.high) == pytest.approx((0.3, 0.8)) and _rejects(six) and six.exact


def test_the_interval_inverts_the_sign_flip_test_pattern_by_pattern():
    rng = np.random.default_rng(3)
    d = rng.normal(0.2, 0.5, size=8)
    ci = stats.sign_flip_interval(d)
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))

    def p_greater(theta: float) -> float:  # one-sided p of "centre <= theta": flipped sums at least the observed one
        x = d - theta
        return float(((signs * np.abs(x)) @ np.ones(d.size) >= x.sum() - 1e-12).mean())

    eps = 1e-9
    assert p_greater(ci.low - eps) <= stats.TAIL < p_greater(ci.low + eps)
    mirrored = stats.sign_flip_interval(-d)
    assert (mirrored.low, mirrored.high) == pytest.approx((-ci.high, -ci.low))


@pytest.mark.parametrize("n", [6, 7, 8, 10])
def test_no_null_sign_pattern_is_decided_more_often_than_nominal(n):
    # Under a null where a prompt's method and reference generations are exchangeable, each prompt-level effect is
    # as likely +x as -x: given |d|, all 2^n sign patterns are equally likely. Counting the patterns whose interval
    # excludes 0 gives the exact false-positive rate, with no simulation noise; it is at most 5% for any |d|.
    rng = np.random.default_rng(n)
    for _ in range(3):
        magnitude = rng.lognormal(0, 1, size=n)
        decided = sum(
            _rejects(stats.sign_flip_interval(np.array(s) * magnitude))
            for s in itertools.product((1.0, -1.0), repeat=n)
        )
        assert decided / 2**n <= 0.05
        assert decided == 2 * math.floor(0.025 * 2**n)  # exactly the nominal number of patterns on each side


def _clustered_null(n_prompts: int, n_seeds: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Per-generation perplexities of a lossless method and ar: the same law, strongly clustered by prompt."""
    level = rng.lognormal(1.0, 0.4, size=n_prompts)[:, None]
    return level * rng.lognormal(0, 0.5, size=(n_prompts, n_seeds)), level * rng.lognormal(
        0, 0.5, size=(n_prompts, n_seeds)
    )


def test_false_positive_rate_at_make_run_sizes_and_larger_is_at_most_nominal():
    # make run: 3 prompts x 3 seeds per dataset (conf/sweep/smoke.yaml); then 10 x 3 and 20 x 3 (random flips above 14)
    rng = np.random.default_rng(0)
    for n_prompts, reps in ((3, 300), (10, 600), (20, 300)):
        decided = 0
        for r in range(reps):
            ref, new = _clustered_null(n_prompts, 3, rng)
            decided += _rejects(stats.sign_flip_interval(np.log(new.mean(axis=1) / ref.mean(axis=1)), seed=r))
        rate, se = decided / reps, math.sqrt(0.05 * 0.95 / reps)
        assert rate <= 0.05 + 2 * se, (n_prompts, rate)  # consistent with <= 5% (the pattern count above proves it)
        if n_prompts < stats.MIN_PROMPTS:
            assert decided == 0


def test_the_old_bootstrap_over_generations_was_overconfident_at_make_run_sizes():
    # what the verdicts used before: pairs of generations resampled within each seed; at 3 prompts x 3 seeds a null
    # effect came out "significant" far above 5% (the contradicted perplexity of spd)
    rng = np.random.default_rng(1)
    seeds = np.tile(np.arange(3), 3)
    decided = 0
    for r in range(150):
        ref, new = _clustered_null(3, 3, rng)
        decided += stats.paired_bootstrap(
            ref.reshape(-1, 1), new.reshape(-1, 1), stats.mean_of_column, strata=seeds, n_boot=200, seed=r
        ).significant
    assert decided / 150 > 0.1


def test_random_flips_above_fourteen_prompts_are_seeded():
    d = np.random.default_rng(5).normal(0.1, 1.0, size=30)
    a, b = stats.sign_flip_interval(d, seed=2), stats.sign_flip_interval(d, seed=2)
    assert (a.low, a.high) == (b.low, b.high) and not a.exact and a.low < a.mean < a.high


def test_cluster_bootstrap_moves_a_prompts_generations_together():
    # prompt A: every generation 1 better, prompt B: 3 better; resampling prompts varies the mix, generations do not
    ref = np.zeros((10, 1))
    new = np.array([1.0] * 5 + [3.0] * 5)[:, None]
    prompts = np.array(["A"] * 5 + ["B"] * 5)
    res = stats.cluster_bootstrap(ref, new, prompts, stats.mean_of_column, n_boot=300, seed=0)
    assert (
        res.n_units == 2
        and res.diff == pytest.approx(2.0)
        and res.low == pytest.approx(1.0)
        and res.high == pytest.approx(3.0)
    )


def test_significance_needs_six_prompts_and_leaves_out_excluded_runs():
    rows = []
    for label, shift in (("ar", 0.0), ("m", 1.0)):
        for p in range(4):
            for seed in range(3):
                rows.append(
                    {
                        "pair": "p",
                        "dataset": "d",
                        "label": label,
                        "run_id": f"{label}{seed}",
                        "seed": seed,
                        "id": f"q{p}",
                        "turn": 0,
                        "sample_score": p + shift,
                        "new_tokens": 10,
                        "decode_s": 1.0,
                    }
                )
    samples = pd.DataFrame(rows)
    sig = stats.significance(samples, "ar", "score", n_boot=200).iloc[0]
    assert (
        sig["diff"] == pytest.approx(1.0) and sig["n_prompts"] == 4 and not sig["significant"]
    )  # 4 prompts decide nothing
    assert stats.significance(samples, "ar", "score", n_boot=200, exclude_runs={"m0"}).iloc[0]["n_units"] == 8


# ----------------------------------------------------------------------------------- disturbed cells


def test_cells_slower_than_the_calibration_are_flagged_and_their_timing_left_out():
    runs = pd.DataFrame(
        {
            "pair": "p",
            "device": "cpu",
            "label": ["ar", "ar", "spd", "spd"],
            "seed": [0, 1, 0, 1],
            "tokens_per_s": [10.0, 3.0, 20.0, 21.0],
            "probe_before_ms": [10.0, 30.0, 10.5, 11.0],
            "probe_after_ms": [10.2, 12.0, 10.1, 16.0],
            "calibrated_target_step_ms": 10.0,
        }
    )
    marked = stats.mark_disturbed(runs)
    assert marked["disturbed"].tolist() == [False, True, False, True]  # 3.0x and 1.6x the calibration
    assert marked["step_slowdown"].tolist() == pytest.approx([1.02, 3.0, 1.05, 1.6])
    timed = stats.without_disturbed_timing(marked)
    assert timed["tokens_per_s"].isna().tolist() == [False, True, False, True]
    # without a calibration (an older driver): against the fastest probe of the pair on that device
    fallback = stats.mark_disturbed(runs.drop(columns="calibrated_target_step_ms"))
    assert fallback["disturbed"].tolist() == [False, True, False, True] and fallback["step_slowdown"].iloc[
        0
    ] == pytest.approx(1.02)
    assert not stats.mark_disturbed(runs.drop(columns=["probe_before_ms", "probe_after_ms"]))[
        "disturbed"
    ].any()  # no probes: unknown


def test_a_metric_the_schema_lacks_is_refused_not_shown_empty():
    """A metric logged by the cells but not mapped in analysis/schema.METRICS never becomes a column of the runs;
    asking for it fails naming the fix (before issue 55: a column of NaN, silently)."""
    runs = pd.DataFrame({"label": ["ar", "spd"], "seed": [0, 0], "tokens_per_s": [1.0, 2.0]})
    assert stats.aggregate(runs, ["tokens_per_s"], by=("label",))["tokens_per_s_mean"].tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match=r"\['draft_energy_j'\] .*add each to analysis/schema.METRICS"):
        stats.aggregate(runs, ["tokens_per_s", "draft_energy_j"], by=("label",))
