"""A sweep's failed cells on Ray with tiny models: a killed actor and a raising cell are recorded, the report
covers the finished ones, and the same command runs exactly the failed cells again.

Its own module (and so its own local Ray session, ``ray_session``) beside tests/test_sweep.py: the two longest sweep
tests run on two xdist workers at once instead of one after the other.
"""

from __future__ import annotations

import csv

from mlflow import MlflowClient

from analysis import report
from helpers.project import make_project, run_sweep


def test_killed_actor_and_raising_cell_are_retried_exactly_after_a_report_of_the_finished_cells(ray_session, tmp_path):
    """Failed cells (a killed actor, a raising cell) run again, exactly those; in between, the report (what `make
    run` writes after a sweep with failed cells, issue 36 item 10: once none was written) covers the finished ones.
    One sweep serves both checks (each sweep starts an actor per cell: ~8 s each here)."""
    root = make_project(tmp_path)
    # both block cells fail (as the method a sweep lost entirely: the report still covers the others)
    faults = "+fault_injection=[{kind: exit, labels: [block], seeds: [0]},{kind: raise, labels: [block], seeds: [1]}]"
    first = run_sweep(root, "sweep.datasets=[{dataset: humaneval, limit: 1, max_new_tokens: 6}]", "seeds=[0,1]", faults)
    assert first["total"] == 6 and first["finished"] == 4 and first["failed"] == 2
    failed = {r["cell_key"]: r for r in first["results"] if r["status"] == "failed"}
    errors = [r["error"] for r in failed.values()]
    assert any("actor died" in e for e in errors) and any("injected fault" in e for e in errors), errors

    report_args = ["--latest", "--tracking-uri", first["tracking_uri"], "--out", str(tmp_path / "report")]
    assert report.main([*report_args, "--no-notebooks", "--no-mlflow", "--bootstrap", "50"]) == 0
    with (tmp_path / "report" / "runs.csv").open() as f:
        reported = sorted((row["label"], int(row["seed"])) for row in csv.DictReader(f))
    assert reported == [("ar", 0), ("ar", 1), ("spd", 0), ("spd", 1)]  # the 4 finished
    assert "spd" in (tmp_path / "report" / "table5.md").read_text()

    second = run_sweep(root, "sweep.datasets=[{dataset: humaneval, limit: 1, max_new_tokens: 6}]", "seeds=[0,1]")
    assert second["ran"] == 2 and second["finished"] == 2
    assert {r["cell_key"] for r in second["results"]} == set(failed)  # exactly the failed cells

    client = MlflowClient(second["tracking_uri"])
    exp = client.get_experiment_by_name("tiny")
    active = client.search_runs([exp.experiment_id], "tags.kind = 'cell'")
    keys = [r.data.tags["cell_key"] for r in active]
    assert len(keys) == 6 and len(set(keys)) == 6  # nothing duplicated
    assert all(r.data.tags["cell_status"] == "finished" for r in active)
