"""MLflow layout of a sweep (docs/DESIGN.md section 7): cell keys, runs, params, metrics, artifacts, resume.

- One experiment per sweep name; one parent run per invocation (``kind=sweep``); one nested run per
  cell (``kind=cell``, tag ``mlflow.parentRunId``) with tags (cell_key, method, label, pair, dataset,
  seed, cell_status, device, node, git commit), the flattened cell config as params, the cell's
  metrics, and artifacts: ``samples.jsonl`` (one record per generation), ``cell_config.yaml``,
  ``result.json`` (summary, energy, device, settings, stage times), ``scores.json`` (scorer details)
  and, for failed cells, ``traceback.txt``.
- Atomic from resume's point of view: a cell run is created with ``cell_status=logging``; its params,
  metrics and artifacts are written, and only then is ``cell_status`` set to its outcome (``finished``,
  ``score_failed``: generations kept, scoring/judging to redo; ``failed``). A run left ``logging``
  (the driver died or the store failed mid-write) never counts as finished and is superseded.
- Resumption: a cell whose key has an active run tagged ``cell_status=finished`` is skipped. A failed
  cell is re-run on the next invocation; once its new run is logged, the old failed run(s) of that
  key are tagged ``superseded_by=<new run id>`` and *deleted* (MLflow's soft delete: hidden from the UI
  and from searches, restorable with ``mlflow runs restore`` until ``mlflow gc``). So at any time each
  cell key has exactly one active run: finished, or the latest failure.
- Only the driver (``pipeline.sweep``) writes; actors return a ``CellResult`` (``pipeline/cell_types.py``),
  logged with its ``Cell`` by ``Tracker.log_cell``.
- Concurrency: drivers sharing a local store (sqlite file or file store) coordinate through lock
  files beside it (``<store>.locks/``): a driver holds an exclusive ``flock`` on ``cell-<key>.lock``
  while it runs and logs that cell, and on ``parent-<run id>.lock`` while its parent run is open; the
  kernel drops the locks when the driver dies, so a lease never outlives its driver. The first MLflow
  connection (schema creation/migration) and experiment creation run under ``<store>.lock``. Parent
  runs also carry a ``heartbeat`` tag (epoch seconds) refreshed by a background thread; a RUNNING parent
  whose lock is free (or, on a remote store, whose heartbeat is older than ``STALE_AFTER_S``) is closed
  as KILLED by the next driver. Duplicate active runs of one key (stores written before the leases)
  are reported and the newest finished one is used.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, ViewType
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from pipeline.cell_types import STATUS_FAILED, STATUS_FINISHED, STATUS_SCORE_FAILED, Cell, CellResult

KEY_LENGTH = 12
# MLflow 3's UI reads this experiment tag to tell model-training experiments (runs table, charts,
# compare view) from GenAI ones (traces/overview): a sweep is the former.
EXPERIMENT_KIND_TAGS = {"mlflow.experimentKind": "custom_model_development"}
PARAM_VALUE_LIMIT = 6000  # MLflow's limit on a param value (characters)
# A cell run's ``cell_status`` tag: a result's status (finished, score_failed, failed: pipeline/cell_types.py),
# or ``logging`` while its run is being written (never taken as an outcome).
STATUS_LOGGING = "logging"
HEARTBEAT_S = 15.0  # how often a driver refreshes its parent run's heartbeat tag
STALE_AFTER_S = 120.0  # a RUNNING parent without a heartbeat for this long is taken as dead (remote stores)
LOCAL_SCHEMES = ("sqlite", "file", "")
KNOWN_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks")

log = logging.getLogger(__name__)


class TrackingError(ValueError):
    """An unusable tracking URI / store; raised before Ray starts."""


class StoreWriteError(TrackingError):
    """The store stopped accepting writes (or reads) mid-sweep: the driver stops scheduling at once;
    the message says what happened and that the same command resumes."""


def cell_key(identity: Mapping[str, Any]) -> str:
    """Short stable hash of a cell's resolved identity (canonical JSON, sorted keys)."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"a.b": 1, "c": "[1, 2]"}`` (lists kept as JSON text)."""
    out: dict[str, Any] = {}
    if isinstance(obj, Mapping):
        if not obj and prefix:
            out[prefix] = "{}"
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        out[prefix] = json.dumps(list(obj), default=str)
    else:
        out[prefix] = obj
    return out


def numeric_metrics(values: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a flat mapping (bools as 0/1); None, NaN and text are left out."""
    out = {}
    for k, v in values.items():
        if isinstance(v, bool):
            out[k] = float(v)
        elif isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[k] = float(v)
    return out


def resolve_tracking_uri(uri: str, root: Path) -> str:
    """``sqlite:///relative.db`` -> an absolute SQLite path under ``root``; other URIs unchanged."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str((root / uri[len(prefix):]).resolve())
    if "://" not in uri:  # a plain folder: the file store
        return str((root / uri).resolve()) if not Path(uri).is_absolute() else uri
    return uri


def _scheme(uri: str) -> str:
    return uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""


def local_store_path(uri: str) -> Path | None:
    """The file (sqlite) or folder (file store) of a local store; None for remote stores."""
    scheme = _scheme(uri)
    if scheme == "sqlite":
        rest = uri[len("sqlite://"):]
        return Path(rest[1:]) if rest.startswith("/") else None  # sqlite:///abs -> /abs ; :memory: -> None
    if scheme == "file":
        return Path(uri[len("file://"):])
    if scheme == "":
        return Path(uri)
    return None


def check_tracking_uri(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast (seconds, not MLflow's minutes of retries) on a tracking URI that cannot work."""
    scheme = _scheme(uri)
    fix = "set tracking.uri=sqlite:///mlflow.db (a local file), or the address of a running `mlflow server`"
    if scheme not in KNOWN_SCHEMES + ("",):
        raise TrackingError(f"tracking.uri={uri!r}: unknown scheme {scheme!r} (valid: {', '.join(KNOWN_SCHEMES)}); {fix}")
    path = local_store_path(uri)
    if scheme == "sqlite" and path is None:
        raise TrackingError(f"tracking.uri={uri!r}: an in-memory or relative sqlite store cannot be shared with the UI; {fix}")
    if path is not None:
        folder = path.parent if scheme == "sqlite" else path
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent  # the store's folders are created on demand: check the nearest existing one
        if not folder.is_dir():
            raise TrackingError(f"tracking.uri={uri!r}: {folder} is a file, so no store can be created under it; {fix}")
        wanted = path.parent if scheme == "sqlite" else path
        if folder == Path(folder.anchor or "/") and wanted != folder:
            top = Path(folder.anchor or "/") / wanted.relative_to(folder).parts[0]
            hint = (f" (four slashes: the absolute path {path}; a path relative to the project is "
                    f"sqlite:///{path.relative_to(folder)})") if scheme == "sqlite" else ""
            raise TrackingError(f"tracking.uri={uri!r}: the store would create the top-level folder {top}{hint}; "
                                f"create the folder first if that is meant, or {fix}")
        if not os.access(folder, os.W_OK):
            raise TrackingError(f"tracking.uri={uri!r}: {folder} is not writable; {fix}")
        if scheme == "sqlite" and path.exists() and path.is_dir():
            raise TrackingError(f"tracking.uri={uri!r}: {path} is a folder, not a sqlite file; {fix}")
        if scheme == "sqlite" and path.is_file() and not os.access(path, os.W_OK):
            raise TrackingError(f"tracking.uri={uri!r}: {path} is read-only (the driver writes every cell to it); "
                                f"make it writable (chmod u+w) or {fix}")
        return
    if scheme in ("http", "https"):
        url = uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as err:
            if err.code in (401, 403):
                raise TrackingError(f"tracking server {uri} refused the request (HTTP {err.code}): set MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN") from None
            if err.code != 404:  # a proxy without /health still answers: the API is checked by MLflow
                raise TrackingError(f"tracking server {uri} answered HTTP {err.code} {err.reason} on /health; {fix}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
            raise TrackingError(f"tracking server {uri} is not reachable within {timeout_s:.0f} s ({getattr(err, 'reason', err)}); start it (`mlflow server --host 0.0.0.0 --port 5000 ...`) or {fix}") from None
        _check_tracking_api(uri, timeout_s, fix)


def _check_tracking_api(uri: str, timeout_s: float, fix: str) -> None:
    """One call of the tracking API itself (a server whose /health answers may still fail every call, and
    MLflow's client would retry it for minutes): an experiment search, with the client's credentials."""
    url = uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1"
    request = urllib.request.Request(url)
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    elif user and password:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read(1 << 20)
        json.loads(body or b"{}")
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            raise TrackingError(f"tracking server {uri} refused the API call (HTTP {err.code}): set MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN") from None
        raise TrackingError(f"tracking server {uri} answers /health but its API fails (HTTP {err.code} {err.reason} on "
                            f"/api/2.0/mlflow/experiments/search): check the server's log and its backend store; {fix}") from None
    except ValueError:
        raise TrackingError(f"tracking server {uri} answers /health but its API does not answer JSON (is it an MLflow server?); {fix}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
        raise TrackingError(f"tracking server {uri} answers /health but its API does not answer within {timeout_s:.0f} s "
                            f"({getattr(err, 'reason', err)}); {fix}") from None


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Exclusive lock around store creation / schema migration for local stores (no-op for remote ones)."""
    path = local_store_path(uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.parent / (path.name + ".lock")
    with open(lock, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


class FileLeases:
    """Exclusive non-blocking ``flock`` leases in a folder, one file per name; dropped by the kernel at exit."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._held: dict[str, Any] = {}
        self._mutex = threading.Lock()

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.lock"

    def try_acquire(self, name: str) -> bool:
        """True when this process now holds ``name`` (or already did)."""
        with self._mutex:
            if name in self._held:
                return True
            fh = open(self._path(name), "a+")
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.close()
                return False
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "since": time.time()}))
            fh.flush()
            self._held[name] = fh
            return True

    def release(self, name: str) -> None:
        with self._mutex:
            fh = self._held.pop(name, None)
        if fh is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            fh.close()

    def held_elsewhere(self, name: str) -> bool:
        """True when another live process holds ``name``."""
        if name in self._held:
            return False
        if not self.try_acquire(name):
            return True
        self.release(name)
        return False

    def release_all(self) -> None:
        for name in list(self._held):
            self.release(name)


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
        by_key.setdefault(r.data.tags.get("cell_key", ""), []).append(r)
    chosen, others = {}, {}
    for key, group in by_key.items():
        group.sort(key=lambda r: (rank.get(r.data.tags.get("cell_status"), 0), run_time(r), r.info.run_id), reverse=True)
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
                    location = (Path(artifact_root) / experiment).resolve().as_uri() if "://" not in artifact_root else f"{artifact_root.rstrip('/')}/{experiment}"
                try:
                    self.experiment_id = self.client.create_experiment(experiment, artifact_location=location, tags=EXPERIMENT_KIND_TAGS)
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
        self.logging_run_id: str | None = None
        self._heartbeat_stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # ------------------------------------------------------------------ queries

    def cell_runs(self, status: str | None = None) -> list[Any]:
        """Active cell runs of the experiment (optionally only those with ``cell_status=status``)."""
        flt = "tags.kind = 'cell'" + (f" and tags.cell_status = '{status}'" if status else "")
        runs, token = [], None
        while True:
            page = self.client.search_runs(
                [self.experiment_id], filter_string=flt, run_view_type=ViewType.ACTIVE_ONLY,
                max_results=1000, page_token=token,
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
        return list(self.client.search_runs([self.experiment_id], filter_string=f"tags.kind = 'cell' and tags.cell_key = '{key}'",
                                            run_view_type=ViewType.ACTIVE_ONLY, max_results=1000))

    def active(self) -> dict[str, Any]:
        """cell_key -> the active run standing for it (see ``pick_active``)."""
        return pick_active(self.cell_runs())[0]

    def failed_runs(self) -> dict[str, list[str]]:
        """cell_key -> run ids of active runs that did not finish (failed, score_failed, left mid-logging)."""
        out: dict[str, list[str]] = {}
        for r in self.cell_runs():
            if r.data.tags.get("cell_status") != STATUS_FINISHED:
                out.setdefault(r.data.tags["cell_key"], []).append(r.info.run_id)
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
            text = (f"{len(dup)} cell key(s) have more than one active run; each is counted once (its newest finished run): "
                    + ", ".join(f"{k} (+{len(v)})" for k, v in sorted(dup.items())[:10]) + (" ..." if len(dup) > 10 else ""))
            (warn or log.warning)(text)
        for r in chosen.values():
            tags = r.data.tags
            if wanted is not None and tags.get("cell_key") not in wanted:
                continue
            row = {k: tags.get(k) for k in ("cell_key", "method", "label", "pair", "dataset", "seed", "cell_status", "error", "node_id", "score_metric")}
            row["run_id"] = r.info.run_id
            row.update(r.data.metrics)
            out.append(row)
        return out

    # ------------------------------------------------------------------ writes

    def start_parent(self, run_name: str, tags: Mapping[str, Any], params: Mapping[str, Any]) -> str:
        tags = {"kind": "sweep", "heartbeat": f"{time.time():.0f}", "driver_pid": os.getpid(), "driver_host": os.uname().nodename, **_str_tags(tags)}
        run = self.client.create_run(self.experiment_id, tags=_str_tags(tags), run_name=run_name)
        self.parent_run_id = run.info.run_id
        if self.leases is not None:
            self.leases.try_acquire(f"parent-{self.parent_run_id}")
        self._log_params(self.parent_run_id, params)
        self._heartbeat_stop.clear()
        self._heartbeat = threading.Thread(target=self._beat, args=(self.parent_run_id,), daemon=True, name="mlflow-heartbeat")
        self._heartbeat.start()
        return self.parent_run_id

    def _beat(self, run_id: str) -> None:
        while not self._heartbeat_stop.wait(HEARTBEAT_S):
            try:
                self.client.set_tag(run_id, "heartbeat", f"{time.time():.0f}")
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
        """Close RUNNING parents whose driver is gone, and RUNNING cell runs left mid-logging, as KILLED.

        A driver is gone when its parent lock is free (local stores) or its heartbeat is older than
        ``STALE_AFTER_S`` (remote stores). A cell run left ``logging`` whose key is not leased is closed
        too (it never counted as finished; the cell runs again and supersedes it).
        """
        closed = []
        now = time.time()
        parents = self.client.search_runs([self.experiment_id], filter_string="tags.kind = 'sweep' and attributes.status = 'RUNNING'",
                                          run_view_type=ViewType.ACTIVE_ONLY, max_results=1000)
        for r in parents:
            rid = r.info.run_id
            if rid == self.parent_run_id:
                continue
            if self.leases is not None:
                dead = not self.leases.held_elsewhere(f"parent-{rid}")
            else:
                beat = float(r.data.tags.get("heartbeat") or (r.info.start_time or 0) / 1000)
                dead = now - beat > STALE_AFTER_S
            if dead:
                self.client.set_tag(rid, "closed_as_stale", f"driver gone (closed by pid {os.getpid()})")
                self.client.set_terminated(rid, "KILLED")
                closed.append(rid)
        for r in self.cell_runs(STATUS_LOGGING):
            if r.info.status != "RUNNING":
                continue
            if self.leases is not None and self.leases.held_elsewhere(f"cell-{r.data.tags.get('cell_key')}"):
                continue  # another driver is writing it right now
            if self.leases is None and now - run_time(r) / 1000 < STALE_AFTER_S:
                continue
            self.client.set_tag(r.info.run_id, "closed_as_stale", "logging never completed")
            self.client.set_terminated(r.info.run_id, "KILLED")
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
            "kind": "cell",
            "cell_key": cell.key,
            "method": cell.method,
            "label": cell.label,
            "pair": cell.pair_name,
            "dataset": cell.dataset_name,
            "seed": cell.seed,
            "cell_status": STATUS_LOGGING,  # the outcome is written last (see the module docstring)
            "stage": result.stage,
            "device": device.get("gpu_name") or device.get("device") or "",
            "gpu_uuid": device.get("gpu_uuid") or "",
            "node_id": result.node_id or "",
            "hostname": result.hostname or "",
            "git_commit": device.get("git_commit") or "",
            "score_metric": result.score_metric or "",
            "sweep": cell.sweep,
            "judge": json.dumps(result.judge_identity, sort_keys=True) if result.judge_identity else "",
            "cpu_isolation": (result.isolation or {}).get("mode", ""),
            # what the models ran in (pipeline.models.LoadedPair.precision)
            **{k: device[k] for k in PRECISION_TAGS if k in device},
        }
        if not result.finished:
            tags["error"] = (result.error or "unknown error")[:5000]
        if self.parent_run_id:
            tags[MLFLOW_PARENT_RUN_ID] = self.parent_run_id
        run = self.client.create_run(self.experiment_id, tags=_str_tags(tags), run_name=f"{cell.label}|{cell.dataset_name}|s{cell.seed}")
        run_id = run.info.run_id
        self.logging_run_id = run_id  # for mark_log_failed when a write below raises
        config = cell.config
        params = flatten(config)
        if result.isolation:
            params.update(flatten({"isolation": result.isolation}))
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
        if result.traceback:
            self.client.log_text(run_id, result.traceback, TRACEBACK_ARTIFACT)
        self.client.set_tag(run_id, "cell_status", result.status)  # last: only now may resume take the outcome
        self.client.set_terminated(run_id, "FINISHED" if result.finished else "FAILED")
        self.supersede(cell.key, keep=run_id)
        return run_id

    def mark_log_failed(self, run_id: str | None, error: str) -> None:
        """Best effort after a failed ``log_cell``: the run stays non-finished (it is retried)."""
        if run_id is None:
            return
        with contextlib.suppress(Exception):
            self.client.set_tag(run_id, "error", f"logging failed: {error}"[:5000])
            self.client.set_tag(run_id, "cell_status", STATUS_FAILED)
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
        self.client.log_text(run_id, "\n".join(json.dumps(r, default=str) for r in result.records) + "\n", SAMPLES_ARTIFACT)
        for k, v in tags.items():
            self.client.set_tag(run_id, k, str(v))
        if result.error:
            self.client.set_tag(run_id, "error", result.error[:5000])
        else:
            with contextlib.suppress(Exception):
                self.client.delete_tag(run_id, "error")
        self.client.set_tag(run_id, "cell_status", result.status)
        self.client.set_terminated(run_id, "FINISHED" if result.finished else "FAILED")

    def supersede(self, key: str, keep: str) -> list[str]:
        """Tag and delete every other active non-finished run of ``key`` (failed, score_failed, left mid-logging)."""
        gone = []
        for run_id in self.failed_runs().get(key, []):
            if run_id == keep:
                continue
            self.client.set_tag(run_id, "superseded_by", keep)
            self.client.delete_run(run_id)
            gone.append(run_id)
        return gone

    def _log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        items = [Param(str(k)[:250], _param_value(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):  # log_batch takes at most 100 params per call
            self.client.log_batch(run_id, params=items[i : i + 100])

    def _log_metrics(self, run_id: str, metrics: Mapping[str, Any]) -> None:
        now = int(time.time() * 1000)
        items = [Metric(k, v, now, 0) for k, v in numeric_metrics(metrics).items()]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i : i + 1000])


def _param_value(v: Any) -> str:
    text = "null" if v is None else (json.dumps(v) if isinstance(v, bool) else str(v))
    return text[:PARAM_VALUE_LIMIT]


def _str_tags(tags: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in tags.items() if v is not None}


# ------------------------------------------------------------------------ the layout's names
# What a cell run carries, named once: ``analysis/`` reads runs through these names
# (analysis/schema.py maps its columns onto them); tests/test_tracking.py checks that
# ``Tracker.log_cell`` writes every one of them.
KIND_TAG = "kind"  # every run: "cell" (one per cell) or "sweep" (the parent run of an invocation)
KIND_CELL = "cell"
KIND_SWEEP = "sweep"
CELL_STATUS_TAG = "cell_status"
CELL_FINISHED = STATUS_FINISHED
CELL_TAGS = (
    "cell_key", "method", "label", "pair", "dataset", "seed", "cell_status", "stage", "device", "gpu_uuid",
    "node_id", "hostname", "git_commit", "score_metric", "sweep",
)
ERROR_TAG = "error"  # failed cells only
SAMPLES_ARTIFACT = "samples.jsonl"  # one record per generation (measure.GenerationRecord.to_dict)
RESULT_ARTIFACT = "result.json"
SCORES_ARTIFACT = "scores.json"
CONFIG_ARTIFACT = "cell_config.yaml"
TRACEBACK_ARTIFACT = "traceback.txt"
# The fields of a CellResult written to RESULT_ARTIFACT (``result.json``).
PRECISION_TAGS = ("cpu_bf16", "cpu_bf16_flags", "target_dtype", "target_kernels", "draft_dtype", "draft_kernels")
RESULT_FIELDS = ("status", "error", "stage", "stages", "summary", "energy", "idle", "warmup", "device", "settings", "node_id", "hostname")
