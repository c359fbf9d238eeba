"""The MLflow side of one sweep invocation (``Tracker``): resume queries, runs, params, metrics, artifacts.

The names it writes are those of ``pipeline.tracking.layout``; where the store is and its locks are
``pipeline.tracking.store`` and ``pipeline.tracking.leases``.

- Atomic from resume's point of view: a cell run is created with ``TAG_STATUS=STATUS_LOGGING``; its
  params, metrics and artifacts are written, and only then is its status set to the outcome
  (``finished``, ``score_failed``: generations kept, scoring/judging to redo; ``failed``). A run left
  ``logging`` (the driver died or the store failed mid-write) never counts as finished and is
  superseded; a write that raises marks the run failed before the error goes on (``log_cell``).
- Resumption: a cell whose key has an active run tagged finished is skipped. A failed cell is re-run
  on the next invocation; once its new run is logged, the old failed run(s) of that key are tagged
  ``superseded_by=<new run id>`` and *deleted* (MLflow's soft delete: hidden from the UI and from
  searches, restorable with ``mlflow runs restore`` until ``mlflow gc``). So at any time each cell key
  has exactly one active run: finished, or the latest failure.
- Only the driver (``pipeline.sweep``) writes; actors return a ``CellResult`` (``pipeline/cell_types.py``),
  logged with its ``Cell`` by ``Tracker.log_cell``.
- Parent runs carry a heartbeat tag (epoch seconds) refreshed by a background thread; a RUNNING parent
  whose lock is free (or, on a remote store, whose heartbeat is older than ``STALE_AFTER_S``) is closed
  as KILLED by the next driver. Duplicate active runs of one key (stores written before the leases)
  are reported and the newest finished one is used.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, ViewType
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from pipeline.cell_types import Cell, CellResult
from pipeline.tracking.layout import (
    CONFIG_ARTIFACT,
    EXPERIMENT_KIND_TAGS,
    ISOLATION_PARAM,
    KIND_CELL,
    KIND_SWEEP,
    PARAM_KEY_LIMIT,
    PRECISION_TAGS,
    PROFILE_ARTIFACT,
    RESULT_ARTIFACT,
    RESULT_FIELDS,
    SAMPLES_ARTIFACT,
    SCORES_ARTIFACT,
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_LOGGING,
    STATUS_SCORE_FAILED,
    TAG_CELL_KEY,
    TAG_CLOSED_AS_STALE,
    TAG_CODE_HASH,
    TAG_CONFIG_KEY,
    TAG_CPU_ISOLATION,
    TAG_DATASET,
    TAG_DEVICE,
    TAG_DRIVER_HOST,
    TAG_DRIVER_PID,
    TAG_ERROR,
    TAG_GIT_COMMIT,
    TAG_GPU_UUID,
    TAG_HEARTBEAT,
    TAG_HOSTNAME,
    TAG_JUDGE,
    TAG_KIND,
    TAG_LABEL,
    TAG_METHOD,
    TAG_NODE,
    TAG_PAIR,
    TAG_SCORE_METRIC,
    TAG_SEED,
    TAG_STAGE,
    TAG_STATUS,
    TAG_SUPERSEDED_BY,
    TAG_SWEEP,
    TRACEBACK_ARTIFACT,
    flatten,
    numeric_metrics,
    param_value,
    scorer_tags,
    str_tags,
)
from pipeline.tracking.leases import FileLeases, store_lock
from pipeline.tracking.store import check_tracking_uri, local_store_path

HEARTBEAT_S = 15.0  # how often a driver refreshes its parent run's heartbeat tag
STALE_AFTER_S = 120.0  # a RUNNING parent without a heartbeat for this long is taken as dead (remote stores)
ERROR_LIMIT = 5000  # characters of an error kept in its tag

log = logging.getLogger(__name__)


def run_time(run: Any) -> int:
    return int(run.info.end_time or run.info.start_time or 0)


def pick_active(runs: Iterable[Any]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """(cell_key -> the run that stands for the key, cell_key -> ids of other active runs of that key).

    The newest ``finished`` run stands for a key; without one, the newest ``score_failed`` (its
    generations can be re-scored); else the newest run of any status.
    """
    rank = {STATUS_FINISHED: 2, STATUS_SCORE_FAILED: 1}
    by_key: dict[str, list[Any]] = {}
    for r in runs:
        by_key.setdefault(r.data.tags.get(TAG_CELL_KEY, ""), []).append(r)
    chosen, others = {}, {}
    for key, group in by_key.items():
        group.sort(key=lambda r: (rank.get(r.data.tags.get(TAG_STATUS), 0), run_time(r), r.info.run_id), reverse=True)
        chosen[key] = group[0]
        if len(group) > 1:
            others[key] = [r.info.run_id for r in group[1:]]
    return chosen, others


class Tracker:
    """The MLflow side of one sweep invocation."""

    def __init__(self, tracking_uri: str, experiment: str, artifact_root: str | None = None):
        check_tracking_uri(tracking_uri)
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment
        with store_lock(tracking_uri):  # schema creation/migration and experiment creation: one driver at a time
            mlflow.set_tracking_uri(tracking_uri)
            self.client = MlflowClient(tracking_uri=tracking_uri)
            found = self.client.get_experiment_by_name(experiment)
            if found is None:
                location = None
                if artifact_root:
                    location = (
                        (Path(artifact_root) / experiment).resolve().as_uri()
                        if "://" not in artifact_root
                        else f"{artifact_root.rstrip('/')}/{experiment}"
                    )
                try:
                    self.experiment_id = self.client.create_experiment(
                        experiment, artifact_location=location, tags=EXPERIMENT_KIND_TAGS
                    )
                except Exception:  # noqa: BLE001 - a remote store: another driver created it first
                    found = self.client.get_experiment_by_name(experiment)
                    if found is None:
                        raise
                    self.experiment_id = found.experiment_id
            else:
                if found.lifecycle_stage == "deleted":
                    self.client.restore_experiment(found.experiment_id)
                self.experiment_id = found.experiment_id
            for key, value in EXPERIMENT_KIND_TAGS.items():
                if found is not None and found.tags.get(key) != value:
                    self.client.set_experiment_tag(self.experiment_id, key, value)
        path = local_store_path(tracking_uri)
        self.leases: FileLeases | None = FileLeases(path.parent / (path.name + ".locks")) if path is not None else None
        self.parent_run_id: str | None = None
        self._heartbeat_stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # ------------------------------------------------------------------ queries

    def cell_runs(self, status: str | None = None) -> list[Any]:
        """Active cell runs of the experiment (optionally only those with ``cell_status=status``)."""
        flt = f"tags.{TAG_KIND} = '{KIND_CELL}'" + (f" and tags.{TAG_STATUS} = '{status}'" if status else "")
        runs: list[Any] = []
        token: str | None = None
        while True:
            page = self.client.search_runs(
                [self.experiment_id],
                filter_string=flt,
                run_view_type=ViewType.ACTIVE_ONLY,
                max_results=1000,
                page_token=token,
            )
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def finished_keys(self) -> dict[str, str]:
        """cell_key -> run id of every finished cell (the resume query; the newest when duplicated)."""
        chosen, _ = pick_active(self.cell_runs(STATUS_FINISHED))
        return {k: r.info.run_id for k, r in chosen.items()}

    def key_runs(self, key: str) -> list[Any]:
        """Active cell runs of one key."""
        return list(
            self.client.search_runs(
                [self.experiment_id],
                filter_string=f"tags.{TAG_KIND} = '{KIND_CELL}' and tags.{TAG_CELL_KEY} = '{key}'",
                run_view_type=ViewType.ACTIVE_ONLY,
                max_results=1000,
            )
        )

    def active(self) -> dict[str, Any]:
        """cell_key -> the active run standing for it (see ``pick_active``)."""
        return pick_active(self.cell_runs())[0]

    def failed_runs(self) -> dict[str, list[str]]:
        """cell_key -> run ids of active runs that did not finish (failed, score_failed, left mid-logging)."""
        out: dict[str, list[str]] = {}
        for r in self.cell_runs():
            if r.data.tags.get(TAG_STATUS) != STATUS_FINISHED:
                out.setdefault(r.data.tags[TAG_CELL_KEY], []).append(r.info.run_id)
        return out

    def rows(self, keys: Iterable[str] | None = None, warn=None) -> list[dict[str, Any]]:
        """One flat row per cell key (tags + metrics), for the summary tables.

        A key with several active runs (two drivers before leases, a store merged by hand) is reported
        through ``warn`` (default: the logger) and stands for its newest finished run.
        """
        wanted = set(keys) if keys is not None else None
        out = []
        chosen, others = pick_active(self.cell_runs())
        dup = {k: v for k, v in others.items() if wanted is None or k in wanted}
        if dup:
            text = (
                f"{len(dup)} cell key(s) have more than one active run; "
                "each is counted once (its newest finished run): "
                + ", ".join(f"{k} (+{len(v)})" for k, v in sorted(dup.items())[:10])
                + (" ..." if len(dup) > 10 else "")
            )
            (warn or log.warning)(text)
        for r in chosen.values():
            tags = r.data.tags
            if wanted is not None and tags.get(TAG_CELL_KEY) not in wanted:
                continue
            row = {
                k: tags.get(k)
                for k in (
                    TAG_CELL_KEY,
                    TAG_METHOD,
                    TAG_LABEL,
                    TAG_PAIR,
                    TAG_DATASET,
                    TAG_SEED,
                    TAG_STATUS,
                    TAG_ERROR,
                    TAG_NODE,
                    TAG_SCORE_METRIC,
                )
            }
            row["run_id"] = r.info.run_id
            row.update(r.data.metrics)
            out.append(row)
        return out

    # ------------------------------------------------------------------ writes

    def start_parent(self, run_name: str, tags: Mapping[str, Any], params: Mapping[str, Any]) -> str:
        tags = {
            TAG_KIND: KIND_SWEEP,
            TAG_HEARTBEAT: f"{time.time():.0f}",
            TAG_DRIVER_PID: os.getpid(),
            TAG_DRIVER_HOST: os.uname().nodename,
            **str_tags(tags),
        }
        run = self.client.create_run(self.experiment_id, tags=str_tags(tags), run_name=run_name)
        self.parent_run_id = run.info.run_id
        if self.leases is not None:
            self.leases.try_acquire(f"parent-{self.parent_run_id}")
        self._log_params(self.parent_run_id, params)
        self._heartbeat_stop.clear()
        self._heartbeat = threading.Thread(
            target=self._beat, args=(self.parent_run_id,), daemon=True, name="mlflow-heartbeat"
        )
        self._heartbeat.start()
        return self.parent_run_id

    def _beat(self, run_id: str) -> None:
        while not self._heartbeat_stop.wait(HEARTBEAT_S):
            try:
                self.client.set_tag(run_id, TAG_HEARTBEAT, f"{time.time():.0f}")
            except Exception as err:  # noqa: BLE001 - a store hiccup must not kill the sweep
                log.warning("heartbeat of run %s not written: %s", run_id, err)

    def end_parent(self, status: str, metrics: Mapping[str, Any], tags: Mapping[str, Any] | None = None) -> None:
        if self.parent_run_id is None:
            return
        self._heartbeat_stop.set()
        self._log_metrics(self.parent_run_id, metrics)
        for k, v in (tags or {}).items():
            self.client.set_tag(self.parent_run_id, k, str(v))
        self.client.set_terminated(self.parent_run_id, status)
        if self.leases is not None:
            self.leases.release(f"parent-{self.parent_run_id}")

    def close_stale(self) -> list[str]:
        """Close RUNNING parents whose driver is gone, and RUNNING cell runs left mid-logging, as KILLED; a RUNNING
        cell run whose outcome was logged but not its end (its driver died between the two) ends as its outcome says.

        A driver is gone when its parent lock is free (local stores) or its heartbeat is older than
        ``STALE_AFTER_S`` (remote stores). A cell run left ``logging`` whose key is not leased is closed
        too (it never counted as finished; the cell runs again and supersedes it).
        """
        closed = []
        now = time.time()
        parents = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.{TAG_KIND} = '{KIND_SWEEP}' and attributes.status = 'RUNNING'",
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=1000,
        )
        for r in parents:
            rid = r.info.run_id
            if rid == self.parent_run_id:
                continue
            if self.leases is not None:
                dead = not self.leases.held_elsewhere(f"parent-{rid}")
            else:
                beat = float(r.data.tags.get(TAG_HEARTBEAT) or (r.info.start_time or 0) / 1000)
                dead = now - beat > STALE_AFTER_S
            if dead:
                self.client.set_tag(rid, TAG_CLOSED_AS_STALE, f"driver gone (closed by pid {os.getpid()})")
                self.client.set_terminated(rid, "KILLED")
                closed.append(rid)
        for r in self.cell_runs():
            if r.info.status != "RUNNING":
                continue
            if self.leases is not None and self.leases.held_elsewhere(f"cell-{r.data.tags.get(TAG_CELL_KEY)}"):
                continue  # another driver is writing it right now
            outcome = r.data.tags.get(TAG_STATUS)
            if outcome == STATUS_LOGGING:
                if self.leases is None and now - run_time(r) / 1000 < STALE_AFTER_S:
                    continue
                self.client.set_tag(r.info.run_id, TAG_CLOSED_AS_STALE, "logging never completed")
                self.client.set_terminated(r.info.run_id, "KILLED")
            else:  # its outcome is written (last of its data): its driver died before ending it; ending it is the
                # same whoever does it, so a remote store's live driver racing this one is harmless
                self.client.set_tag(r.info.run_id, TAG_CLOSED_AS_STALE, "its outcome was logged, its end was not")
                self.client.set_terminated(r.info.run_id, "FINISHED" if outcome == STATUS_FINISHED else "FAILED")
            closed.append(r.info.run_id)
        return closed

    # ------------------------------------------------------------------ leases

    def claim(self, key: str) -> bool:
        """Lease ``key`` for this driver (True), or False when another live driver holds it."""
        return True if self.leases is None else self.leases.try_acquire(f"cell-{key}")

    def release(self, key: str) -> None:
        if self.leases is not None:
            self.leases.release(f"cell-{key}")

    def close(self) -> None:
        self._heartbeat_stop.set()
        if self.leases is not None:
            self.leases.release_all()

    def log_cell(self, cell: Cell, result: CellResult) -> str:
        """One run for one cell's result; supersedes (tags and deletes) older failed runs of its key."""
        device = result.device or {}
        tags = {
            TAG_KIND: KIND_CELL,
            TAG_CELL_KEY: cell.key,
            TAG_CONFIG_KEY: cell.config_key,
            TAG_METHOD: cell.method,
            TAG_LABEL: cell.label,
            TAG_PAIR: cell.pair_name,
            TAG_DATASET: cell.dataset_name,
            TAG_SEED: cell.seed,
            TAG_STATUS: STATUS_LOGGING,  # the outcome is written last (see the module docstring)
            TAG_STAGE: result.stage,
            TAG_DEVICE: device.get("gpu_name") or device.get("device") or "",
            TAG_GPU_UUID: device.get("gpu_uuid") or "",
            TAG_NODE: result.node_id or "",
            TAG_HOSTNAME: result.hostname or "",
            TAG_GIT_COMMIT: device.get("git_commit") or "",
            TAG_CODE_HASH: device.get("code_hash") or "",
            TAG_SCORE_METRIC: result.score_metric or "",
            **scorer_tags(cell),
            TAG_SWEEP: cell.sweep,
            TAG_JUDGE: json.dumps(result.judge_identity, sort_keys=True) if result.judge_identity else "",
            TAG_CPU_ISOLATION: (result.isolation or {}).get("mode", ""),
            # what the models ran in (pipeline.models.LoadedPair.precision)
            **{k: device[k] for k in PRECISION_TAGS if k in device},
        }
        if not result.finished:
            tags[TAG_ERROR] = (result.error or "unknown error")[:ERROR_LIMIT]
        if self.parent_run_id:
            tags[MLFLOW_PARENT_RUN_ID] = self.parent_run_id
        # the run spans the cell's own time (the runs table's Created and Duration), not the moment it is logged
        start_ms = int(result.started_at * 1000) if result.started_at else None
        run = self.client.create_run(
            self.experiment_id,
            start_time=start_ms,
            tags=str_tags(tags),
            run_name=f"{cell.label}|{cell.dataset_name}|s{cell.seed}",
        )
        run_id = run.info.run_id
        try:
            self._write_cell(run_id, cell, result)
        except Exception as err:
            self.mark_log_failed(run_id, f"{type(err).__name__}: {err}")  # never left looking finished
            raise
        self.supersede(cell.key, keep=run_id)
        return run_id

    def _write_cell(self, run_id: str, cell: Cell, result: CellResult) -> None:
        """Params, metrics and artifacts of a cell run, then its outcome (last: only now may resume take it)."""
        config = cell.config
        params = flatten(config)
        if result.isolation:
            params.update(flatten({ISOLATION_PARAM: result.isolation}))
        self._log_params(run_id, params)
        self._log_metrics(run_id, result.metrics)
        self.client.log_dict(run_id, config, CONFIG_ARTIFACT)
        if result.records:
            lines = "\n".join(json.dumps(r, default=str) for r in result.records)
            self.client.log_text(run_id, lines + "\n", SAMPLES_ARTIFACT)
        if result.scores:
            self.client.log_text(run_id, json.dumps(result.scores, indent=1, default=str), SCORES_ARTIFACT)
        summary = {k: getattr(result, k) for k in RESULT_FIELDS}
        self.client.log_text(run_id, json.dumps(summary, indent=1, default=str), RESULT_ARTIFACT)
        if result.speculation_profile:
            self.client.log_text(run_id, json.dumps(result.speculation_profile, indent=2), PROFILE_ARTIFACT)
        if result.traceback:
            self.client.log_text(run_id, result.traceback, TRACEBACK_ARTIFACT)
        self.client.set_tag(run_id, TAG_STATUS, result.status)
        end_ms = int(result.ended_at * 1000) if result.ended_at else None
        self.client.set_terminated(run_id, "FINISHED" if result.finished else "FAILED", end_time=end_ms)

    def mark_log_failed(self, run_id: str, error: str) -> None:
        """Best effort after a failed write of a cell run: the run stays non-finished (it is retried)."""
        with contextlib.suppress(Exception):
            self.client.set_tag(run_id, TAG_ERROR, f"logging failed: {error}"[:ERROR_LIMIT])
            self.client.set_tag(run_id, TAG_STATUS, STATUS_FAILED)
            self.client.set_terminated(run_id, "FAILED")

    def samples(self, run_id: str) -> list[dict[str, Any]]:
        """The generation records a run logged (``samples.jsonl``)."""
        text = self._read_text(run_id, SAMPLES_ARTIFACT)
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def _read_text(self, run_id: str, name: str) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            local = self.client.download_artifacts(run_id, name, tmp)
            return Path(local).read_text()

    def record_scores(self, run_id: str, result: CellResult, tags: Mapping[str, Any]) -> None:
        """Re-scoring of a logged cell, in place (``pipeline.cell.rescore``'s result): its generations stay;
        the metrics, scores, samples' verdicts, ``tags`` and error are written, the status last.

        A write that fails midway leaves the old status and ``judge`` tag: the next invocation scores again.
        """
        self._log_metrics(run_id, result.metrics)
        if result.scores is not None:
            self.client.log_text(run_id, json.dumps(result.scores, indent=1, default=str), SCORES_ARTIFACT)
        self.client.log_text(
            run_id, "\n".join(json.dumps(r, default=str) for r in result.records) + "\n", SAMPLES_ARTIFACT
        )
        for k, v in tags.items():
            self.client.set_tag(run_id, k, str(v))
        if result.error:
            self.client.set_tag(run_id, TAG_ERROR, result.error[:ERROR_LIMIT])
        else:
            with contextlib.suppress(Exception):
                self.client.delete_tag(run_id, TAG_ERROR)
        self.client.set_tag(run_id, TAG_STATUS, result.status)
        self.client.set_terminated(run_id, "FINISHED" if result.finished else "FAILED")

    def supersede(self, key: str, keep: str) -> list[str]:
        """Tag and delete every other active non-finished run of ``key`` (failed, score_failed, left mid-logging)."""
        gone = []
        for run_id in self.failed_runs().get(key, []):
            if run_id == keep:
                continue
            self.client.set_tag(run_id, TAG_SUPERSEDED_BY, keep)
            self.client.delete_run(run_id)
            gone.append(run_id)
        return gone

    def _log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        items = [Param(str(k)[:PARAM_KEY_LIMIT], param_value(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):  # log_batch takes at most 100 params per call
            self.client.log_batch(run_id, params=items[i : i + 100])

    def _log_metrics(self, run_id: str, metrics: Mapping[str, Any]) -> None:
        now = int(time.time() * 1000)
        items = [Metric(k, v, now, 0) for k, v in numeric_metrics(metrics).items()]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i : i + 1000])
