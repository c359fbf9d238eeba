"""The MLflow layout of a sweep, named once: tags, params, metrics and artifacts of its runs.

The writer (``pipeline.tracking.tracker``), the driver, the report and ``analysis/`` (through
``analysis.schema``) use these names; no other module writes an MLflow name as a literal.

- One experiment per sweep name (tagged ``EXPERIMENT_KIND_TAGS``); one parent run per invocation
  (``TAG_KIND=KIND_SWEEP``); one nested run per cell (``TAG_KIND=KIND_CELL``, MLflow's parent tag).
- A cell run: the tags ``CELL_TAGS`` (plus ``PRECISION_TAGS`` when known, ``TAG_ERROR`` when not
  finished, ``TAG_JUDGE``), the flattened ``Cell.config`` as params (``flatten``), the cell's numeric
  metrics (``numeric_metrics``; the ones a reader compares: ``COMPARED_METRICS``) and the artifacts
  ``SAMPLES_ARTIFACT``, ``CONFIG_ARTIFACT``, ``RESULT_ARTIFACT`` (``RESULT_FIELDS`` of the result),
  ``SCORES_ARTIFACT``, ``PROFILE_ARTIFACT`` (methods that draft) and, for failures, ``TRACEBACK_ARTIFACT``.
- ``TAG_STATUS`` is a ``CellResult.status`` (``STATUS_FINISHED``, ``STATUS_SCORE_FAILED``,
  ``STATUS_FAILED``, defined with the result in ``pipeline/cell_types.py``) or ``STATUS_LOGGING``
  while the run is being written.

Stores written before this module existed use the same names (tests/test_store_compat.py reads one).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping

from pipeline.cell_types import STATUS_FAILED as STATUS_FAILED
from pipeline.cell_types import STATUS_FINISHED as STATUS_FINISHED
from pipeline.cell_types import STATUS_SCORE_FAILED as STATUS_SCORE_FAILED
from pipeline.cell_types import Cell
from pipeline.scoring.registry import scorer_for

# ------------------------------------------------------------------------------- experiment
# MLflow 3's UI reads this experiment tag to tell model-training experiments (runs table, charts,
# compare view) from GenAI ones (traces/overview): a sweep is the former.
EXPERIMENT_KIND_TAGS = {"mlflow.experimentKind": "custom_model_development"}
# The runs table's saved view of a sweep (``#/experiments/<id>/runs?viewStateShareKey=sweep``): an
# experiment tag holding the UI's view state (what its *Share* button writes); see analysis.report.
VIEW_KEY = "sweep"
VIEW_STATE_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"

# ------------------------------------------------------------------------------- run kinds
TAG_KIND = "kind"  # every run: KIND_CELL (one per cell) or KIND_SWEEP (the parent run of an invocation)
KIND_CELL = "cell"
KIND_SWEEP = "sweep"

# ------------------------------------------------------------------------------- cell run tags
TAG_CELL_KEY = "cell_key"
TAG_METHOD = "method"
TAG_LABEL = "label"
TAG_PAIR = "pair"
TAG_DATASET = "dataset"
TAG_SEED = "seed"
TAG_STATUS = "cell_status"
TAG_STAGE = "stage"
TAG_DEVICE = "device"
TAG_GPU_UUID = "gpu_uuid"
TAG_NODE = "node_id"
TAG_HOSTNAME = "hostname"
TAG_GIT_COMMIT = "git_commit"  # HEAD, <HEAD>+dirty or unknown (pipeline.device.git_commit)
TAG_CODE_HASH = "code_hash"  # sha256 of pipeline/ (pipeline.device.code_hash): the code where the commit is not
TAG_SCORE_METRIC = "score_metric"
TAG_SWEEP = "sweep"  # cell runs and parent runs
TAG_JUDGE = "judge"  # the judge identity (JSON) that scored the cell; "" without one
TAG_CPU_ISOLATION = "cpu_isolation"
TAG_CONFIG_KEY = (
    "config_key"  # Cell.config_key: the hash of the cell's identity without its seed (what seeds pool over)
)
TAG_ERROR = "error"  # cells that did not finish
TAG_RESCORED_AT = "rescored_at"  # a cell scored again from its logged generations
TAG_SUPERSEDED_BY = "superseded_by"  # a failed run replaced by a newer run of its key (then deleted)
TAG_CLOSED_AS_STALE = "closed_as_stale"  # a run left RUNNING by a driver that is gone
# what the analysis reads of a cell's scorer, per run (so a `module:attr` scorer reads as a registered one does):
# the field of a record's score_detail that is the sample's score (Scorer.sample_value) and the direction of the score
# ("1": higher is better, "-1": lower; Scorer.higher_is_better); "" for a cell without a scorer
TAG_SCORE_SAMPLE_VALUE = "score_sample_value"
TAG_SCORE_DIRECTION = "score_direction"
CELL_TAGS = (
    TAG_CELL_KEY,
    TAG_METHOD,
    TAG_LABEL,
    TAG_PAIR,
    TAG_DATASET,
    TAG_SEED,
    TAG_STATUS,
    TAG_STAGE,
    TAG_DEVICE,
    TAG_GPU_UUID,
    TAG_NODE,
    TAG_HOSTNAME,
    TAG_GIT_COMMIT,
    TAG_CODE_HASH,
    TAG_SCORE_METRIC,
    TAG_SCORE_SAMPLE_VALUE,
    TAG_SCORE_DIRECTION,
    TAG_SWEEP,
    TAG_CONFIG_KEY,
)
# what the models ran in (pipeline.models.LoadedPair.precision), tags of the same names
PRECISION_TAGS = ("cpu_bf16", "cpu_bf16_flags", "target_dtype", "target_kernels", "draft_dtype", "draft_kernels")
# a cell run's outcome while its run is being written (never taken as an outcome by resume)
STATUS_LOGGING = "logging"

# ------------------------------------------------------------------------------- parent run tags
TAG_HEARTBEAT = "heartbeat"  # epoch seconds, refreshed while the driver lives
TAG_DRIVER_PID = "driver_pid"
TAG_DRIVER_HOST = "driver_host"
TAG_REPORT = "report"  # set by analysis.report when it logged its figures and tables to the parent
TAG_CLUSTER = "cluster"  # the cluster kind the invocation ran on (conf/cluster)
TAG_RAY_ADDRESS = "ray_address"  # the Ray address, "local" for a local Ray
TAG_COMMAND = "command"  # the command line of the invocation


def parent_tags(sweep: str, cluster: Mapping[str, Any], command: str) -> dict[str, Any]:
    """A parent run's tags (besides ``TAG_KIND``, the heartbeat and the driver's pid and host, which the tracker
    adds)."""
    return {
        TAG_SWEEP: sweep,
        TAG_CLUSTER: cluster.get("kind"),
        TAG_RAY_ADDRESS: cluster.get("address") or "local",
        TAG_COMMAND: command,
    }


def parent_params(sweep: str, cluster: Mapping[str, Any], total: int, to_run: int, to_rescore: int) -> dict[str, Any]:
    """A parent run's params: the plan's size and what this invocation set out to do."""
    return {
        "sweep.name": sweep,
        "cells.total": total,
        "cells.to_run": to_run,
        "cells.to_rescore": to_rescore,
        "cluster.kind": cluster.get("kind"),
        "cluster.cpu_isolation": cluster.get("cpu_isolation"),
    }


METRIC_UNSAFE = re.compile(r"[^0-9A-Za-z_\-./ ]")  # characters MLflow refuses in a metric name


def parent_metrics(total: int, outcome: Mapping[str, Any], wall_s: float) -> dict[str, float]:
    """A parent run's metrics when it ends: what became of the cells (``outcome`` is the driver's tally)."""
    return {
        "cells_total": total,
        "cells_ran": outcome["ran"],
        "cells_finished": outcome["finished"],
        "cells_failed": outcome["failed"],
        "cells_rescored": outcome["rescored"],
        "cells_elsewhere": outcome["elsewhere"],
        "wall_s": wall_s,
    }


# ------------------------------------------------------------------------------- params
PARAM_VALUE_LIMIT = 6000  # MLflow's limit on a param value (characters)
PARAM_KEY_LIMIT = 250
ISOLATION_PARAM = "isolation"  # params isolation.* : the CPU isolation a cell ran under
# a cell's params are ``flatten(Cell.config)``: cell_key, sweep, label, method.*, pair.*, dataset.* (dataset.task.*
# included), seed, measure.*, judge.*, hardware, harness_version, weights.* (content fingerprints of the local
# weights the cell reads: target, draft, eagle, medusa); the pair's config is under this prefix
PARAM_PAIR_PREFIX = "pair."

# ------------------------------------------------------------------------------- metrics
# A cell's metrics are its ``CellResult.metrics`` (pipeline.measure.records' window summary, step costs, perplexity,
# score, stage times). The ones a reader compares across cells, in the order the runs table shows them:
METRIC_TOKENS_PER_S = "tokens_per_s"  # new tokens / decode time (the main speed column)
METRIC_ACCEPTED_PER_STEP = "accepted_per_step"  # new tokens / target forward passes (bonus included)
METRIC_PERPLEXITY = "perplexity"
METRIC_SCORE = "score"
METRIC_J_PER_TOKEN = "j_per_token"
METRIC_DECODE_S = "decode_s"
# tokens/s over the baseline cell of the same pair, dataset, seed and device; added to finished cells by analysis.report
METRIC_SPEEDUP = "speedup"
COMPARED_METRICS = (
    METRIC_TOKENS_PER_S,
    METRIC_SPEEDUP,
    METRIC_ACCEPTED_PER_STEP,
    METRIC_PERPLEXITY,
    METRIC_SCORE,
    METRIC_J_PER_TOKEN,
    METRIC_DECODE_S,
)
# parent run metrics written by analysis.report: f"{SPEEDUP_PREFIX}<dataset>.<label>" (mean over seeds)
SPEEDUP_PREFIX = "speedup."

# ------------------------------------------------------------------------------- artifacts
SAMPLES_ARTIFACT = "samples.jsonl"  # one record per generation (measure.GenerationRecord.to_dict + verdicts)
RESULT_ARTIFACT = "result.json"
SCORES_ARTIFACT = "scores.json"
CONFIG_ARTIFACT = "cell_config.yaml"
TRACEBACK_ARTIFACT = "traceback.txt"
PROFILE_ARTIFACT = "speculation_profile.json"  # NVIDIA specdec_bench's acceptance profile (pipeline.measure.acceptance)
SCORE_DETAIL_FIELD = "score_detail"  # a SAMPLES_ARTIFACT record's verdicts (its task's `score_fields`)
# The fields of a CellResult written to RESULT_ARTIFACT.
RESULT_FIELDS = (
    "status",
    "error",
    "stage",
    "stages",
    "summary",
    "energy",
    "idle",
    "warmup",
    "device",
    "settings",
    "node_id",
    "hostname",
)


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"a.b": 1, "c": "[1, 2]"}`` (lists kept as JSON text): params."""
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
    """The finite numbers of a flat mapping (bools as 0/1); None, NaN and text are left out: metrics."""
    out = {}
    for k, v in values.items():
        if isinstance(v, bool):
            out[k] = float(v)
        elif isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[k] = float(v)
    return out


def param_value(v: Any) -> str:
    """A param's text: ``null`` for None, JSON booleans, else ``str``; cut at MLflow's limit."""
    text = "null" if v is None else (json.dumps(v) if isinstance(v, bool) else str(v))
    return text[:PARAM_VALUE_LIMIT]


def str_tags(tags: Mapping[str, Any]) -> dict[str, str]:
    """Tag values as text; None leaves the tag out."""
    return {k: str(v) for k, v in tags.items() if v is not None}


def scorer_tags(cell: Cell) -> dict[str, str]:
    """What the analysis reads of the cell's scorer, logged with its run: the record field that is a sample's score
    and the score's direction (``TAG_SCORE_SAMPLE_VALUE``, ``TAG_SCORE_DIRECTION``; empty without a scorer)."""
    scorer = scorer_for((cell.dataset.get("task") or {}).get("scorer"))
    if scorer is None:
        return {TAG_SCORE_SAMPLE_VALUE: "", TAG_SCORE_DIRECTION: ""}
    direction = "1" if scorer.higher_is_better else "-1"
    return {TAG_SCORE_SAMPLE_VALUE: scorer.sample_value or "", TAG_SCORE_DIRECTION: direction}
