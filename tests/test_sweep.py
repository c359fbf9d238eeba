"""The sweep end to end on Ray with tiny models: MLflow runs and metrics, resumption, fault injection.

One local Ray session (num_cpus=2) is shared by the tests of this module; each test uses its own
project folder (conf/ copy + MLflow SQLite file) so that their experiments do not mix.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from mlflow import MlflowClient

from helpers.paths import REPO
from helpers.project import make_project, run_sweep


def test_small_sweep_end_to_end_then_nothing_to_do(ray_session, tmp_path, capsys):
    root = make_project(tmp_path)
    out = run_sweep(root)
    # 2 methods + the ar baseline x 2 datasets x 1 seed
    assert out["total"] == 6 and out["ran"] == 6 and out["finished"] == 6, out["results"]
    rows = out["rows"]
    assert sorted(r["label"] for r in rows) == ["ar", "ar", "block", "block", "spd", "spd"]
    for r in rows:
        assert r["cell_status"] == "finished" and r["tokens_per_s"] > 0 and r["new_tokens"] > 0
        assert r["perplexity"] > 0 and r["node_id"]
    assert all(0 <= r["score"] <= 1 for r in rows if r["dataset"] == "humaneval")
    text = capsys.readouterr().out
    assert "cells: 6 total, 0 finished, 6 to run" in text and "mean ± std" in text and "mlflow ui" in text

    client = MlflowClient(out["tracking_uri"])
    exp = client.get_experiment_by_name("tiny")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    cells = [r for r in runs if r.data.tags.get("kind") == "cell"]
    assert len(parents) == 1 and len(cells) == 6
    assert all(c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for c in cells)
    one = cells[0]
    assert {"method.name", "pair.name", "dataset.name", "seed", "dataset.max_new_tokens"} <= set(one.data.params)
    assert {"samples.jsonl", "cell_config.yaml", "result.json"} <= {
        f.path for f in client.list_artifacts(one.info.run_id)
    }
    # each cell judged its own window (the loop's clock quarter by quarter and its probes: step_drift), no sweep-start
    # calibration; the phases of the loop's clock; the drafting cells' acceptance as specdec_bench reads it
    assert not any(k.startswith("calibration.") for k in parents[0].data.metrics)
    for c in cells:
        m = c.data.metrics
        assert m["step_drift"] >= 1.0 and "disturbed" in m and "calibrated_target_step_ms" not in m
        assert m["time_verify_s"] > 0 and m["t_target_step_ms"] > 0 and m["tokens_per_target_step"] > 0
        has_profile = "speculation_profile.json" in {f.path for f in client.list_artifacts(c.info.run_id)}
        assert has_profile == (c.data.tags["method"] != "ar")

    again = run_sweep(root)
    assert again["ran"] == 0 and again["skipped"] == 6
    assert "cells: 6 total, 6 finished, 0 to run" in capsys.readouterr().out
    assert len(client.search_runs([exp.experiment_id], "tags.kind = 'cell'")) == 6


def test_cell_over_its_time_limit_is_killed_and_recorded(ray_session, tmp_path):
    root = make_project(tmp_path)
    out = run_sweep(
        root,
        "sweep.datasets=[{dataset: humaneval, limit: 1, max_new_tokens: 4}]",
        "sweep.methods=[ar]",
        "+fault_injection={kind: sleep, seconds: 600, stage: load}",
        "cluster.cell_timeout_s=8",
    )
    assert out["total"] == 1 and out["failed"] == 1
    assert "timed out" in out["results"][0]["error"]


@pytest.mark.parametrize("sweep_status, report_runs", [(0, True), (1, True), (2, False)])
def test_make_run_reports_what_finished_and_keeps_the_sweeps_status(tmp_path, sweep_status, report_runs):
    """`make run`: the report after a sweep that finished (0) or finished some cells (1: failed cells), not after a
    configuration error (2); make's status is the sweep's. PY is a stand-in that logs its calls (nothing installs:
    -o leaves the venv's stamp alone)."""
    log = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\ncase "$2" in pipeline.sweep) exit {sweep_status};; esac\nexit 0\n')
    fake.chmod(0o755)
    done = subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.installed", "run", f"PY={fake}", "ARGS=seeds=[0]"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MAKEFLAGS": ""},
    )
    assert (done.returncode == 0) is (sweep_status == 0), done.stderr  # make exits 2 when its recipe fails
    calls = log.read_text().splitlines()
    assert calls[0] == "-m pipeline.sweep seeds=[0]"
    assert (calls[1:] == ["-m analysis.report --latest --no-notebooks"]) is report_runs, calls
    if sweep_status == 1:
        assert "some cells did not finish: the report above covers those that did" in done.stderr
