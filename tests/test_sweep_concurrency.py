"""Drivers sharing one MLflow store: leases, store creation, drivers that die, duplicates from older stores.

The two-driver test starts two real ``python -m pipeline.sweep`` processes (each with its own local
Ray) on one fresh SQLite store at the same moment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from mlflow import MlflowClient
from mlflow.entities import ViewType

from helpers.paths import REPO
from helpers.project import make_project
from pipeline.tracking import Tracker


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def _driver(root: Path, *extra: str) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "pipeline.sweep",
        f"--config-path={root / 'conf'}",
        "sweep=tiny",
        f"tracking.uri=sqlite:///{root}/mlflow.db",
        f"tracking.artifact_root={root}/mlruns",
        "progress=false",
        "cluster.num_cpus=1",
        "sweep.methods=[spd]",
        "sweep.datasets=[{dataset: humaneval, limit: 1, max_new_tokens: 6}]",
        "seeds=[0,1]",
        *extra,
    ]
    return subprocess.Popen(args, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow  # two sweep processes racing on one store: ~110 s here, opt-in (make test-slow)
def test_two_drivers_on_one_new_store_run_each_cell_once(tmp_path):
    root = make_project(tmp_path)
    drivers = [_driver(root), _driver(root)]  # same moment, fresh store: both create/migrate it
    outputs = [d.communicate(timeout=900)[0] for d in drivers]
    for d, out in zip(drivers, outputs):
        assert d.returncode == 0, out[-4000:]
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    exp = client.get_experiment_by_name("tiny").experiment_id
    every = client.search_runs([exp], "tags.kind = 'cell'", run_view_type=ViewType.ALL)
    keys = [r.data.tags["cell_key"] for r in every]
    assert len(keys) == 4 and len(set(keys)) == 4, keys  # 2 methods (spd + ar) x 2 seeds, each run once
    assert all(r.data.tags["cell_status"] == "finished" for r in every)
    parents = client.search_runs([exp], "tags.kind = 'sweep'")
    ran = [int(p.data.metrics["cells_ran"]) for p in parents]
    assert sorted(p.info.status for p in parents) == ["FINISHED", "FINISHED"] and sum(ran) == 4, ran
    assert all("4 total" in out and "finished" in out for out in outputs)


def test_a_driver_killed_without_warning_leaves_nothing_running(tmp_path):
    """SIGKILL: no handler runs; its parent lock dies with it, and the next driver closes the run as KILLED."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = textwrap.dedent(f"""
        import os, sys, time
        from pipeline.tracking import Tracker
        tr = Tracker({uri!r}, "t", {str(tmp_path / "mlruns")!r})
        tr.start_parent("doomed", {{}}, {{}})
        assert tr.claim("k1")
        print(tr.parent_run_id, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=_env(), stdout=subprocess.PIPE, text=True)
    parent_id = proc.stdout.readline().strip()
    assert parent_id, "the child driver did not start"
    other = Tracker(uri, "t", str(tmp_path / "mlruns"))
    assert not other.claim("k1")  # leased by the live driver
    assert other.close_stale() == []  # alive: not stale
    proc.kill()
    proc.wait(timeout=30)
    assert other.claim("k1")  # the lease ended with its driver
    assert other.close_stale() == [parent_id]
    run = other.client.get_run(parent_id)
    assert run.info.status == "KILLED" and "driver gone" in run.data.tags["closed_as_stale"]
    other.close()


def _cell_actors(driver: psutil.Process) -> list[psutil.Process]:
    """The driver's cell actors now running (Ray's worker processes of ``DriverBoundActor``)."""
    found = []
    for p in driver.children(recursive=True) if driver.is_running() else []:
        try:
            if "DriverBoundActor" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            pass
    return found


def _wait_for_a_cell(proc: subprocess.Popen, driver: psutil.Process) -> list[psutil.Process]:
    """Wait (at most 300 s) until a cell's actor runs: Ray is up and the driver is inside its cells' loop."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not _cell_actors(driver):
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.5)
    return _cell_actors(driver)


def test_a_driver_stopped_by_sigterm_closes_its_parent_run(tmp_path):
    """SIGTERM once a cell is in flight (its actor sleeps in the load stage): the driver marks its parent KILLED.
    Sent when the actor runs, not a fixed time after the parent appears (on a loaded machine the driver could still
    be starting Ray)."""
    root = make_project(tmp_path)
    proc = _driver(root, "+fault_injection={kind: sleep, seconds: 600, stage: load}")
    assert _wait_for_a_cell(proc, psutil.Process(proc.pid)), "no cell's actor started in 300 s"
    proc.terminate()
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0
    tracker = Tracker(f"sqlite:///{root}/mlflow.db", "tiny")
    (parent,) = tracker.client.search_runs([tracker.experiment_id], "tags.kind = 'sweep'")
    tracker.close()
    assert parent.info.status == "KILLED", out[-3000:]


@pytest.mark.slow  # a real driver, Ray and a cell killed mid-flight: 190 s on the shared 2-core machine
def test_a_driver_killed_mid_cell_leaves_no_writer_and_the_report_lists_its_cells(tmp_path):
    """The contract (docs/sweeps.md, "A killed sweep"): only the driver writes to the store, and a cell's actor dies
    with its driver. SIGKILL the driver mid-cell: its actor is gone within seconds, nothing is written to the store
    afterwards (the sleeping cell would have finished meanwhile), the next driver closes the parent as KILLED, and
    the report lists both planned cells as never logged instead of leaving them out."""
    from analysis.runs import unfinished_cells, unfinished_markdown  # noqa: PLC0415

    root = make_project(tmp_path)
    uri = f"sqlite:///{root}/mlflow.db"
    proc = _driver(root, "+fault_injection={kind: sleep, seconds: 6, stage: load}", "seeds=[0]")
    driver = psutil.Process(proc.pid)
    (actor,) = _wait_for_a_cell(proc, driver)  # Ray up, a cell's actor in flight
    family = driver.children(recursive=True)  # Ray's own processes, cleaned up below
    proc.kill()
    proc.wait(timeout=30)
    killed_at = time.time()
    try:
        psutil.wait_procs([actor], timeout=10)
        assert not actor.is_running() or actor.status() == psutil.STATUS_ZOMBIE  # it died with its driver
        time.sleep(10)  # the cell's 6-s sleep is over: an actor still alive would be past it by now
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("tiny").experiment_id
        assert client.search_runs([exp], "tags.kind = 'cell'", run_view_type=ViewType.ALL) == []  # nobody wrote
        (parent,) = client.search_runs([exp], "tags.kind = 'sweep'")
        assert parent.info.start_time / 1000 < killed_at
        # the next driver closes the dead one's parent; the report then names every cell that did not finish
        tracker = Tracker(uri, "tiny", str(root / "mlruns"))
        assert tracker.close_stale() == [parent.info.run_id]
        tracker.close()
        rows = unfinished_cells("tiny", uri)
        assert sorted(r["label"] for r in rows) == ["ar", "spd"], rows
        assert {r["state"] for r in rows} == {"never logged"} and all(parent.info.run_id in r["why"] for r in rows)
        md = unfinished_markdown("tiny", rows)
        assert "cells that did not finish (2)" in md and "| spd |" in md and "| ar |" in md
    finally:
        for p in family:
            try:
                p.kill()
            except psutil.Error:
                pass
