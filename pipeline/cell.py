"""One cell of a sweep: (method, pair, dataset slice, seed), run by one Ray actor in stages.

    result = run_cell(cell)            # in-process (tests, debugging)
    actor = ray.remote(CellActor).options(num_gpus=1).remote(); ray.get(actor.run.remote(cell))

``cell`` is a ``Cell`` that ``pipeline.sweep.plan`` builds; the result a ``CellResult`` (status, metrics,
per-generation records, scorer details, device, stage times, error and traceback); both are defined in
``pipeline/cell_types.py`` and re-exported here. Only the driver writes to MLflow (docs/DESIGN.md section 7).

Stages (docs/DESIGN.md section 1), each timed in ``result.stages``:

1. ``load``: the pair and the decoder; the dataset slice plus warm-up samples from outside it.
2. ``generate``: ``pipeline.measure.window.run_window`` (warm-up, idle power, one window over the slice); the cost
   model and the time breakdown (``measure.costs.cost_model``) are read off the loop's own clock over it.
3. ``perplexity``: teacher-forced pass of the unwarped target over prompt + generated ids.
4. ``score``: the scorer of the cell's task (``task.scorer`` in ``conf/dataset/<name>.yaml``: HumanEval
   sandbox, Spider execution, ROUGE, the MT-Bench judge...); a scorer that needs the judge scores only
   with ``judge.enabled`` (otherwise the cell is measured for speed only). The task's ``score_fields``
   are copied from the scorer's per-sample details onto the generation records.

A failure in ``score`` keeps everything measured before it: the result is ``status: score_failed``
with the metrics and the generation records, so the driver logs them and a later invocation re-scores
the logged generations (``rescore``) instead of generating again.

CPU isolation (``cell.isolation``, set by the driver's scheduler and recorded with the cell) is applied by
``pipeline.isolation.apply_isolation``; test-only fault injection (``fault_injection``) is ``pipeline.faults``.

Any exception (CUDA out of memory included) is caught and returned as ``status: failed`` with its
traceback and the stage it happened in; an actor that dies is recorded as failed by the driver.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any, Iterator, Mapping, Sequence

import torch

from pipeline.cell_types import STATUS_FAILED, STATUS_FINISHED, STATUS_SCORE_FAILED, Cell, CellResult
from pipeline.data.slices import load_slice, task_of
from pipeline.data.tasks import TaskSpec
from pipeline.decoding import build_decoder, method_args
from pipeline.decoding.batched import check_batch
from pipeline.decoding.kv import CachedModel
from pipeline.faults import inject_fault
from pipeline.isolation import apply_isolation
from pipeline.measure.acceptance import checkpoint_id, speculation_profile
from pipeline.measure.costs import probe_step_ms
from pipeline.measure.energy import make_energy_meter
from pipeline.measure.records import Protocol, predictions, predictions_for_scoring, request_metrics
from pipeline.measure.window import run_window
from pipeline.measure.workload import Workload
from pipeline.models import PairSpec, load_pair
from pipeline.prompts import eos_ids
from pipeline.scoring.perplexity import pairs_from_records, perplexity
from pipeline.scoring.registry import scorer_for
from pipeline.tracking.layout import SCORE_DETAIL_FIELD

__all__ = [
    "Cell",
    "CellActor",
    "CellResult",
    "apply_isolation",
    "inject_fault",
    "judge_identity",
    "predictions_from_records",
    "prepare_pair",
    "rescore",
    "run_cell",
    "score_cell",
]


def _node_id() -> str | None:
    """The Ray node this runs on; None outside Ray. Ray is not imported here: a Ray actor has imported it already,
    and ``run_cell`` in-process (the bench, a GPU image without Ray) needs none."""
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - outside Ray
        pass
    return None


@contextmanager
def _stage(result: CellResult, name: str) -> Iterator[None]:
    result.stage = name
    t0 = time.perf_counter()
    try:
        yield
    finally:
        result.stages[name] = round(time.perf_counter() - t0, 4)


def score_cell(
    dataset: Mapping[str, Any],
    samples: list[Any],
    predictions: list[dict[str, Any]],
    judge_cfg: Mapping[str, Any] | None,
    max_turns: int | None,
    task: TaskSpec | None = None,
) -> dict[str, Any] | None:
    """The task's downstream score (its scorer's result dict), or None where there is none to compute."""
    task = task or task_of(dataset)
    scorer = scorer_for(task.scorer)
    if scorer is None:
        return None
    return scorer.score(dataset, samples, predictions, judge=judge_cfg, max_turns=max_turns, **task.scorer_params)


def predictions_from_records(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``records.predictions_for_scoring`` from logged record dicts (samples.jsonl) instead of a window."""
    return predictions(records)


def judge_identity(cell: Cell) -> dict[str, Any] | None:
    """Who scores this cell (None: no judge), as its task's scorer records it on the run (tag ``judge``).
    The planner gives a cell a judge only when its task's scorer uses one."""
    scorer = scorer_for(task_of(cell.dataset).scorer)
    if scorer is None or not (cell.judge or {}).get("enabled"):
        return None
    return scorer.identity(cell.judge)


def _score_stage(
    result: CellResult,
    cell: Cell,
    dataset: Mapping[str, Any],
    samples: list[Any],
    predictions: list[dict[str, Any]],
    records: list[dict[str, Any]],
    metrics: dict[str, Any],
) -> None:
    """Stage ``score``: scores onto metrics/records; a failure marks the result ``score_failed`` (never raises)."""
    result.judge_identity = judge_identity(cell)
    task = task_of(dataset)
    scores = None
    try:
        with _stage(result, "score"):
            inject_fault(cell, "score")
            scores = score_cell(dataset, samples, predictions, cell.judge, dataset.get("max_turns"), task)
    except Exception as err:  # noqa: BLE001 - the generations are kept; only the score is missing
        result.status = STATUS_SCORE_FAILED
        result.error = f"score stage: {type(err).__name__}: {err}"
        result.traceback = traceback.format_exc()
        result.score_metric = "pending"
        return
    result.status = STATUS_FINISHED
    result.scores = scores
    if scores is not None:
        metrics["score"] = scores.get("score", float("nan"))
        result.score_metric = scores.get("metric")
        _attach_scores(records, scores, task.score_fields)
    else:
        scorer = scorer_for(task.scorer)
        result.score_metric = scorer.unscored_metric() if scorer is not None else "none"


def rescore(cell: Cell, records: list[dict[str, Any]]) -> CellResult:
    """Score a cell's logged generations again (no model of the pair loads): status, metrics, records, scores.

    ``records`` are the cell's ``samples.jsonl`` records; the result has ``status`` (``finished`` or
    ``score_failed``), ``metrics`` (``score``, ``stage_score_s``), the records with their verdicts, ``scores``.
    """
    dataset = dict(cell.dataset)
    result = CellResult(cell_key=cell.key, status=STATUS_SCORE_FAILED)
    samples, _, _ = load_slice(dataset)
    records = [{k: v for k, v in r.items() if k != SCORE_DETAIL_FIELD} for r in records]
    metrics: dict[str, Any] = {}
    _score_stage(result, cell, dataset, samples, predictions_from_records(records), records, metrics)
    metrics.update({f"stage_{k}_s": v for k, v in result.stages.items()})
    return replace(result, metrics=metrics, records=records)


def run_cell(cell: Cell) -> CellResult:
    """Run every stage of one cell; never raises (failures come back as ``status: failed``)."""
    t_start = time.perf_counter()
    result = CellResult(
        cell_key=cell.key,
        status=STATUS_FAILED,
        stage="start",
        node_id=_node_id(),
        hostname=socket.gethostname(),
        pid=os.getpid(),
        started_at=time.time(),
    )
    try:
        protocol = Protocol.from_config(cell.measure)
        dataset = dict(cell.dataset)
        task = task_of(dataset)
        iso = dict(cell.isolation or {})
        if protocol.threads:
            iso["threads"] = int(protocol.threads)  # an explicit setting wins over the scheduler's
        result.isolation = apply_isolation(iso)
        with _stage(result, "load"):
            inject_fault(cell, "load")
            spec = PairSpec.from_config(cell.pair)
            pair = load_pair(spec)
            precision = pair.precision()
            decoder = build_decoder(
                cell.method, pair.target, pair.draft, assets=pair.assets, args=method_args(cell.method, cell.params)
            )  # validated in the plan
            check_batch(type(decoder), decoder.config, int(cell.batch_size))
            samples, warm, _ = load_slice(dataset, warmup_samples=protocol.warmup_samples)
            device = next(pair.target.parameters()).device
            meter = make_energy_meter(device, protocol.energy_meter)
        with _stage(result, "generate"):
            inject_fault(cell, "generate")
            window = run_window(
                decoder,
                samples,
                batch_size=int(cell.batch_size),
                tokenizer=pair.tokenizer,
                formatter=partial(_format, task, pair.tokenizer, spec.chat),
                eos_token_ids=eos_ids(pair.tokenizer, pair.target),
                max_new_tokens=int(dataset["max_new_tokens"]),
                seed=int(cell.seed),
                device=device,
                meter=meter,
                warmup_samples=warm,
                warmup_generations=int(protocol.warmup_generations),
                warmup_seconds=float(protocol.warmup_seconds),
                idle_seconds=float(protocol.idle_seconds),
                time_budget_s=dataset.get("time_budget_s"),
                stop_strings=task.stops(spec.chat),
                max_turns=dataset.get("max_turns"),
                probe=partial(probe_step_ms, _target_model(decoder, pair), device) if protocol.costs else None,
                workload=Workload.from_dict(cell.workload) if cell.workload else None,
            )
        summary = window.summary()
        metrics: dict[str, Any] = dict(summary)
        metrics.update(request_metrics(window.records), batch_size=int(cell.batch_size))
        caps = decoder.capabilities  # what the configured method drafts (typical with tree: true drafts trees)
        if caps.draft_shape != "none":
            metrics.update(draft_depth=decoder.draft_depth, tree_draft=float(caps.draft_shape == "tree"))
        # the cost model and time breakdown (t_target_step_ms, cost_ratio_c, row_cost_v, time_*_s, step_drift...)
        # come with the summary: read off the loop's own clock over the window (WindowResult.costs)
        records = [r.to_dict() for r in window.records]
        declared = type(decoder)
        profile = speculation_profile(
            window.records,
            method=cell.method,
            verification_method=declared.verification_method,
            prefix_drafts=declared.prefix_drafts,
            num_speculative_tokens=decoder.draft_depth,
            target_model={"id": checkpoint_id(spec.target.id)},
            draft_checkpoint={"id": checkpoint_id(spec.draft.id)} if spec.draft else None,
            measurement_conditions={
                "dataset": cell.dataset_name,
                "seed": cell.seed,
                "device": window.device.get("gpu_name") or str(device),
                "batch_size": int(cell.batch_size),
                "label": cell.label,
            },
        )
        if profile is not None:  # the loop's clock, iteration by iteration (the window's, then the warm-up's)
            profile["iterations"] = [it.to_dict() for it in window.iterations]
            profile["calibration_iterations"] = [it.to_dict() for it in window.calibration]
        if protocol.perplexity:
            with _stage(result, "perplexity"):
                ppl = perplexity(pair.target, pairs_from_records(records)[0])
            metrics["perplexity"] = ppl["score"]
            for rec, per in zip(records, ppl["per_sample"]):
                rec["perplexity"] = per["perplexity"]
        del decoder, pair
        if protocol.score:
            _score_stage(result, cell, dataset, samples, predictions_for_scoring(window), records, metrics)
        else:
            result.status, result.scores, result.score_metric = STATUS_FINISHED, None, "none"
        if device.type == "cuda":
            torch.cuda.empty_cache()
        metrics["cell_wall_s"] = time.perf_counter() - t_start
        metrics.update({f"stage_{k}_s": v for k, v in result.stages.items()})
        info = window.to_dict()
        result = replace(
            result,
            stage="done" if result.finished else "score",
            metrics=metrics,
            records=records,
            summary=summary,
            energy=info["energy"],
            idle=info["idle"],
            warmup=info["warmup"],
            device={**info["device"], **precision},
            settings=info["settings"],
            speculation_profile=profile,
        )
    except Exception as err:  # noqa: BLE001 - every failure becomes a record (OOM included)
        result.status = STATUS_FAILED
        result.error = f"{type(err).__name__}: {err}"
        result.traceback = traceback.format_exc()
        result.metrics = {"cell_wall_s": time.perf_counter() - t_start}
    result.ended_at = time.time()
    return result


def _target_model(decoder: Any, pair: Any) -> Any:
    """The target model the decoder runs (its cache's model where it has one): what the machine probe times."""
    target = getattr(decoder, "target", None)
    return target.model if isinstance(target, CachedModel) else pair.target


def _format(task: TaskSpec, tokenizer: Any, chat: bool, sample: Any, turn: int, answers: Any) -> Any:
    """``run_window``'s formatter: the cell's task formats its prompts."""
    return task.format(sample, tokenizer, chat=chat, turn=turn, answers=answers)


def _attach_scores(records: list[dict[str, Any]], scores: Mapping[str, Any], fields: tuple[str, ...]) -> None:
    """Copy the task's per-sample ``fields`` of the scorer's details (HumanEval ``passed``, Spider ``correct``,
    judge ``score``...) onto the records, as ``score_detail``."""
    details = scores.get("details") or []
    by_id: dict[str, list[Mapping[str, Any]]] = {}
    for d in details:
        by_id.setdefault(str(d.get("id")), []).append(d)
    for rec in records:
        found = by_id.get(str(rec["id"]), [])
        turn_match = [d for d in found if d.get("turn") in (None, rec["turn"] + 1)]
        if turn_match:
            d = turn_match[0]
            rec[SCORE_DETAIL_FIELD] = {
                k: d[k] for k in fields if k in d and not (isinstance(d[k], float) and math.isnan(d[k]))
            }


class CellActor:
    """The Ray actor of one cell (made remote by the driver with the cell's resources)."""

    def run(self, cell: Cell) -> CellResult:
        return run_cell(cell)


def prepare_pair(pair: Mapping[str, Any]) -> str:
    """Load a pair once so that one-time work (GGUF -> safetensors cache, building the bf16 CPU kernels)
    happens before the cells."""
    load_pair(pair).precision()
    return pair.get("name", "")
