"""The typed cell of a sweep and its result: what the planner builds, an actor runs and the driver logs.

    Cell        one point of the grid (method, pair, dataset slice, seed), resolved and validated
    CellResult  what ``pipeline.cell.run_cell`` (or ``rescore``) returns for a cell

Data only, no behaviour beyond views of the fields: both pickle across Ray. They live here, apart
from ``pipeline/cell.py`` (the executor: torch, Ray, models; it re-exports them), because the layers
below and beside the executor name them: the planner (``pipeline.sweep.plan``) builds cells without
importing the executor, and the MLflow layer (``pipeline.tracking``, a layer below the cells) logs
a cell and its result. This module imports nothing of the project.

A cell's configuration groups (``pair``, ``dataset``, ``measure``, ``judge``) stay the resolved config
mappings that the loaders take (``PairSpec.from_config``, ``load_slice``); the MLflow params and
``cell_config.yaml`` of a cell are ``Cell.config``, computed from the fields (the MLflow layout of
docs/DESIGN.md section 7).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

# The outcome of a cell (``CellResult.status``; MLflow tag ``cell_status``, see pipeline/tracking/layout.py,
# which adds ``logging`` for a run whose write is not complete).
STATUS_FINISHED = "finished"  # every stage ran (scores included where the dataset has a scorer)
STATUS_SCORE_FAILED = "score_failed"  # generations and measurements kept; scoring/judging to redo
STATUS_FAILED = "failed"  # a stage raised, the actor died or timed out, or logging failed

KEY_LENGTH = 12


def cell_key(identity: Mapping[str, Any]) -> str:
    """Short stable hash of a cell's resolved identity (canonical JSON, sorted keys): ``Cell.key``.

    The identity is what the planner puts in it (``pipeline.sweep.plan``); the same identity gives the
    same key in every process, so resume finds a cell's runs by it (MLflow tag ``cell_key``).
    """
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def batch_label(label: str, batch_size: int) -> str:
    """A sweep entry's label at a batch size: ``spd`` at batch 1 (as before batching), ``spd (batch 4)`` above."""
    return label if batch_size == 1 else f"{label} (batch {batch_size})"


def split_batch_label(label: str) -> tuple[str, int]:
    """``batch_label``'s inverse: ``("spd", 4)`` from ``spd (batch 4)``, ``(label, 1)`` from a batch-1 label."""
    head, sep, tail = label.rpartition(" (batch ")
    if sep and tail.endswith(")") and tail[:-1].isdigit():
        return head, int(tail[:-1])
    return label, 1


def temperature_label(label: str, temperature: float | None) -> str:
    """A sweep entry's label on a temperature axis (``sweep.temperatures``): ``spd (T=0.7)``; unchanged without one."""
    return label if temperature is None else f"{label} (T={temperature:g})"


def split_temperature_label(label: str) -> tuple[str, float | None]:
    """``temperature_label``'s inverse on a label's head (a batch or rate suffix after it is dropped):
    ``("spd", 0.7)`` from ``spd (T=0.7) (batch 4) @ 2/s``, ``(label, None)`` without one."""
    head = split_batch_label(label.split(" @ ")[0])[0]
    base, sep, tail = head.rpartition(" (T=")
    if sep and tail.endswith(")"):
        try:
            return base, float(tail[:-1])
        except ValueError:
            pass
    return head, None


@dataclass(frozen=True)
class Cell:
    """One cell of a sweep, as ``pipeline.sweep.plan.expand`` builds it (frozen: change with
    ``dataclasses.replace``)."""

    key: str
    """Hash of the cell's identity (``cell_key``): what resume and the MLflow tag ``cell_key`` use."""
    sweep: str
    """Name of the sweep that planned it (MLflow experiment by default)."""
    label: str
    """The sweep entry's label, unique per method configuration (``mtad(tau=0.3)``)."""
    method: str
    """The method's registry name (``pipeline.decoding.METHODS``)."""
    params: dict[str, Any]
    """The method's parameters, resolved and checked (``check_method``): what ``build_decoder`` takes."""
    method_config: str
    """The ``conf/method/<name>.yaml`` the entry came from."""
    pair: dict[str, Any]
    """The pair's resolved config (``PairSpec.from_config`` reads it)."""
    dataset: dict[str, Any]
    """The dataset slice's resolved config (``DATASET_KEYS`` plus ``config_path``, the path as configured;
    ``path`` is absolute): what ``load_slice`` takes."""
    seed: int
    """Sampling seed of the measured window."""
    measure: dict[str, Any]
    """The measurement protocol (``measure:`` of the config: warm-up, idle power, meters, threads)."""
    hardware: str
    """The accelerator type the cell is measured on (``cluster.accelerator_type``) or ``any``."""
    harness: str
    """``HARNESS_VERSION`` the cell was planned under (part of its key; param ``harness_version``)."""
    batch_size: int = 1
    """Requests decoded together (``decoding/batched.py``; 1: one at a time, every method's setting): part of its
    key."""
    workload: dict[str, Any] | None = None
    """How requests reach the engine (``pipeline.measure.workload.Workload.to_dict``, conf/workload/): None offline
    (every request queued when the window opens). Part of its key when set, so an offline cell keeps its key."""
    weights: dict[str, str] = field(default_factory=dict)
    """Content fingerprints of the local weights the cell reads, by role (``target``, ``draft``, ``eagle``,
    ``medusa``; ``pipeline.fingerprints.weights_identity``): part of its key; params ``weights.*``."""
    judge: dict[str, Any] | None = None
    """The judge config that scores the cell (MT-Bench with ``judge.enabled`` only), else None."""
    baseline: bool = False
    """True for the sweep's baseline cells (the speedup's denominator)."""
    fault: Any = None
    """Test-only fault injection (``fault_injection``: a mapping or a list, see ``pipeline.faults.inject_fault``)."""
    isolation: dict[str, Any] | None = None
    """CPU isolation the runner gives the cell (``mode``, ``threads``, ``cores``); None until scheduled."""
    precision: dict[str, Any] = field(default_factory=dict)
    """The pair's precision as planned on this machine (``PairSpec.precision(predicted=True)``): part of the key."""

    @property
    def identity(self) -> dict[str, Any]:
        """What the cell's key is the hash of (``cell_key(cell.identity) == cell.key`` for a planned cell), the one
        definition: the harness, the method and its resolved parameters, the pair (not its device), the slice as
        configured (not where the data lives; its task by version only, from version 2 on, so that the keys of
        sweeps planned before task specs stay what they were), the seed, the batch size (HARNESS_VERSION 5), the
        measurement protocol, the hardware, the precision and the weights' fingerprints, and a workload where one is
        set (absent offline: the keys of sweeps planned before workloads stay what they were). The judge scores the
        generations, it does not change them:
        None (a judge change re-judges the logged generations)."""
        dataset = {k: v for k, v in self.dataset.items() if k not in ("path", "task")}
        version = (self.dataset.get("task") or {}).get("version", 1)
        if version != 1:
            dataset["task_version"] = version
        identity = {
            "harness": self.harness,
            "method": {"name": self.method, "params": self.params},
            "pair": {k: v for k, v in self.pair.items() if k != "device"},
            "dataset": dataset,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "measure": dict(self.measure),
            "judge": None,
            "hardware": self.hardware,
            "precision": self.precision,
            "weights": self.weights,
        }
        if self.workload is not None:
            identity["workload"] = dict(self.workload)
        return identity

    @property
    def config_key(self) -> str:
        """The hash of the identity without the seed: cells that differ only in their seed share it, and any other
        input of the key (a ``measure.*`` setting, the hardware, the weights...) gives another. Tag ``config_key``:
        what the analysis pools over seeds by, so that it cannot drift from the key."""
        return cell_key({k: v for k, v in self.identity.items() if k != "seed"})

    @property
    def dataset_name(self) -> str:
        return str(self.dataset["name"])

    @property
    def pair_name(self) -> str:
        return str(self.pair["name"])

    @property
    def config(self) -> dict[str, Any]:
        """What MLflow records of the cell: its params (flattened) and ``cell_config.yaml``."""
        return {
            "cell_key": self.key,
            "sweep": self.sweep,
            "label": self.label,
            "method": {"name": self.method, "config": self.method_config, **self.params},
            "pair": self.pair,
            "dataset": self.dataset,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "measure": self.measure,
            "judge": self.judge,
            "hardware": self.hardware,
            "harness_version": self.harness,
            "weights": self.weights,
            **({"workload": self.workload} if self.workload is not None else {}),
        }

    def describe(self) -> str:
        """``label pair dataset seed=N [key]``, for messages."""
        batch = f" batch_size={self.batch_size}" if self.batch_size != 1 else ""
        load = f" workload={self.workload.get('kind')}" if self.workload else ""
        return f"{self.label} {self.pair_name} {self.dataset_name} seed={self.seed}{batch}{load} [{self.key}]"


@dataclass
class CellResult:
    """The outcome of one cell, filled stage by stage by ``run_cell`` (only the driver writes it to MLflow)."""

    cell_key: str
    """The cell's key."""
    status: str = STATUS_FAILED
    """``STATUS_FINISHED``, ``STATUS_SCORE_FAILED`` or ``STATUS_FAILED`` (the default until every stage ran)."""
    stage: str = "start"
    """The stage reached: ``load``, ``generate``, ``costs``, ``perplexity``, ``score``, ``done``; ``actor``
    when the actor died or timed out (tag ``stage``)."""
    stages: dict[str, float] = field(default_factory=dict)
    """Seconds per stage (metrics ``stage_<name>_s``)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """The cell's metrics (``WindowResult.summary``, step costs, perplexity, score, stage times, wall time)."""
    records: list[dict[str, Any]] = field(default_factory=list)
    """One record per generation (``GenerationRecord.to_dict`` with perplexity and ``score_detail``):
    ``samples.jsonl``."""
    scores: dict[str, Any] | None = None
    """The scorer's result (``scores.json``); None without a scorer, before scoring or when it failed."""
    score_metric: str | None = None
    """``pass@1``, ``execution_accuracy``, ``rougeL``, ... ; ``speed_only``, ``none`` or ``pending`` (tag
    ``score_metric``)."""
    judge_identity: dict[str, Any] | None = None
    """The judge that scored the cell (tag ``judge``), None without one."""
    summary: dict[str, Any] | None = None
    """``WindowResult.summary()`` of the measured window (``result.json``)."""
    energy: dict[str, Any] | None = None
    """Energy reading of the window with its meter, or why it is unavailable (``result.json``)."""
    idle: dict[str, Any] | None = None
    """Idle power measured before the window (``result.json``)."""
    warmup: dict[str, Any] | None = None
    """What the warm-up ran (``result.json``)."""
    device: dict[str, Any] | None = None
    """Machine, device, library versions and git commit (tags ``device``, ``gpu_uuid``, ``git_commit``)."""
    settings: dict[str, Any] | None = None
    """Decoding settings of the window (``result.json``)."""
    isolation: dict[str, Any] | None = None
    """CPU isolation applied (params ``isolation.*``, tag ``cpu_isolation``)."""
    node_id: str | None = None
    """Ray node that ran the cell (tag ``node_id``)."""
    hostname: str | None = None
    pid: int | None = None
    error: str | None = None
    """``Type: message`` of the failure (tag ``error``), None when finished."""
    traceback: str | None = None
    """Full traceback of the failure (``traceback.txt``)."""
    started_at: float | None = None
    """Wall-clock (epoch seconds) when the cell began: its MLflow run's start time, so the runs table's
    *Created* and *Duration* columns show the cell's own time, not the moment it was logged."""
    ended_at: float | None = None
    """Wall-clock (epoch seconds) when the cell ended: its MLflow run's end time."""
    speculation_profile: dict[str, Any] | None = None
    """The cell's acceptance as specdec_bench's ``speculation_profile.json`` (``pipeline.measure.acceptance``); None
    for a method that drafts nothing."""

    @property
    def finished(self) -> bool:
        return self.status == STATUS_FINISHED
