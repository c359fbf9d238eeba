"""analysis/serving.py on synthetic runs of known TPOTs: the per-rate table, the TPOT gain and its interval, the
crossover rate and the load claims' verdicts."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest

from analysis import serving, stats
from pipeline.measure import bounds
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


# ------------------------------------------------------------------ predicted for a memory-bound accelerator


def simulate_occupancy(rate, new_tokens, tokens, step, cost_per_iteration, slots, requests=4000, seed=0):
    """A toy batched engine, independent of ``bounds``: Poisson arrivals wait for a slot, each iteration serves every
    admitted request ``tokens`` tokens and lasts ``cost_per_iteration(b)`` steps for the b requests in it; the
    time-averaged occupancy and the mean seconds per output token."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, requests))
    t, queue_at, active, area, per_token = 0.0, 0, [], 0.0, []
    while queue_at < requests or active:
        while queue_at < requests and arrivals[queue_at] <= t and len(active) < slots:
            active.append([t, new_tokens])
            queue_at += 1
        if not active:
            t = arrivals[queue_at]
            continue
        dt = step * cost_per_iteration(len(active))
        area += dt * len(active)
        t += dt
        for r in active:
            r[1] -= tokens
        per_token += [(t - r[0]) / new_tokens for r in active if r[1] <= 0]
        active = [r for r in active if r[1] > 0]
    return area / t, float(np.mean(per_token))


@pytest.mark.parametrize("slots", [math.inf, 4])
@pytest.mark.parametrize("load", [0.1, 0.3, 0.6])
def test_the_served_occupancy_is_littles_law_against_a_simulated_engine(load, slots):
    """bounds.served_occupancy and served_tpot against a discrete-event engine with occupancy-dependent iterations (a
    tight roof of 8 rows, so the batch term matters): within 10% from light to heavy load, with unbounded and 4 slots
    (Without the request itself in the batch it sees, the model missed by 20% at a fifth of the capacity.)"""
    step, roof, new_tokens, tokens, drafted, c = 1e-3, 8.0, 48, 2, 2, 0.25
    cost = bounds.per_token_cost(tokens, drafted, c, roof)
    rate = load / (new_tokens * step * cost[1])  # a share of the compute's capacity
    sim_b, sim_tpot = simulate_occupancy(
        rate, new_tokens, tokens, step, lambda b: drafted * c + 1 + b * (drafted + 1) / roof, slots
    )
    b = bounds.served_occupancy(rate, new_tokens, step, cost, slots)
    tpot = bounds.served_tpot(rate, new_tokens, step, cost, slots)
    if b < slots:  # Little's law, the fixed point it claims
        assert b == pytest.approx(rate * new_tokens * tpot)
    assert b == pytest.approx(sim_b, rel=0.1) and tpot == pytest.approx(sim_tpot, rel=0.1)


def test_the_predicted_crossover():
    step = bounds.step_seconds(1.35e8)
    assert step == pytest.approx(1.35e8 * 2 / 2.04e12)
    # memory-bound (no roof): the gain is Leviathan's at every rate, above or below 1
    up = bounds.predicted_serving(1.9, 2, 0.26, 48, step, slots=4, roof_rows=math.inf)
    assert up["gain_idle"] == pytest.approx(1.9 / 1.52) and up["gain_full"] == pytest.approx(1.9 / 1.52)
    alone = bounds.predicted_serving(1.9, 2, 0.26, 48, step, roof_rows=153.0)["gain_idle"]
    assert alone == pytest.approx((1 + 1 / 153) / ((1.52 + 3 / 153) / 1.9))  # one request: its rows' compute too
    assert up["rate"] == math.inf and up["occupancy"] == math.inf
    assert bounds.predicted_serving(1.2, 2, 0.26, 48, step, slots=4)["rate"] == 0.0  # never pays
    # a roof, unbounded slots: at the predicted rate both methods' TPOTs are equal, and b* is where equal batches tie
    got = bounds.predicted_serving(1.9, 2, 0.26, 48, step, roof_rows=153.0)
    ar, mine = bounds.per_token_cost(1, 0, 0, 153.0), bounds.per_token_cost(1.9, 2, 0.26, 153.0)
    tpot = lambda cost, r: bounds.served_tpot(r, 48, step, cost, math.inf)  # noqa: E731
    assert tpot(ar, got["rate"]) == pytest.approx(tpot(mine, got["rate"]), rel=1e-6)
    assert tpot(ar, 0.9 * got["rate"]) > tpot(mine, 0.9 * got["rate"])
    assert tpot(ar, 1.1 * got["rate"]) < tpot(mine, 1.1 * got["rate"])
    b = got["occupancy"]
    assert ar[0] + ar[1] * b == pytest.approx(mine[0] + mine[1] * b)
    # 4 slots far below b*: the batch never grows enough, no crossover; 64 slots past it: one below ar's capacity
    assert bounds.predicted_serving(1.9, 2, 0.26, 48, step, slots=4)["rate"] == math.inf
    at64 = bounds.predicted_serving(1.9, 2, 0.26, 48, step, slots=64)
    assert at64["gain_full"] < 1 and math.isfinite(at64["rate"]) and at64["rate"] <= at64["ar_capacity"] * 1.5


def test_the_report_predicts_each_methods_crossover_from_its_acceptance():
    data = runs().assign(run_id=lambda d: [f"r{i}" for i in range(len(d))])
    samples = []
    for r in data.itertuples():
        method = serving.method_label(r.label)
        its, drafted = (24, 0) if method == "ar" else (16, 32)  # 48 tokens in 16 iterations of 2 drafts: E = 3
        samples += [{"run_id": r.run_id, "new_tokens": 48, "iterations": its, "drafted_total": drafted}] * 2
    pred = serving.predicted(data, pd.DataFrame(samples), {"p": 0.3}, {"p": 1e-3}, roof_rows=8.0)
    spd = pred.set_index("method").loc["spd"]
    assert spd["tokens_per_iteration"] == 3.0 and spd["drafted_per_iteration"] == 2.0 and spd["seeds"] == 3
    want = bounds.predicted_serving(3.0, 2.0, 0.3, 48, 1e-3, slots=4, roof_rows=8.0)
    assert spd["rate"] == pytest.approx(want["rate"]) and spd["gain_full"] == pytest.approx(want["gain_full"])
    assert "ar" not in set(pred["method"])
    md = serving.markdown(runs(), None, pred)
    assert "## Predicted for a memory-bound accelerator" in md and "| p | d | spd | 0.300 | 1.000 | 3.00 | 2.00 |" in md
    assert serving.predicted(data, pd.DataFrame(), {}, {}).empty
