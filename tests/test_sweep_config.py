"""Configuration errors stop the sweep before Ray starts, with a message naming the fix."""

from __future__ import annotations

import pytest
import ray

from helpers.project import make_project, overrides
from pipeline import sweep
from pipeline.decoding import METHODS
from pipeline.sweep import SweepConfigError, summary_tables


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("cfgproj"))


def _run(root, *extra):
    return sweep.run(sweep.compose(overrides(root, *extra), root / "conf"), root=root)


def test_unknown_method_lists_the_valid_choices(root):
    with pytest.raises(SweepConfigError) as err:  # before any model or Ray, with the fix (issue 25)
        _run(root, "method=nope")
    assert (
        "unknown method 'nope'" in str(err.value)
        and "'spd'" in str(err.value)
        and "add conf/method/nope.yaml" in str(err.value)
    )


def test_impossible_parameter_fails_before_ray(root):
    with pytest.raises(SweepConfigError, match=r"tau=2 must be a number in \[0.0, 1.0\]"):
        _run(root, "method=mtad", "method.tau=2")
    assert not ray.is_initialized()


def test_unknown_names_inside_a_sweep_list(root):
    with pytest.raises(SweepConfigError) as err:
        _run(root, "sweep.methods=[spd,nope]", "sweep.pairs=[tiny,nopair]", "sweep.datasets=[nods]")
    text = str(err.value)
    assert "unknown method 'nope'" in text and "valid methods: [" in text
    assert "unknown pair 'nopair'" in text and "unknown dataset 'nods'" in text


def test_missing_data_path_names_the_fix(root):
    with pytest.raises(SweepConfigError, match="data_root="):
        _run(root, "sweep.datasets=[mt_bench]", "data_root=/nonexistent")


def test_grid_adds_baselines_and_keys_are_stable(root):
    cfg = sweep.compose(overrides(root, "seeds=[0,1]"), root / "conf")
    a, b = sweep.expand(cfg, root), sweep.expand(cfg, root)
    assert [c.key for c in a.cells] == [c.key for c in b.cells]
    assert len(a.cells) == 3 * 2 * 2 and sum(c.baseline for c in a.cells) == 4
    changed = sweep.expand(
        sweep.compose(overrides(root, "seeds=[0,1]", "+sweep.method_overrides.top_k=5"), root / "conf"), root
    )
    assert not {c.key for c in changed.cells} & {c.key for c in a.cells}
    single = sweep.expand(sweep.compose(overrides(root, "method=mtad", "method.tau=0.3"), root / "conf"), root)
    assert sorted({c.label for c in single.cells}) == ["ar", "mtad(tau=0.3)"]


def test_summary_tables_speedup_against_the_same_seed_baseline():
    rows = []
    for seed, (ar, spd) in enumerate([(10.0, 20.0), (10.0, 30.0)]):
        for label, tps in (("ar", ar), ("spd", spd)):
            rows.append(
                {
                    "label": label,
                    "pair": "p",
                    "dataset": "d",
                    "seed": str(seed),
                    "cell_status": "finished",
                    "tokens_per_s": tps,
                    "cell_key": f"{label}{seed}",
                    "score": 0.5,
                    "accepted_per_step": 1.0,
                }
            )
    rows.append({"label": "spd", "pair": "p", "dataset": "d", "seed": "2", "cell_status": "failed", "cell_key": "x"})
    per_cell, means = summary_tables(rows, "ar")
    assert "failed" in per_cell
    spd_line = next(line for line in means.splitlines() if " spd " in f" {line} ")
    assert "2.50 ± 0.71" in spd_line and "25.00 ± 7.07" in spd_line


def test_summary_tables_keep_a_disturbed_cells_timing_out_of_the_means():
    """A cell measured beside a CPU-heavy job (its probes 45x the calibrated step, as a sweep beside two busy loops
    measured on 2026-11-26) is shown with its slowdown; its timing leaves the means, its score stays."""
    rows = [
        {
            "label": m,
            "pair": "p",
            "dataset": "d",
            "seed": str(seed),
            "cell_status": "finished",
            "cell_key": f"{m}{seed}",
        }
        | {"tokens_per_s": tps, "score": score, "step_slowdown": slow, "disturbed": float(slow >= 1.5)}
        for m, seed, tps, score, slow in [
            ("ar", 0, 10.0, 0.5, 1.0),
            ("spd", 0, 20.0, 0.5, 1.1),
            ("ar", 1, 10.0, 0.5, 1.0),
            ("spd", 1, 1.3, 1.0, 45.0),
        ]
    ]
    per_cell, means = summary_tables(rows, "ar")
    assert "45.0x disturbed" in per_cell and "1.1x" in per_cell
    spd_line = next(line for line in means.splitlines() if " spd " in f" {line} ")
    assert "20.00" in spd_line and "2.00 (1/2 seeds timed with a baseline)" in spd_line
    assert "0.75 ± 0.35" in spd_line  # both seeds' scores
    assert "timing of 1 disturbed cell(s) left out" in means


@pytest.mark.parametrize(
    "name",
    ["smoke", "all_methods", "block_vs_token", "mtad_table5", "ablation_tau", "ablation_beams", "claims", "serving"],
)
def test_every_shipped_sweep_expands(name):
    """The sweeps in conf/sweep/ name existing methods and datasets with valid parameters (the real
    pairs cannot load offline: the paper sweeps are checked on the offline pair)."""

    offline = [] if name in ("smoke", "all_methods", "claims") else ["sweep.pairs=[smollm2-offline]"]
    plan = sweep.expand(sweep.compose([f"sweep={name}", "progress=false", *offline]))
    assert plan.cells and len({c.key for c in plan.cells}) == len(plan.cells)
    if name == "all_methods":
        assert {c.method for c in plan.cells} == set(METHODS)
    if name == "serving":  # 5 methods x 4 rates x 3 seeds, every cell under the workload at its rate
        assert len(plan.cells) == 60 and {c.workload["rate"] for c in plan.cells} == {0.5, 1.0, 2.0, 4.0}
    by_key = {c.key: c for c in plan.cells}
    for cell in plan.cells:  # each cell's baseline: ar of its own pair, dataset, seed, batch size and rate
        base = by_key[plan.baselines[cell.key]]
        assert base.baseline and base.method == "ar"
        assert (base.pair, base.dataset, base.seed, base.batch_size, base.workload) == (
            cell.pair,
            cell.dataset,
            cell.seed,
            cell.batch_size,
            cell.workload,
        )


def test_summary_tables_pair_each_cell_with_the_baseline_at_its_own_rate():
    """The closing table of a rate sweep: spd at 4/s over ar at 4/s, not over ar at the first rate (0.5/s)."""
    rows, baselines = [], {}
    for rate, ar, spd in ((0.5, 10.0, 12.0), (4.0, 40.0, 36.0)):
        for label, tps in (("ar", ar), ("spd", spd)):
            key = f"{label}{rate}"
            rows.append(
                {
                    "label": f"{label} @ {rate:g}/s",
                    "pair": "p",
                    "dataset": "d",
                    "seed": "0",
                    "cell_status": "finished",
                    "tokens_per_s": tps,
                    "tokens_per_target_step": tps / 10,
                    "cell_key": key,
                }
            )
            baselines[key] = f"ar{rate}"
    _, means = summary_tables(rows, baselines)
    assert "1.20" in next(line for line in means.splitlines() if "spd @ 0.5/s" in line)
    assert "0.90" in next(line for line in means.splitlines() if "spd @ 4/s" in line)
    _, by_label = summary_tables(rows, "ar @ 0.5/s")  # one label: every cell over ar at 0.5/s, as before
    assert "3.60" in next(line for line in by_label.splitlines() if "spd @ 4/s" in line)


def test_two_slices_of_one_dataset_are_counted_apart():
    """Plan.sample_counts is keyed by slice: two slices of HumanEval no longer overwrite each other's count."""
    cfg = sweep.compose(
        [
            "sweep=smoke",
            "data_root=data",
            "seeds=[0]",
            "sweep.methods=[ar]",
            "sweep.datasets=[{dataset: humaneval, limit: 2}, {dataset: humaneval, start: 2, limit: 3}]",
        ]
    )
    plan = sweep.expand(cfg)
    assert plan.sample_counts == {"humaneval[0:2]": 2, "humaneval[2:5]": 3}
    assert sorted(c.dataset["limit"] for c in plan.cells) == [2, 3]


@pytest.mark.parametrize(
    "methods,needle",
    [  # issue 57: spd ran with block's parameters; two spd entries collapsed to one; spd labelled ar was dropped
        ("[{method: spd, label: x}, {method: block, label: x}]", "sweep entries 'spd' and 'block' share the label 'x'"),
        ("[{method: spd, gamma: 2, label: x}, {method: spd, gamma: 3, label: x}]", "share the label 'x'"),
        (
            "[{method: spd, label: ar}]",
            "has the label 'ar' of the baseline (sweep.baseline) with another configuration",
        ),
        ("[{method: spd, label: 'ar (batch 2)'}]", "ends in ' (batch N)', the suffix the cells of a batch size get"),
        ("[{method: spd, label: a}, {method: spd, label: b}]", "sweep entries 'a' and 'b' are the same configuration"),
    ],
)
def test_labels_are_unique_and_not_the_baselines_before_ray(root, methods, needle):
    with pytest.raises(SweepConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        _run(root, f"sweep.methods={methods}")
    assert not ray.is_initialized()


def test_the_baselines_own_configuration_may_carry_its_label(root):
    """``methods: [ar, spd]`` with ``baseline: ar`` (the shipped sweeps): the entry is the baseline, one cell each."""
    plan = sweep.expand(sweep.compose(overrides(root, "sweep.methods=[ar,spd]", "seeds=[0]"), root / "conf"), root)
    assert sorted(c.label for c in plan.cells) == ["ar", "ar", "spd", "spd"]


def test_an_entrys_own_batch_sizes_are_named_as_its_own(root):
    """An entry's oversized batch_sizes was reported as sweep.batch_sizes (issue 57)."""
    with pytest.raises(SweepConfigError) as err:
        _run(root, "sweep.methods=[{method: spd, label: big, batch_sizes: [1, 4]}]")
    assert "sweep entry 'big': batch_sizes has 4 but dataset" in str(err.value)
    assert "sweep.batch_sizes has" not in str(err.value)
