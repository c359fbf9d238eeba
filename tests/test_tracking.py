"""MLflow layout: cell keys, flattening, runs per cell, resume queries, superseding failed runs."""

from __future__ import annotations

import math
import os
import time

import pytest

from analysis import schema
from analysis.runs import load_runs
from helpers.cells import make_cell
from pipeline.cell_types import STATUS_FAILED, STATUS_FINISHED, CellResult, cell_key
from pipeline.sweep.summary import summary_tables
from pipeline.tracking import (
    Tracker,
    TrackingError,
    check_tracking_uri,
    flatten,
    layout,
    numeric_metrics,
    resolve_tracking_uri,
)


def test_cell_key_is_stable_and_sensitive():
    a = {"method": {"name": "spd", "params": {"gamma": 4, "top_k": 10}}, "seed": 0}
    b = {"seed": 0, "method": {"params": {"top_k": 10, "gamma": 4}, "name": "spd"}}  # same content, other order
    assert cell_key(a) == cell_key(b) and len(cell_key(a)) == 12
    assert cell_key(a) != cell_key({**a, "seed": 1})
    assert cell_key(a) != cell_key({**a, "method": {"name": "spd", "params": {"gamma": 5, "top_k": 10}}})


def test_flatten_and_metrics():
    flat = flatten({"method": {"name": "mtad", "tau": 0.5}, "ids": [1, 2], "opt": {}})
    assert flat == {"method.name": "mtad", "method.tau": 0.5, "ids": "[1, 2]", "opt": "{}"}
    assert numeric_metrics({"a": 1, "b": float("nan"), "c": None, "d": "x", "e": True}) == {"a": 1.0, "e": 1.0}


def test_relative_sqlite_uri_is_anchored(tmp_path):
    assert resolve_tracking_uri("sqlite:///mlflow.db", tmp_path) == f"sqlite:///{tmp_path}/mlflow.db"
    assert resolve_tracking_uri("sqlite:////abs/x.db", tmp_path) == "sqlite:////abs/x.db"
    assert resolve_tracking_uri("http://host:5000", tmp_path) == "http://host:5000"


def _cell(key: str, seed: int = 0):
    return make_cell(key, seed=seed)


def _ok(key: str, **metrics) -> CellResult:
    return CellResult(
        key,
        status=STATUS_FINISHED,
        metrics=metrics or {"tokens_per_s": 10.0, "bad": float("nan")},
        records=[{"id": "a", "text": "x"}],
        scores={"score": 1.0},
    )


def _failed(key: str) -> CellResult:
    return CellResult(key, status=STATUS_FAILED, error="boom", traceback="Traceback...")


def test_runs_resume_and_supersede(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tr = Tracker(uri, "t", str(tmp_path / "mlruns"))
    tr.start_parent("t run", {"sweep": "t"}, {"n": 2})
    tr.log_cell(_cell("k1"), _ok("k1"))
    failed_id = tr.log_cell(_cell("k2"), _failed("k2"))
    tr.end_parent("FINISHED", {"cells_ran": 2})
    assert set(tr.finished_keys()) == {"k1"} and set(tr.failed_runs()) == {"k2"}

    tr2 = Tracker(uri, "t", str(tmp_path / "mlruns"))  # the next invocation
    tr2.start_parent("t run 2", {}, {})
    new_id = tr2.log_cell(_cell("k2"), _ok("k2"))
    assert set(tr2.finished_keys()) == {"k1", "k2"} and tr2.failed_runs() == {}
    old = tr2.client.get_run(failed_id)
    assert old.info.lifecycle_stage == "deleted" and old.data.tags["superseded_by"] == new_id
    rows = tr2.rows()
    assert sorted(r["cell_key"] for r in rows) == ["k1", "k2"]  # one active run per key
    run = tr2.client.get_run(new_id)
    assert run.data.params["method.gamma"] == "4" and run.data.metrics["tokens_per_s"] == 10.0
    assert "bad" not in run.data.metrics and run.data.tags["mlflow.parentRunId"] == tr2.parent_run_id
    files = {f.path for f in tr2.client.list_artifacts(new_id)}
    assert {"samples.jsonl", "cell_config.yaml", "result.json", "scores.json"} <= files
    assert "traceback.txt" in {f.path for f in tr2.client.list_artifacts(failed_id)}
    assert not math.isnan(rows[0]["tokens_per_s"])


def test_duplicate_finished_runs_are_reported_and_counted_once(tmp_path):
    """A store written by two drivers before leases: two finished runs of one key (the `ar` 0.93 ± 0.10 bug)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tr = Tracker(uri, "t", str(tmp_path / "mlruns"))
    cell = make_cell("k1", method="ar")
    old = tr.log_cell(cell, CellResult("k1", status=STATUS_FINISHED, metrics={"tokens_per_s": 10.0}))
    new = tr.log_cell(cell, CellResult("k1", status=STATUS_FINISHED, metrics={"tokens_per_s": 12.0}))
    assert len(tr.cell_runs()) == 2  # both still active: nothing hides the duplicate from the queries
    warned = []
    rows = tr.rows(warn=warned.append)
    assert [r["run_id"] for r in rows] == [new] and "more than one active run" in warned[0]
    assert tr.finished_keys() == {"k1": new}
    _, mean_text = summary_tables(rows, "ar")
    assert "10.00" not in mean_text and "12.00" in mean_text
    with pytest.warns(UserWarning, match="more than one active run"):
        df = load_runs("t", uri)
    assert df["run_id"].tolist() == [new] and df["tokens_per_s"].tolist() == [12.0] and old not in df["run_id"].tolist()


def test_unusable_tracking_uris_fail_fast_with_the_fix(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(TrackingError, match="not reachable.*mlflow server"):
        check_tracking_uri("http://127.0.0.1:9/", timeout_s=2)  # the discard port: connection refused
    with pytest.raises(TrackingError, match="unknown scheme"):
        check_tracking_uri("sqlit:///x.db")
    (tmp_path / "ro").mkdir(mode=0o500)
    if not os.access(tmp_path / "ro", os.W_OK):  # root may write anyway
        with pytest.raises(TrackingError, match="not writable"):
            check_tracking_uri(f"sqlite:///{tmp_path}/ro/sub/mlflow.db")
    with pytest.raises(TrackingError, match="is a folder"):
        check_tracking_uri(f"sqlite:///{tmp_path}")
    assert time.monotonic() - t0 < 30
    check_tracking_uri(f"sqlite:///{tmp_path}/new/mlflow.db")  # a store to create: fine


def test_a_cell_run_carries_every_name_the_analysis_reads(tmp_path):
    """The names in pipeline.tracking (which analysis/schema.py imports) are what log_cell writes."""
    tr = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "t", str(tmp_path / "mlruns"))
    tr.start_parent("t", {}, {})
    ok = CellResult(
        "k1", status=layout.STATUS_FINISHED, metrics={"tokens_per_s": 1.0}, records=[{"id": "a"}], scores={"score": 1.0}
    )
    run = tr.client.get_run(tr.log_cell(_cell("k1"), ok))
    failed = tr.client.get_run(tr.log_cell(_cell("k2"), _failed("k2")))
    assert run.data.tags[layout.TAG_KIND] == layout.KIND_CELL
    assert run.data.tags[layout.TAG_STATUS] == layout.STATUS_FINISHED
    assert set(layout.CELL_TAGS) <= set(run.data.tags)
    assert layout.TAG_ERROR in failed.data.tags
    assert set(schema.TAGS.values()) <= set(layout.CELL_TAGS) | {layout.TAG_ERROR}
    files = {f.path for f in tr.client.list_artifacts(run.info.run_id)}
    assert {layout.SAMPLES_ARTIFACT, layout.RESULT_ARTIFACT, layout.SCORES_ARTIFACT, layout.CONFIG_ARTIFACT} <= files
    assert layout.TRACEBACK_ARTIFACT in {f.path for f in tr.client.list_artifacts(failed.info.run_id)}
    parent = tr.client.get_run(tr.parent_run_id)
    assert parent.data.tags[layout.TAG_KIND] == layout.KIND_SWEEP


def test_a_cell_run_whose_write_fails_is_marked_failed_by_the_tracker(tmp_path, monkeypatch):
    """log_cell itself closes a half-written run as failed (no run id handed to the driver to do it) and re-raises."""
    tr = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "t", str(tmp_path / "mlruns"))
    real = tr.client.log_text

    def fails(run_id, text, artifact_file):
        if artifact_file == layout.RESULT_ARTIFACT:
            raise OSError("artifact store went away (test)")
        return real(run_id, text, artifact_file)

    monkeypatch.setattr(tr.client, "log_text", fails)
    with pytest.raises(OSError, match="went away"):
        tr.log_cell(_cell("k1"), _ok("k1"))
    (run,) = tr.cell_runs()
    assert run.data.tags[layout.TAG_STATUS] == layout.STATUS_FAILED and run.info.status == "FAILED"
    assert run.data.tags[layout.TAG_ERROR].startswith("logging failed: OSError")
    assert tr.finished_keys() == {}


def test_a_cell_run_spans_the_cells_own_time(tmp_path):
    """Created and Duration in MLflow's table are the cell's start and run time, not when the driver logged it."""
    tr = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "t", str(tmp_path / "mlruns"))
    tr.start_parent("t", {}, {})
    start, end = 1_700_000_000.25, 1_700_000_321.5
    ok = CellResult("k1", status=layout.STATUS_FINISHED, metrics={"tokens_per_s": 1.0}, started_at=start, ended_at=end)
    run = tr.client.get_run(tr.log_cell(_cell("k1"), ok))
    assert (run.info.start_time, run.info.end_time) == (1_700_000_000_250, 1_700_000_321_500)
    failed = _failed("k2")  # a result without times (an old actor's) is logged at the time of writing, as before
    assert failed.started_at is None
    run = tr.client.get_run(tr.log_cell(_cell("k2"), failed))
    assert run.info.end_time >= run.info.start_time > 1_700_000_321_500


def test_a_damaged_or_foreign_sqlite_file_is_refused_before_mlflow_touches_it(tmp_path):
    """Issue 57: a corrupt store gave a raw traceback, and a sqlite file of another program was silently made into
    an MLflow store (MLflow added its tables to it)."""
    import sqlite3  # noqa: PLC0415

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all " * 200)
    with pytest.raises(TrackingError, match=r"is not a readable sqlite database .*move it aside"):
        check_tracking_uri(f"sqlite:///{garbage}")
    foreign = tmp_path / "app.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    before = foreign.read_bytes()
    with pytest.raises(TrackingError, match=r"a sqlite database of another program \(tables: users\)"):
        Tracker(f"sqlite:///{foreign}", "t", str(tmp_path / "mlruns"))
    assert foreign.read_bytes() == before  # untouched
    store = tmp_path / "mlflow.db"
    Tracker(f"sqlite:///{store}", "t", str(tmp_path / "mlruns")).close()  # a new store, then an existing one
    check_tracking_uri(f"sqlite:///{store}")
    (tmp_path / "empty.db").write_bytes(b"")  # an empty file: MLflow creates its tables
    check_tracking_uri(f"sqlite:///{tmp_path}/empty.db")
    data = store.read_bytes()
    page = int.from_bytes(data[16:18], "big")
    (tmp_path / "damaged.db").write_bytes(data[: page * 2] + b"\xff" * (len(data) - page * 2))  # pages overwritten
    with pytest.raises(TrackingError, match=r"damaged\.db (is damaged|is not a readable)"):
        check_tracking_uri(f"sqlite:///{tmp_path}/damaged.db")


def test_a_cell_run_whose_driver_died_between_its_outcome_and_its_end_is_ended(tmp_path):
    """Issue 57: a driver killed after a cell run's final tag but before ``set_terminated`` left it RUNNING for
    ever (close_stale closed only runs still ``logging``); the next driver ends it as its outcome says."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tr = Tracker(uri, "t", str(tmp_path / "mlruns"))
    ids = {}
    for key, outcome in (("k1", layout.STATUS_FINISHED), ("k2", layout.STATUS_FAILED)):
        tags = {layout.TAG_KIND: layout.KIND_CELL, layout.TAG_CELL_KEY: key, layout.TAG_STATUS: outcome}
        ids[key] = tr.client.create_run(tr.experiment_id, tags=tags).info.run_id
    tr.close()
    other = Tracker(uri, "t", str(tmp_path / "mlruns"))
    assert sorted(other.close_stale()) == sorted(ids.values())
    assert other.client.get_run(ids["k1"]).info.status == "FINISHED"
    assert other.client.get_run(ids["k2"]).info.status == "FAILED"
    assert other.finished_keys() == {"k1": ids["k1"]}
    assert other.close_stale() == []
