"""MLflow layout of a sweep (docs/DESIGN.md section 7): cell keys, runs, params, metrics, artifacts, resume.

- One experiment per sweep name; one parent run per invocation (``kind=sweep``); one nested run per
  cell (``kind=cell``, tag ``mlflow.parentRunId``) with tags (cell_key, method, label, pair, dataset,
  seed, cell_status, device, node, git commit), the flattened cell config as params, the cell's
  metrics, and artifacts: ``samples.jsonl`` (one record per generation), ``cell_config.yaml``,
  ``result.json`` (summary, energy, device, settings, stage times), ``scores.json`` (scorer details)
  and, for failed cells, ``traceback.txt``.
- Resumption: a cell whose key has an active run tagged ``cell_status=finished`` is skipped. A failed
  cell is re-run on the next invocation; once its new run is logged, the old failed run(s) of that
  key are tagged ``superseded_by=<new run id>`` and *deleted* (MLflow's soft delete: hidden from the UI
  and from searches, restorable with ``mlflow runs restore`` until ``mlflow gc``). So at any time each
  cell key has exactly one active run: finished, or the latest failure.
- Only the driver (``pipeline.sweep``) writes; actors return plain dicts.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

KEY_LENGTH = 12
# MLflow 3's UI reads this experiment tag to tell model-training experiments (runs table, charts,
# compare view) from GenAI ones (traces/overview): a sweep is the former.
EXPERIMENT_KIND_TAGS = {"mlflow.experimentKind": "custom_model_development"}
PARAM_VALUE_LIMIT = 6000  # MLflow's limit on a param value (characters)


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


class Tracker:
    """The MLflow side of one sweep invocation."""

    def __init__(self, tracking_uri: str, experiment: str, artifact_root: str | None = None):
        import mlflow
        from mlflow import MlflowClient

        mlflow.set_tracking_uri(tracking_uri)
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiment_name = experiment
        found = self.client.get_experiment_by_name(experiment)
        if found is None:
            location = None
            if artifact_root:
                location = (Path(artifact_root) / experiment).resolve().as_uri() if "://" not in artifact_root else f"{artifact_root.rstrip('/')}/{experiment}"
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=location, tags=EXPERIMENT_KIND_TAGS)
        else:
            if found.lifecycle_stage == "deleted":
                self.client.restore_experiment(found.experiment_id)
            self.experiment_id = found.experiment_id
            for key, value in EXPERIMENT_KIND_TAGS.items():
                if found.tags.get(key) != value:
                    self.client.set_experiment_tag(self.experiment_id, key, value)
        self.parent_run_id: str | None = None

    # ------------------------------------------------------------------ queries

    def cell_runs(self, status: str | None = None) -> list[Any]:
        """Active cell runs of the experiment (optionally only those with ``cell_status=status``)."""
        from mlflow.entities import ViewType

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
        """cell_key -> run id of every finished cell (the resume query)."""
        return {r.data.tags["cell_key"]: r.info.run_id for r in self.cell_runs("finished")}

    def failed_runs(self) -> dict[str, list[str]]:
        """cell_key -> run ids of active failed runs."""
        out: dict[str, list[str]] = {}
        for r in self.cell_runs("failed"):
            out.setdefault(r.data.tags["cell_key"], []).append(r.info.run_id)
        return out

    def rows(self, keys: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """One flat row per active cell run (tags + metrics), for the summary tables."""
        wanted = set(keys) if keys is not None else None
        out = []
        for r in self.cell_runs():
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
        run = self.client.create_run(self.experiment_id, tags={"kind": "sweep", **_str_tags(tags)}, run_name=run_name)
        self.parent_run_id = run.info.run_id
        self._log_params(self.parent_run_id, params)
        return self.parent_run_id

    def end_parent(self, status: str, metrics: Mapping[str, Any], tags: Mapping[str, Any] | None = None) -> None:
        if self.parent_run_id is None:
            return
        self._log_metrics(self.parent_run_id, metrics)
        for k, v in (tags or {}).items():
            self.client.set_tag(self.parent_run_id, k, str(v))
        self.client.set_terminated(self.parent_run_id, status)

    def log_cell(self, cell: Mapping[str, Any], result: Mapping[str, Any]) -> str:
        """One run for one cell's result; supersedes (tags and deletes) older failed runs of its key."""
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        status = result.get("status", "failed")
        device = result.get("device") or {}
        tags = {
            "kind": "cell",
            "cell_key": cell["key"],
            "method": cell["method"]["name"],
            "label": cell["label"],
            "pair": cell["pair"]["name"],
            "dataset": cell["dataset"]["name"],
            "seed": cell["seed"],
            "cell_status": status,
            "stage": result.get("stage", ""),
            "device": device.get("gpu_name") or device.get("device") or "",
            "gpu_uuid": device.get("gpu_uuid") or "",
            "node_id": result.get("node_id") or "",
            "hostname": result.get("hostname") or "",
            "git_commit": device.get("git_commit") or result.get("git_commit") or "",
            "score_metric": result.get("score_metric") or "",
            "sweep": cell.get("sweep", ""),
        }
        if status != "finished":
            tags["error"] = (result.get("error") or "unknown error")[:5000]
        if self.parent_run_id:
            tags[MLFLOW_PARENT_RUN_ID] = self.parent_run_id
        run = self.client.create_run(self.experiment_id, tags=_str_tags(tags), run_name=f"{cell['label']}|{cell['dataset']['name']}|s{cell['seed']}")
        run_id = run.info.run_id
        self._log_params(run_id, flatten(cell["config"]))
        self._log_metrics(run_id, result.get("metrics") or {})
        self.client.log_dict(run_id, dict(cell["config"]), "cell_config.yaml")
        if result.get("records"):
            lines = "\n".join(json.dumps(r, default=str) for r in result["records"])
            self.client.log_text(run_id, lines + "\n", "samples.jsonl")
        if result.get("scores"):
            self.client.log_text(run_id, json.dumps(result["scores"], indent=1, default=str), "scores.json")
        summary = {k: result.get(k) for k in ("status", "error", "stage", "stages", "summary", "energy", "idle", "warmup", "device", "settings", "node_id", "hostname", "perplexity")}
        self.client.log_text(run_id, json.dumps(summary, indent=1, default=str), "result.json")
        if result.get("traceback"):
            self.client.log_text(run_id, result["traceback"], "traceback.txt")
        self.client.set_terminated(run_id, "FINISHED" if status == "finished" else "FAILED")
        self.supersede(cell["key"], keep=run_id)
        return run_id

    def supersede(self, key: str, keep: str) -> list[str]:
        """Tag and delete every other active failed run of ``key``; returns their ids."""
        gone = []
        for run_id in self.failed_runs().get(key, []):
            if run_id == keep:
                continue
            self.client.set_tag(run_id, "superseded_by", keep)
            self.client.delete_run(run_id)
            gone.append(run_id)
        return gone

    def _log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(str(k)[:250], _param_value(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):  # log_batch takes at most 100 params per call
            self.client.log_batch(run_id, params=items[i : i + 100])

    def _log_metrics(self, run_id: str, metrics: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

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
CELL_FINISHED = "finished"
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
