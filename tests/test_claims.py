"""Claims as data, their paired bootstrap and verdicts, and the acceptance metrics (pipeline.measure.acceptance).

Synthetic runs with a known effect: a true effect is found, a null one is not, at the stated rates; the
per-position acceptance rates against hand-counted ``accepted`` lists; pooled against per-request means
on a case where they differ; ``drafted`` as the engine records it.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest

from analysis.claims import evaluate_claims
from analysis.claims_report import acceptance_tables, write_claims
from analysis.claims_spec import (
    CLAIMS_FILE,
    CONTRADICTED,
    INCONCLUSIVE,
    MEASUREMENT_PROBLEM,
    SUPPORTED,
    TOO_FEW,
    Claim,
    load_claims,
    samples_needed,
    verdict,
)
from helpers.exact import PROMPT
from pipeline.decoding import METHODS, build_decoder, make_generator
from pipeline.measure.acceptance import (
    acceptance_metrics,
    checkpoint_id,
    position_counts,
    reconstruct_drafted,
    records_metrics,
    speculation_profile,
)
from pipeline.measure.bounds import expected_tokens

# ----------------------------------------------------------------------------------- synthetic sweeps

# the keys of NVIDIA specdec_bench's speculation_profile.json (Model-Optimizer examples/specdec_bench/specdec_bench/
# speculation_profile.py, build_profile, schema 1.0)
PROFILE_KEYS = {
    "schema_version",
    "measured",
    "method",
    "draft_checkpoint",
    "target_model",
    "num_speculative_tokens",
    "block_size",
    "max_supported_k",
    "verification_method",
    "conditional_accept_rates",
    "marginal_accept_rates",
    "mean_accept_length",
    "mean_accept_length_per_request",
    "accept_length_model",
    "accept_length_by_k",
    "acceptance_length_histogram",
    "per_category",
    "measurement_conditions",
    "validation",
}


def synthetic(
    effects: dict[str, float],
    n_prompts: int = 20,
    seeds=(0, 1, 2),
    sd: float = 0.3,
    rng_seed: int = 0,
    gamma: int = 4,
    alpha: float = 0.5,
    device: str = "cpu",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A runs frame and a samples frame: per label, per-generation perplexity = prompt level x (1 + effect) x
    lognormal noise (sd); accepted lists drawn with i.i.d. acceptance ``alpha`` and chain length ``gamma``."""
    rng = np.random.default_rng(rng_seed)
    level = rng.lognormal(1.0, 0.4, size=n_prompts)
    runs, samples = [], []
    for label, effect in effects.items():
        for seed in seeds:
            run_id = f"{label}-{seed}"
            runs.append(
                {
                    "run_id": run_id,
                    "pair": "p",
                    "dataset": "d",
                    "label": label,
                    "method": label,
                    "seed": seed,
                    "gamma": gamma if label != "ar" else None,
                    "max_new_tokens": 64,
                    "device": device,
                    "j_per_token": 1.0 + effect,
                }
            )
            for i in range(n_prompts):
                accepted, drafted = [], []
                if label != "ar":
                    while sum(accepted) < 40:
                        a = 0
                        while a < gamma and rng.random() < alpha:
                            a += 1
                        accepted.append(a + 1)
                        drafted.append(gamma)
                else:
                    accepted = [1] * 40
                tokens = sum(accepted)
                samples.append(
                    {
                        "run_id": run_id,
                        "label": label,
                        "method": label,
                        "seed": seed,
                        "id": f"q{i}",
                        "turn": 0,
                        "new_tokens": tokens,
                        "steps": len(accepted),
                        "draft_steps": sum(drafted),
                        "accepted": accepted,
                        "drafted": drafted,
                        "decode_s": tokens / 20.0 * rng.lognormal(0, 0.1),
                        "perplexity": level[i] * (1 + effect) * rng.lognormal(0, sd),
                        "sample_score": float(rng.random() < 0.3),
                    }
                )
    return pd.DataFrame(runs), pd.DataFrame(samples)


PPL_CLAIM = Claim(
    id="ppl",
    source="test",
    wording="lower perplexity",
    method="m",
    reference="ar",
    statistic="perplexity",
    scale="relative",
    direction="less",
)


def test_a_true_effect_is_found_and_a_null_one_is_not_at_the_stated_rates():
    # 20 prompts x 3 seeds: per prompt the log ratio of two means of 3 lognormal(0.3) values (sd ~0.25); SE of the mean
    # effect ~5.5%; a -25% effect sits > 4 SE away (power ~99%), a null is "supported" (CI below 0) at most at the
    # one-sided 2.5% rate of the exact test.
    found = false_support = contradicted_true = 0
    reps = 30
    for r in range(reps):
        runs, samples = synthetic({"ar": 0.0, "m": -0.25}, rng_seed=r)
        row = evaluate_claims([PPL_CLAIM], runs, samples, n_boot=300, seed=r).iloc[0]
        found += row["verdict"] == SUPPORTED
        contradicted_true += row["verdict"] == CONTRADICTED
        assert row["low"] < row["effect"] < row["high"] and row["n"] == 20 and row["n_pairs"] == 60
        runs, samples = synthetic({"ar": 0.0, "m": 0.0}, rng_seed=1000 + r)
        row = evaluate_claims([PPL_CLAIM], runs, samples, n_boot=300, seed=r).iloc[0]
        false_support += row["verdict"] == SUPPORTED
    assert found >= reps - 2 and contradicted_true == 0
    assert false_support <= 4  # binomial(30, 0.025): P(> 4) < 0.001


def test_effect_and_interval_on_a_noise_free_case():
    runs, samples = synthetic({"ar": 0.0, "m": -0.2}, sd=0.0)
    row = evaluate_claims([PPL_CLAIM], runs, samples, n_boot=200).iloc[0]
    assert (
        row["effect"] == pytest.approx(-0.2)
        and row["low"] == pytest.approx(-0.2)
        and row["high"] == pytest.approx(-0.2)
    )
    assert row["verdict"] == SUPPORTED and row["samples_needed"] == 20  # prompts


def test_verdicts_for_every_direction():
    assert verdict(0.01, 0.2, "greater") == SUPPORTED and verdict(-0.2, -0.01, "greater") == CONTRADICTED
    assert verdict(-0.1, 0.1, "greater") == INCONCLUSIVE
    assert verdict(-0.2, -0.01, "less") == SUPPORTED and verdict(0.01, 0.2, "less") == CONTRADICTED
    assert verdict(-0.04, 0.1, "at_least", 0.05) == SUPPORTED and verdict(-0.3, -0.06, "at_least", 0.05) == CONTRADICTED
    assert verdict(-0.06, 0.1, "at_least", 0.05) == INCONCLUSIVE
    assert verdict(-0.3, 0.04, "at_most", 0.05) == SUPPORTED and verdict(0.06, 0.3, "at_most", 0.05) == CONTRADICTED
    assert (
        verdict(-0.04, 0.04, "equivalent", 0.05) == SUPPORTED and verdict(0.06, 0.1, "equivalent", 0.05) == CONTRADICTED
    )
    assert verdict(-0.04, 0.06, "equivalent", 0.05) == INCONCLUSIVE and verdict(math.nan, 1, "greater") == INCONCLUSIVE


def test_samples_needed_follows_the_power_formula():
    # effect 0.1 at SE 0.1 with 60 pairs: (2.80 * 0.1 / 0.1)^2 = 7.85 times more pairs
    assert samples_needed(60, 0.1, 0.1, "greater") == math.ceil(60 * (1.959964 + 0.841621) ** 2)
    assert samples_needed(60, 0.1, 0.0, "greater") == math.inf
    assert samples_needed(60, 0.01, 0.02, "equivalent", 0.05) == 60  # already decisive at this size: no more needed


def test_gpu_claims_and_missing_methods_are_untested_here_with_the_command():
    claims = [
        Claim(
            id="speed",
            source="s",
            wording="w",
            method="m",
            reference="ar",
            statistic="tokens_per_s",
            requires="gpu",
            command="run it on a GPU",
        ),
        Claim(
            id="bild", source="s", wording="w", method="bild", reference="ar", statistic="perplexity", direction="less"
        ),
        Claim(
            id="energy",
            source="s",
            wording="w",
            method="m",
            reference="ar",
            statistic="j_per_token",
            direction="less",
            requires="gpu",
        ),
    ]
    runs, samples = synthetic({"ar": 0.0, "m": -0.2})
    table = evaluate_claims(claims, runs, samples, n_boot=100).set_index("claim")
    assert table.at["speed", "verdict"] == "untested" and "run it on a GPU" in table.at["speed", "note"]
    assert (
        table.at["bild", "status"] == "no data"
        and "no data" in table.at["bild", "note"]
        and "bild" in table.at["bild", "note"]
    )
    runs, samples = synthetic({"ar": 0.0, "m": -0.2}, device="NVIDIA H100")
    table = evaluate_claims(claims, runs, samples, n_boot=100).set_index("claim")
    assert table.at["speed", "status"] == "tested" and table.at["energy", "effect"] == pytest.approx(-0.2 / 1.0)
    assert table.at["energy", "n"] == 3  # cells paired by seed


def test_leviathan_formula_holds_for_iid_acceptance_and_fails_when_acceptance_falls():
    claim = Claim(
        id="lev",
        source="s",
        wording="w",
        method="m",
        reference=None,
        statistic="leviathan_tokens_per_step",
        direction="equivalent",
        margin=0.05,
    )
    runs, samples = synthetic({"m": 0.0}, alpha=0.6, n_prompts=30)
    row = evaluate_claims([claim], runs, samples, n_boot=300).iloc[0]
    assert abs(row["effect"]) < 0.03 and row["verdict"] == SUPPORTED
    # acceptance that falls with position (position 1 always accepted, position 2 never): alpha = 1 predicts 5 tokens,
    # 2 measured
    samples["accepted"] = samples["accepted"].map(lambda a: [2] * len(a))
    samples["new_tokens"] = samples["accepted"].map(sum)
    row = evaluate_claims([claim], runs, samples, n_boot=100).iloc[0]
    assert row["effect"] == pytest.approx(5 / 2 - 1) and row["verdict"] == CONTRADICTED


def test_the_shipped_claims_file_loads_and_bad_entries_name_the_fix(tmp_path):
    claims = load_claims()
    ids = {c.id for c in claims}
    assert {
        "mtad_ppl_vs_ar",
        "block_tokens_per_step_vs_token",
        "leviathan_tokens_per_step[spd]",
        "lossless_score_equals_ar[block]",
    } <= ids
    assert CLAIMS_FILE.name == "claims.yaml" and any(c.requires == "gpu" and c.command for c in claims)
    bad = tmp_path / "c.yaml"
    bad.write_text(
        "claims:\n  - {id: x, source: s, wording: w, method: m, reference: ar, statistic: perplexity, "
        "direction: lower}\n"
    )
    with pytest.raises(ValueError, match="direction 'lower' is not one of greater, less"):
        load_claims(bad)
    bad.write_text(
        "claims:\n  - {id: x, source: s, wording: w, method: m, reference: ar, statistic: score, "
        "direction: equivalent}\n"
    )
    with pytest.raises(ValueError, match="needs a margin"):
        load_claims(bad)
    with pytest.raises(FileNotFoundError, match="claims file"):
        load_claims(tmp_path / "none.yaml")


def test_write_claims_writes_the_table_the_figure_and_the_acceptance_tables(tmp_path):
    runs, samples = synthetic({"ar": 0.0, "spd": 0.0, "mtad": -0.25}, n_prompts=10)
    written = write_claims(runs, samples, tmp_path, n_boot=100, sweep="synthetic")
    md = (tmp_path / "claims.md").read_text()
    assert "mtad_ppl_vs_ar" in md and "Untested here" in md and "mtad_speedup_vs_spd" in md and "pooled" in md
    assert (tmp_path / "figures" / "claims_forest.png").read_bytes()[:4] == b"\x89PNG"
    table = written["table"].set_index("claim")
    assert table.at["mtad_ppl_vs_ar", "verdict"] == SUPPORTED
    assert set(written["acceptance"]["label"]) == {"spd", "mtad"}  # ar drafts nothing


# ----------------------------------------------------------------------------------- acceptance metrics


def test_per_position_rates_match_hand_counts():
    # gamma 4; emitted 3, 1, 5, 2 -> accepted drafts 2, 0, 4, 1
    # position 1: reached by 4 steps, accepted by 3 (2, 4, 1); position 2: reached 3, accepted 2;
    # position 3: reached 2 (a >= 2), accepted 1 (a = 4); position 4: reached 1, accepted 1
    reached, acc = position_counts([3, 1, 5, 2], [4, 4, 4, 4])
    assert reached == [4, 3, 2, 1] and acc == [3, 2, 1, 1]
    # a plain step (nothing drafted) and a shorter last draft (near max_new_tokens): a = 1 of 4, -, 2 of 2
    # position 1: reached 2, accepted 2; position 2: reached 2 (a >= 1 both), accepted 1; positions 3, 4: only step 1
    # drafted them, never reached
    reached, acc = position_counts([2, 1, 3], [4, 0, 2])
    assert reached == [2, 2, 0, 0] and acc == [2, 1, 0, 0]
    m = acceptance_metrics([([3, 1, 5, 2], [4, 4, 4, 4])], gamma=4)
    assert m["acceptance_rate_pos1_pooled"] == 3 / 4 and m["acceptance_rate_pos2_pooled"] == 2 / 3
    assert m["acceptance_rate_pos3_pooled"] == 1 / 2 and m["acceptance_rate_pos4_pooled"] == 1.0
    assert m["acceptance_length_pooled"] == 11 / 4 and m["draft_acceptance_rate_pooled"] == 7 / 16
    assert m["alpha_positions"] == 7 / 10 and m["leviathan_tokens_per_step"] == pytest.approx(expected_tokens(0.7, 4))


def test_pooled_and_per_request_differ_where_long_answers_weigh_more():
    # request A: 10 steps, every draft accepted (5 tokens each); request B: 2 steps, none accepted (1 token each)
    m = acceptance_metrics([([5] * 10, [4] * 10), ([1, 1], [4, 4])], gamma=4)
    assert m["acceptance_length_pooled"] == (50 + 2) / 12 and m["acceptance_length_per_request"] == (5 + 1) / 2
    assert m["draft_acceptance_rate_pooled"] == 40 / 48 and m["draft_acceptance_rate_per_request"] == (1.0 + 0.0) / 2
    assert m["acceptance_rate_pos1_pooled"] == 10 / 12 and m["acceptance_rate_pos1_per_request"] == 0.5
    # positions 2..4 are reached only by A: both conventions give 1.0
    assert m["acceptance_rate_pos2_pooled"] == m["acceptance_rate_pos2_per_request"] == 1.0


def test_falling_acceptance_is_flagged_and_iid_is_not():
    # position 1 always accepted, position 2 never: acceptance falls with position
    falls = acceptance_metrics([([2] * 50, [4] * 50)], gamma=4)
    assert falls["acceptance_falls"] == 1.0 and falls["acceptance_falls_z"] < -1.96
    assert falls["alpha_positions"] == 0.5 and falls["alpha_implied"] < 0.8
    rng = np.random.default_rng(0)
    steps = [min(int(rng.geometric(0.4)), 5) for _ in range(400)]  # i.i.d. alpha 0.6, truncated at gamma 4
    flat = acceptance_metrics([(steps, [4] * len(steps))], gamma=4)
    assert flat["acceptance_falls"] == 0.0 and abs(flat["alpha_positions"] - 0.6) < 0.05
    assert abs(flat["alpha_implied"] - flat["alpha_positions"]) < 0.05


def test_reconstructed_drafts_follow_the_chain_loop_rule():
    # gamma 4, 10 new tokens: drafts of 4, 4, then min(4, 10 - 8 - 1) = 1
    assert reconstruct_drafted([3, 5, 2], 4, max_new_tokens=10) == [4, 4, 1]
    assert records_metrics([{"accepted": [1, 1], "draft_steps": 0}], gamma=4) == {}  # nothing drafted: no metrics
    assert (
        records_metrics([{"accepted": [3, 5, 2], "drafted": math.nan, "draft_steps": 9}], gamma=4) != {}
    )  # NaN (a DataFrame's gap) = not logged
    assert records_metrics([{"accepted": math.nan, "draft_steps": 9}], gamma=4) == {}
    assert (
        records_metrics([{"accepted": [3, 5, 2], "draft_steps": 9}], gamma=4, max_new_tokens=10)["drafts_reaching_pos1"]
        == 3
    )


def test_the_engine_records_drafted_per_iteration(tiny_pair):
    # tau 0 accepts every draft: 4 + 4 + 4 + 4 tokens from gamma 3, then one token left -> a plain step
    out = build_decoder("mtad", *tiny_pair, tau=0.0, gamma=3, temperature=1.0, top_k=10, top_p=0.9).generate(
        PROMPT, max_new_tokens=17, generator=make_generator(0)
    )
    assert out.accepted == [4, 4, 4, 4, 1] and out.drafted == [3, 3, 3, 3, 0]
    for method, params in (("spd", {"gamma": 3}), ("specinfer", {})):
        out = build_decoder(method, *tiny_pair, **params).generate(
            PROMPT, max_new_tokens=20, generator=make_generator(1)
        )
        assert len(out.drafted) == len(out.accepted) and all(a - 1 <= d for a, d in zip(out.accepted, out.drafted))
    assert build_decoder("ar", *tiny_pair).generate(PROMPT, max_new_tokens=5, generator=make_generator(0)).drafted == []


def test_acceptance_tables_per_cell_and_per_method():
    runs, samples = synthetic({"ar": 0.0, "spd": 0.0}, n_prompts=5, alpha=0.5)
    per_method, per_cell = acceptance_tables(runs, samples)
    assert list(per_method["label"]) == ["spd"] and len(per_cell) == 3
    assert per_method.iloc[0]["cells"] == 3 and 0.3 < per_method.iloc[0]["alpha_positions"] < 0.7


def test_speedup_over_bound_uses_the_cells_logged_cost_ratio():
    claim = Claim(
        id="bound",
        source="s",
        wording="w",
        method="m",
        reference="ar",
        statistic="speedup_over_bound",
        direction="at_most",
        requires="cost_ratio",
    )
    runs, samples = synthetic({"ar": 0.0, "m": 0.0}, n_prompts=8)
    assert evaluate_claims([claim], runs, samples, n_boot=50).iloc[0]["status"] == "needs c"
    runs["cost_ratio"] = np.where(runs["label"] == "m", 0.1, np.nan)
    row = evaluate_claims([claim], runs, samples, n_boot=50).iloc[0]
    m, ar = samples[samples["label"] == "m"], samples[samples["label"] == "ar"]
    speedup = (m["new_tokens"].sum() / m["decode_s"].sum()) / (ar["new_tokens"].sum() / ar["decode_s"].sum())
    alpha = (
        m["accepted"].map(lambda a: sum(x - 1 for x in a)).sum()
        / m["accepted"].map(lambda a: sum(min(x, 4) for x in a)).sum()
    )
    assert row["pooled_effect"] == pytest.approx(speedup / (expected_tokens(alpha, 4) / (4 * 0.1 + 1)) - 1)
    assert row["n"] == 8 and row["low"] <= row["effect"] <= row["high"]  # the effect: the mean over the 8 prompts
    assert evaluate_claims([claim], runs, samples, n_boot=50, cost_ratio=0.2).iloc[0]["effect"] != pytest.approx(
        row["effect"]
    )


# ----------------------------------------------------------------------------------- verdicts the data can carry


def _null_claims() -> list[Claim]:
    common = dict(source="s", wording="w", method="m", reference="ar", statistic="perplexity", scale="relative")
    return [
        Claim(id="greater", direction="greater", **common),
        Claim(id="less", direction="less", **common),
        Claim(id="at_least", direction="at_least", margin=0.0, **common),
        Claim(id="equivalent", direction="equivalent", margin=0.10, **common),
    ]


WRONG = {
    "greater": (SUPPORTED, CONTRADICTED),
    "less": (SUPPORTED, CONTRADICTED),
    "at_least": (SUPPORTED, CONTRADICTED),
    "equivalent": (CONTRADICTED,),
}  # what a null effect (m and ar the same law) must not be called


def test_make_run_sizes_never_contradict_a_lossless_method():
    # make run: 3 prompts x 3 seeds per dataset (conf/sweep/smoke.yaml); the shipped claims on spd and block (lossless)
    claims = [c for c in load_claims() if c.method in ("spd", "block") and c.statistic in ("perplexity", "score")]
    assert {c.id for c in claims} >= {"lossless_ppl_equals_ar[spd]", "lossless_score_equals_ar[block]"}
    for r in range(10):
        runs, samples = synthetic({"ar": 0.0, "spd": 0.0, "block": 0.0}, n_prompts=3, sd=0.5, rng_seed=r)
        table = evaluate_claims(claims, runs, samples)
        assert (table["verdict"] != CONTRADICTED).all() and (table["verdict"] == TOO_FEW).all(), table[
            ["claim", "verdict"]
        ]
        assert (table["samples_needed"] >= 6).all() and (table["n"] == 3).all() and (table["n_pairs"] == 9).all()
        assert table["note"].str.contains("needs at least 6 prompts to decide").all()


def test_each_verdicts_false_positive_rate_on_a_null_effect_is_at_most_nominal():
    # the whole path (samples -> prompt-level effects -> interval -> verdict) at make run's size and a larger one;
    # tests/test_analysis_stats.py counts the exact rate of the interval over every sign pattern
    for n_prompts, reps in ((3, 8), (10, 40)):
        wrong = dict.fromkeys(WRONG, 0)
        for r in range(reps):
            runs, samples = synthetic(
                {"ar": 0.0, "m": 0.0}, n_prompts=n_prompts, sd=0.5, rng_seed=500 + r, alpha=0.0, gamma=1
            )
            for row in evaluate_claims(_null_claims(), runs, samples, seed=r).to_dict("records"):
                wrong[row["claim"]] += row["verdict"] in WRONG[row["claim"]]
        bound = 0.05 + 2 * math.sqrt(0.05 * 0.95 / reps)
        assert all(k / reps <= bound for k in wrong.values()), (n_prompts, wrong)
        if n_prompts < 6:
            assert sum(wrong.values()) == 0


def test_claims_report_prompts_as_the_unit_and_an_exact_interval():
    runs, samples = synthetic({"ar": 0.0, "m": -0.25}, n_prompts=8, rng_seed=3)
    row = evaluate_claims([PPL_CLAIM], runs, samples).iloc[0]
    per_prompt = []
    for _, g in samples.groupby("id"):
        m, ar = g[g["label"] == "m"]["perplexity"].mean(), g[g["label"] == "ar"]["perplexity"].mean()
        per_prompt.append(math.log(m / ar))
    assert row["effect"] == pytest.approx(math.expm1(np.mean(per_prompt)))
    # 8 prompts: 256 sign patterns, K = floor(0.025 x 256) = 6: the 6th smallest and largest of the 255 subset means
    means = sorted(np.mean(s) for k in range(1, 9) for s in itertools.combinations(per_prompt, k))
    assert (row["low"], row["high"]) == pytest.approx((math.expm1(means[5]), math.expm1(means[-6])))
    assert row["n"] == 8 and row["n_pairs"] == 24 and row["verdict"] == verdict(row["low"], row["high"], "less")


def _with_probes(runs: pd.DataFrame, slow: dict[tuple[str, int], float]) -> pd.DataFrame:
    runs = runs.copy()
    runs["calibrated_target_step_ms"] = 10.0
    runs["probe_before_ms"] = 10.0
    runs["probe_after_ms"] = [10.0 * slow.get((lb, s), 1.0) for lb, s in zip(runs["label"], runs["seed"])]
    return runs


def test_timing_claims_leave_out_disturbed_cells_or_say_none_were_left():
    claim = Claim(
        id="speed", source="s", wording="w", method="m", reference="ar", statistic="tokens_per_s", direction="greater"
    )
    runs, samples = synthetic({"ar": 0.0, "m": 0.0}, n_prompts=8, seeds=(0, 1, 2))
    # seed 1 of m measured beside a CPU-heavy job: every one of its generations 5x slower
    slowed = samples["run_id"] == "m-1"
    samples.loc[slowed, "decode_s"] *= 5.0
    row = evaluate_claims([claim], _with_probes(runs, {("m", 1): 4.0}), samples).iloc[0]
    assert row["n_pairs"] == 16 and "1 cell(s) measured on a disturbed machine left out" in row["note"]
    naive = evaluate_claims([claim], runs, samples).iloc[0]  # without probes nothing is flagged: the slow cell counts
    assert naive["n_pairs"] == 24 and naive["effect"] < row["effect"]
    # perplexity is no timing claim: the disturbed cell still counts
    assert evaluate_claims([PPL_CLAIM], _with_probes(runs, {("m", 1): 4.0}), samples).iloc[0]["n_pairs"] == 24
    every = {("m", s): 3.0 for s in (0, 1, 2)}
    row = evaluate_claims([claim], _with_probes(runs, every), samples).iloc[0]
    assert row["status"] == "disturbed" and row["verdict"] == "untested" and "disturbed" in row["note"]


def test_a_speedup_above_its_own_bound_is_a_measurement_problem():
    claim = Claim(
        id="bound",
        source="s",
        wording="w",
        method="m",
        reference="ar",
        statistic="speedup_over_bound",
        direction="at_most",
        requires="cost_ratio",
    )
    runs, samples = synthetic({"ar": 0.0, "m": 0.0}, n_prompts=8)
    samples.loc[samples["label"] == "m", "decode_s"] /= 20.0  # m measured 20x faster than the bound allows
    row = evaluate_claims([claim], runs, samples, cost_ratio=0.1).iloc[0]
    assert row["low"] > 0 and row["verdict"] == MEASUREMENT_PROBLEM and "not a verdict on the method" in row["note"]


@pytest.mark.parametrize(
    ("margin", "message"),
    [
        (".inf", "finite number"),
        (".nan", "finite number"),
        ("-0.1", "finite number"),
        ("true", "finite number"),
        ("'0.1'", "finite number"),
        ("1.5", "below 1"),
    ],
)
def test_a_margin_must_be_finite_and_in_range(tmp_path, margin, message):
    bad = tmp_path / "c.yaml"
    bad.write_text(
        "claims:\n  - {id: x, source: s, wording: w, method: m, reference: ar, statistic: perplexity, "
        f"direction: equivalent, margin: {margin}}}\n"
    )
    with pytest.raises(ValueError, match=message):
        load_claims(bad)


def test_hsd_and_traversal_claims_say_no_data_until_their_cells_exist():
    claims = [c for c in load_claims() if c.id.startswith(("hsd_", "traversal_"))]
    assert {c.method for c in claims} == {"hsd", "hsd_ref", "hsd_eagle3", "traversal"}
    runs, samples = synthetic({"ar": 0.0, "spd": 0.0, "block": 0.0}, n_prompts=6)
    table = evaluate_claims(claims, runs, samples)
    assert (table["status"] == "no data").all() and table["note"].str.contains("no data").all()
    assert table["note"].str.contains("python -m pipeline.sweep").all()  # the command that decides each
    effects = {
        "ar": 0.0,
        "spd": 0.0,
        "block": 0.0,
        "hsd": 0.0,
        "hsd_ref": 0.0,
        "specinfer": 0.0,
        "traversal": 0.0,
        "spd_eagle3": 0.0,
        "hsd_eagle3": 0.0,
    }
    runs, samples = synthetic(effects, n_prompts=6)
    table = evaluate_claims(claims, runs, samples).set_index("claim")
    assert (table["status"] == "tested").all()
    assert (
        table.at["hsd_lossless_ppl_equals_ar", "reference"] == "ar"
        and table.at["traversal_tokens_per_step_vs_specinfer", "n"] == 6
    )


# ----------------------------------------------------------------------------------- specdec_bench's profile


def _declared(method: str) -> dict:
    """What the cell passes for a method: its declared verification word and draft shape."""
    cls = METHODS.get(method)
    return {"verification_method": cls.verification_method, "prefix_drafts": cls.prefix_drafts}


def test_speculation_profile_matches_specdec_bench_on_its_own_example():
    # specdec_bench tests/test_speculation_profile.py: 100 steps, 40 emitted 1 token, 30 emitted 2, 30 emitted 3
    records = [{"accepted": [1] * 40 + [2] * 30 + [3] * 30, "draft_steps": 300, "drafted": [3] * 100}]
    profile = speculation_profile(records, method="spd", num_speculative_tokens=3, **_declared("spd"))
    assert set(profile) == PROFILE_KEYS
    assert profile["marginal_accept_rates"] == pytest.approx([0.6, 0.3, 0.0])
    assert profile["conditional_accept_rates"] == pytest.approx([0.6, 0.5, 0.0])
    assert profile["mean_accept_length"] == pytest.approx(1.9) and profile[
        "mean_accept_length_per_request"
    ] == pytest.approx(1.9)
    assert (
        profile["validation"]["mean_consistency"]["passed"] and profile["validation"]["marginal_monotonicity"]["passed"]
    )
    assert (
        profile["schema_version"] == "1.0"
        and profile["measured"] is True
        and profile["verification_method"] == "longest_prefix"
    )
    assert profile["accept_length_model"] == "chain_analytic" and profile["acceptance_length_histogram"] == {
        "1": 40,
        "2": 30,
        "3": 30,
    }
    assert json.loads(json.dumps(profile)) == profile  # plain JSON
    # model paths published as specdec_bench does: org/model, no local directory layout
    assert checkpoint_id("/lustre/fsw/x/hf-local/nvidia/MiniMax-M2.7-DFlash") == "nvidia/MiniMax-M2.7-DFlash"
    assert (
        checkpoint_id("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
        and checkpoint_id(None) is None
    )


def test_speculation_profile_per_step_and_per_request_means_and_method_words():
    # a short request of long steps and a long one of short steps: the two means differ, the vectors describe steps
    records = [
        {"accepted": [3, 3], "draft_steps": 4},
        {"accepted": [1] * 8, "draft_steps": 16},
        {"accepted": [1, 1], "draft_steps": 0},
    ]
    profile = speculation_profile(records, method="block", num_speculative_tokens=2, **_declared("block"))
    assert profile["mean_accept_length"] == pytest.approx(14 / 10) and profile[
        "mean_accept_length_per_request"
    ] == pytest.approx(2.0)
    assert profile["marginal_accept_rates"] == pytest.approx([0.2, 0.2]) and profile[
        "conditional_accept_rates"
    ] == pytest.approx([0.2, 1.0])
    assert profile["verification_method"] == "block" and profile["validation"]["mean_consistency"]["passed"]
    # a length that never occurred between two that did keeps its true rate; K is never below the longest step
    sparse = speculation_profile(
        [{"accepted": [1, 3, 3, 5], "draft_steps": 8}],
        method="traversal",
        num_speculative_tokens=2,
        **_declared("traversal"),
    )
    assert sparse["num_speculative_tokens"] == 4 and sparse["marginal_accept_rates"] == pytest.approx(
        [0.75, 0.75, 0.25, 0.25]
    )
    assert sparse["verification_method"] == "tree_traversal" and sparse["accept_length_model"] == "measured_per_k"
    assert (
        speculation_profile([{"accepted": [1] * 5, "draft_steps": 0}], method="ar") is None
    )  # nothing drafted: no profile
