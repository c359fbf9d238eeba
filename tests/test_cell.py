"""One cell in-process on tiny models: stages, metrics, records, scoring, failures as records."""

from __future__ import annotations

from dataclasses import replace

import pytest

from helpers.project import make_project, overrides
from pipeline import sweep
from pipeline.cell import run_cell
from pipeline.cell_types import STATUS_FAILED, STATUS_FINISHED
from pipeline.data.slices import load_slice
from pipeline.measure.workload import Workload


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    root = make_project(tmp_path_factory.mktemp("cellproj"))
    return sweep.expand(sweep.compose(overrides(root), root / "conf"), root)


def _cell(plan, label, dataset):
    return next(c for c in plan.cells if c.label == label and c.dataset_name == dataset)


def test_cell_runs_every_stage(plan):
    cell = _cell(plan, "spd", "humaneval")
    result = run_cell(cell)
    assert result.status == STATUS_FINISHED, result.traceback
    assert set(result.stages) == {"load", "generate", "perplexity", "score"}  # costs: the loop's clock, no stage
    assert result.cell_key == cell.key and result.stage == "done" and result.isolation["torch_threads"] >= 1
    m = result.metrics
    # step costs for Leviathan's bound, read off the loop's own clock over the window (and the warm-up's schedule)
    assert m["t_target_step_ms"] > 0 and m["t_draft_step_ms"] > 0 and m["t_verify_ms"] > 0
    assert m["cost_ratio_c"] == pytest.approx(m["t_draft_step_ms"] / m["t_target_step_ms"], rel=1e-12)
    assert m["row_cost_v"] == pytest.approx(m["row_slope_ms"] / m["t_target_step_ms"], rel=1e-12)  # batch 1
    phases = [m[f"time_{p}_s"] for p in ("draft", "verify", "rule", "other")]
    assert all(t >= 0 for t in phases) and sum(phases) == pytest.approx(m["decode_s"], rel=0.03)
    assert m["tokens_per_target_step"] == pytest.approx(m["tokens_per_s"] * m["t_target_step_ms"] / 1e3)
    assert m["step_drift"] >= 1.0 and m["disturbed"] in (0.0, 1.0)
    assert m["generations"] == 2 and m["new_tokens"] > 0 and m["tokens_per_s"] > 0
    assert m["perplexity"] > 1 and 0.0 <= m["score"] <= 1.0 and result.score_metric == "pass@1"
    assert m["draft_steps"] > 0  # speculative method: the draft ran
    assert len(result.records) == 2 and all("prediction" in r and "perplexity" in r for r in result.records)
    assert result.warmup["generations"] == 1 and result.warmup["on_measured_samples"] is False
    assert result.scores["metric"] == "pass@1" and result.judge_identity is None
    # wall-clock bounds of the cell (its MLflow run's start and end), enclosing its measured wall time
    assert result.ended_at - result.started_at >= m["cell_wall_s"] - 0.01 > 0
    # the machine's speed just before and after the window (the driver compares it with the sweep's calibration)
    assert m["probe_before_ms"] > 0 and m["probe_after_ms"] > 0
    # the acceptance as specdec_bench's speculation_profile.json: consistent with the records it came from
    profile = result.speculation_profile
    steps = [e for r in result.records for e in r["accepted"]]
    assert (
        profile["verification_method"] == "longest_prefix" and profile["num_speculative_tokens"] >= cell.params["gamma"]
    )
    assert profile["mean_accept_length"] == pytest.approx(sum(steps) / len(steps), abs=1e-6)
    its = profile["iterations"]  # the loop's clock, iteration by iteration: the tokens it emitted are the records'
    assert sum(it["emitted"] for it in its) == m["new_tokens"] and profile["calibration_iterations"]
    assert sum(it["draft_s"] + it["verify_s"] + it["rule_s"] + it["other_s"] for it in its) == pytest.approx(
        sum(m[f"time_{p}_s"] for p in ("draft", "verify", "rule", "other"))
    )
    assert (
        profile["validation"]["mean_consistency"]["passed"]
        and profile["measurement_conditions"]["dataset"] == "humaneval"
    )


def test_mt_bench_without_judge_is_speed_only(plan):
    result = run_cell(_cell(plan, "ar", "mt_bench"))
    assert result.status == STATUS_FINISHED, result.traceback
    assert result.score_metric == "speed_only" and "score" not in result.metrics
    # no draft, no cost ratio; the target's own step is still read (the loop's clock: all of ar's time is verify)
    assert "costs" not in result.stages and result.metrics["t_target_step_ms"] > 0
    assert not {"t_draft_step_ms", "t_verify_ms", "cost_ratio_c", "row_cost_v"} & set(result.metrics)
    assert result.metrics["time_draft_s"] == 0 and result.metrics["time_verify_s"] > 0
    assert result.metrics["generations"] == 4  # 2 samples x 2 turns
    assert result.metrics["probe_before_ms"] > 0 and result.speculation_profile is None  # ar drafts nothing


def test_a_raising_cell_comes_back_failed_with_traceback(plan):
    cell = replace(_cell(plan, "block", "humaneval"), fault={"kind": "raise"})
    result = run_cell(cell)
    assert result.status == STATUS_FAILED and result.stage == "generate"
    assert "injected fault" in result.error and "Traceback" in result.traceback
    assert result.metrics["cell_wall_s"] > 0 and result.records == [] and result.scores is None
    assert result.ended_at >= result.started_at > 0  # a failed cell's run spans its own time too


def test_warmup_samples_are_outside_the_slice(plan):
    measured, warm, everything = load_slice(_cell(plan, "ar", "humaneval").dataset, warmup_samples=3)
    assert [s.id for s in measured] == ["HumanEval/0", "HumanEval/1"]
    assert len(warm) == 3 and not {s.id for s in warm} & {s.id for s in measured}


def test_an_auto_cost_cell_reads_its_costs_off_the_loops_clock(plan):
    """draft_cost / verify_cost: auto (conf/sweep/smoke.yaml): no stage of its own; the warm-up drafts the
    calibration schedule, the rule reads the loop's live c and v, and the cell logs the window's."""
    base = _cell(plan, "spd", "humaneval")
    params = {**base.params, "draft_stop": "acceptance", "draft_cost": "auto", "verify_cost": "auto", "draft_min": 0}
    result = run_cell(replace(base, params=params))
    assert result.status == STATUS_FINISHED, result.traceback
    assert list(result.stages)[:2] == ["load", "generate"] and "calibrate" not in result.stages
    m = result.metrics
    assert m["cost_ratio_c"] > 0 and m["t_target_step_ms"] > 0 and "row_cost_v" in m and m["new_tokens"] > 0


def test_a_workload_cell_replays_its_arrivals_and_logs_the_serving_metrics(plan):
    """A cell planned with a workload (sweep.rates) hands it to its window: records with their arrival, the serving
    metrics beside the others; the load-aware draft length reads the loop's live costs like the acceptance rule."""
    base = _cell(plan, "spd", "humaneval")
    workload = Workload.from_config({"kind": "poisson", "rate": 20.0, "max_concurrency": 1}, {"tpot_ms": 1e6})
    params = {**base.params, "draft_stop": "load", "draft_cost": "auto", "verify_cost": "auto", "draft_min": 0}
    result = run_cell(replace(base, workload=workload.identity(), params=params))
    assert result.status == STATUS_FINISHED, result.traceback
    assert list(result.stages)[:2] == ["load", "generate"]
    m = result.metrics
    assert m["rate"] == 20.0 and m["ttft_s_p50"] <= m["ttft_s_p99"] and m["goodput_rps"] > 0
    assert m["e2e_s_p50"] >= m["ttft_s_p50"] and 0 < m["mean_batch_occupancy"] <= 1 + 1e-9
    assert all(r["arrival_s"] is not None for r in result.records)
