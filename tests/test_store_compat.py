"""A store written before the MLflow layout was split (issue 24) still loads: the driver's resume
queries and ``analysis/`` read it through today's names.

``golden/store_before_layout.tar.gz`` is the analysis fixture sweep (``_fixtures_analysis.build_store``:
24 cell runs, one of them failed, and a parent run) logged by the code of commit a16ed4d into
``sqlite:////tmp/pre_layout_store/mlflow.db`` (artifacts under ``/tmp/pre_layout_store/mlruns``),
then ``VACUUM``-ed and packed. Its artifact locations are absolute, as every store's are: unpacked
elsewhere they are moved with the store (``_move_store``), as a user moving a store would.
"""

from __future__ import annotations

import sqlite3
import tarfile
from pathlib import Path

import _fixtures_analysis as fx
import pytest

from analysis import schema
from analysis.runs import load_runs, load_samples
from pipeline.tracking import Tracker

ARCHIVE = Path(__file__).parent / "golden" / "store_before_layout.tar.gz"
WRITTEN_AT = "/tmp/pre_layout_store"


def _move_store(root: Path) -> str:
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(root, filter="data")
    db = root / "mlflow.db"
    with sqlite3.connect(db) as con:
        for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
            con.execute(f"UPDATE {table} SET {column} = replace({column}, ?, ?)", (WRITTEN_AT, str(root)))
    return f"sqlite:///{db}"


@pytest.fixture(scope="module")
def old_store(tmp_path_factory) -> str:
    return _move_store(tmp_path_factory.mktemp("old_store"))


def test_the_resume_queries_read_the_old_store(old_store):
    tracker = Tracker(old_store, fx.SWEEP)
    try:
        finished = tracker.finished_keys()
        failed = tracker.failed_runs()
        rows = tracker.rows()
    finally:
        tracker.close()
    assert len(finished) == 23 and len(failed) == 1 and len(rows) == 24
    (failed_key,) = failed
    assert failed_key == fx._cell("mtad(tau=0.3)", "mt_bench", 1).key  # the cell keys of the old store are today's
    assert {fx._cell(label, ds, s).key for (ds, label) in fx.TOKENS_PER_S for s in fx.SEEDS} == set(finished) | {
        failed_key
    }


def test_analysis_reads_the_old_store(old_store):
    runs = load_runs(fx.SWEEP, old_store, finished_only=False)
    assert len(runs) == 24
    assert (runs["status"] == schema.STATUS_FINISHED).sum() == 23
    row = runs[(runs["label"] == "spd") & (runs["dataset"] == "humaneval") & (runs["seed"] == 2)].iloc[0]
    assert row["tokens_per_s"] == pytest.approx(25.0) and row["j_per_token"] == pytest.approx(0.9)
    samples = load_samples(runs[runs["status"] == schema.STATUS_FINISHED])
    assert len(samples) == 23 * len(fx.TOKENS)
    humaneval = samples[samples["dataset"] == "humaneval"]
    assert (
        humaneval["sample_score"].notna().all()
        and samples[samples["dataset"] == "mt_bench"]["sample_score"].isna().all()
    )
