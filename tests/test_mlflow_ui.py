"""The MLflow UI serves what a person needs to look at a sweep.

A store is made through ``pipeline.tracking`` (the analysis fixture sweep: a parent run and 24 nested
cell runs with their per-sample artifacts), the report logs its figures to the parent run, and a real
``mlflow server`` (the UI's backend, started as ``mlflow ui`` is) answers over HTTP the same REST
calls the UI's pages make: the experiment (tagged as a model-training experiment, so MLflow 3 shows
its runs table rather than the GenAI overview), the runs with their nesting, params and metrics (the
runs table and the Compare view), the metric histories (the charts) and the artifacts (the figures'
PNG bytes, each cell's ``samples.jsonl``). The server is stopped whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import _fixtures_analysis as fx
import pytest

from analysis.report import latest_sweep, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, uri: str, workdir: Path):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "server.log"
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                uri,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],
            cwd=workdir,
            env=env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited ({self.proc.returncode}): {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"mlflow server not ready after {timeout} s: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the server and its workers only
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)

    def get(self, endpoint: str, **query) -> bytes:
        url = self.base + endpoint + (("?" + urllib.parse.urlencode(query)) if query else "")
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200, url
            return r.read()

    def get_json(self, endpoint: str, **query) -> dict:
        return json.loads(self.get(endpoint, **query))

    def post_json(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            self.base + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui_store")
    uri = fx.build_store(root)
    assert latest_sweep(uri) == fx.SWEEP  # what `make run` reports after the sweep (--latest)
    written = write_report(fx.SWEEP, uri, root / "report", notebooks=(), n_boot=50, log=lambda *a: None)
    server = Server(uri, root)
    try:
        server.wait_ready()
        yield server, written
    finally:
        server.stop()
    assert server.proc.poll() is not None


def _tags(entity: dict) -> dict:
    return {t["key"]: t["value"] for t in entity.get("tags", [])}


def test_ui_serves_the_experiment_runs_metrics_and_figures(served):
    server, written = served
    assert b"<html" in server.get("/").lower()  # the UI itself (static bundle)

    exp = server.get_json("/ajax-api/2.0/mlflow/experiments/get-by-name", experiment_name=fx.SWEEP)["experiment"]
    assert _tags(exp)["mlflow.experimentKind"] == "custom_model_development"  # runs view, not the GenAI overview
    view = json.loads(_tags(exp)["mlflow.sharedViewState.sweep"])  # report.view_url opens the runs table on it
    assert {
        f"metrics.`{m}`" for m in ("tokens_per_s", "speedup", "accepted_per_step", "perplexity", "score", "j_per_token")
    } <= set(view["selectedColumns"])
    assert {"tags.`label`", "params.`method.gamma`"} <= set(view["selectedColumns"])
    # MLflow sorts selected metrics by name (accepted_per_step first) unless the view orders them: the compared
    # metrics come right after the run name, Created and Duration, in the order a reader compares them
    order = view["columnOrder"]
    assert order[:9] == [
        "attributes.`Run Name`",
        "runDateAndNestInfo",
        "duration",
        *(
            f"metrics.`{m}`"
            for m in ("speedup", "tokens_per_s", "accepted_per_step", "j_per_token", "score", "perplexity")
        ),
    ]
    assert set(view["selectedColumns"]) <= set(order)
    # the first screen: the cells (not one collapsed parent row), grouped by dataset and method, averaged over seeds
    assert view["searchFilter"] == "tags.kind = 'cell'"
    assert view["groupBy"] == {
        "aggregateFunction": "average",
        "groupByKeys": [{"mode": "tag", "groupByData": "dataset"}, {"mode": "tag", "groupByData": "label"}],
    }

    runs = server.post_json(
        "/ajax-api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 1000}
    )["runs"]
    parents = [r for r in runs if _tags(r["data"])["kind"] == "sweep"]
    cells = [r for r in runs if _tags(r["data"])["kind"] == "cell"]
    assert len(parents) == 1 and len(cells) == 24
    parent_id = parents[0]["info"]["run_id"]
    assert parent_id == written["parent_run"]
    assert all(_tags(c["data"])["mlflow.parentRunId"] == parent_id for c in cells)  # nested under the parent

    # the runs table / Compare view: params and metrics of the cells, the report's summary on the parent
    finished = [c for c in cells if _tags(c["data"])["cell_status"] == "finished"]
    assert len(finished) == 23
    one = next(
        c
        for c in finished
        if _tags(c["data"])["label"] == "spd"
        and _tags(c["data"])["dataset"] == "humaneval"
        and _tags(c["data"])["seed"] == "0"
    )
    # the run spans the cell's own time (Duration), not the 30 ms it took to log it
    assert int(one["info"]["end_time"]) - int(one["info"]["start_time"]) > 20_000
    params = {p["key"]: p["value"] for p in one["data"]["params"]}
    metrics = {m["key"]: m["value"] for m in one["data"]["metrics"]}
    assert params["method.gamma"] == "4" and params["dataset.name"] == "humaneval"
    assert metrics["tokens_per_s"] == pytest.approx(200 / sum(n / 20.0 for n in fx.TOKENS))
    spd_over_ar = fx.TOKENS_PER_S[("humaneval", "spd")][0] / fx.TOKENS_PER_S[("humaneval", "ar")][0]
    assert metrics["speedup"] == pytest.approx(spd_over_ar)  # each cell's own speedup, for the table and its averages
    assert all("speedup" not in {m["key"] for m in c["data"]["metrics"]} for c in cells if c not in finished)
    parent_metrics = {m["key"]: m["value"] for m in parents[0]["data"]["metrics"]}
    assert parent_metrics["speedup.humaneval.spd"] == pytest.approx(
        sum(s / a for s, a in zip(fx.TOKENS_PER_S[("humaneval", "spd")], fx.TOKENS_PER_S[("humaneval", "ar")])) / 3
    )
    history = server.get_json(
        "/ajax-api/2.0/mlflow/metrics/get-history", run_id=one["info"]["run_id"], metric_key="tokens_per_s"
    )
    assert [m["value"] for m in history["metrics"]] == [metrics["tokens_per_s"]]

    # artifacts: the figures of the parent run and the per-sample records of a cell, as the UI fetches them
    listed = server.get_json("/ajax-api/2.0/mlflow/artifacts/list", run_id=parent_id, path="report/figures")
    pngs = sorted(f["path"] for f in listed["files"] if f["path"].endswith(".png"))
    expected = sorted(
        f"report/figures/{p.name}" for paths in written["figures"].values() for p in paths if p.suffix == ".png"
    )
    assert pngs == expected and pngs
    for path in pngs:
        assert server.get("/get-artifact", path=path, run_uuid=parent_id).startswith(PNG_MAGIC)
    report = {
        f["path"]
        for f in server.get_json("/ajax-api/2.0/mlflow/artifacts/list", run_id=parent_id, path="report")["files"]
    }
    assert {"report/table5.md", "report/runs.csv"} <= report
    samples = server.get("/get-artifact", path="samples.jsonl", run_uuid=one["info"]["run_id"]).decode().splitlines()
    assert [json.loads(line)["new_tokens"] for line in samples] == list(fx.TOKENS)
