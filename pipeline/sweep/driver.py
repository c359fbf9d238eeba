"""The sweep driver: plan, skip finished cells, run the rest on Ray, log to MLflow, print the tables.

Steps 4-6 of ``python -m pipeline.sweep`` (docs/DESIGN.md sections 1 and 7):

4. The tracking URI is checked (seconds, before Ray); runs left RUNNING by drivers that are gone are
   closed as KILLED; MLflow is asked which cell keys have a finished run: those are skipped. Cells
   whose scoring failed after generating (``score_failed``), and finished MT-Bench cells judged by
   another judge than the configured one, are scored again from their logged generations (no
   regeneration, in this process). An OpenAI-compatible judge is checked before any model loads.
5. Ray runs the rest (``pipeline.sweep.ray_runner``); each cell is leased first (``Tracker.claim``),
   so drivers sharing a store share the cells: a cell another driver holds is waited for at the end
   and taken over if that driver dies; one another driver logged meanwhile is skipped.
6. Each result is logged by the driver as it arrives; the end prints a per-cell table, the
   mean ± std table over seeds (speedup against the same sweep's baseline) and how to open the UI.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, cast

import ray
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from pipeline.cell import Cell, CellResult, judge_identity, rescore
from pipeline.data.slices import task_of
from pipeline.scoring.registry import scorer_for
from pipeline.sweep.plan import CONF_DIR, Plan, SweepConfigError, expand
from pipeline.sweep.ray_runner import (
    actor_options,
    prepare_pairs,
    run_cells,
    start_ray,
)
from pipeline.sweep.summary import summary_tables
from pipeline.tracking import (
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_LOGGING,
    STATUS_SCORE_FAILED,
    StoreWriteError,
    Tracker,
    check_tracking_uri,
    layout,
    pick_active,
    resolve_tracking_uri,
)
from pipeline.tracking.layout import TAG_JUDGE, TAG_RESCORED_AT, TAG_SCORE_METRIC, TAG_STATUS


def open_tracker(cfg: DictConfig, root: Path, plan: Plan) -> tuple[Tracker, str, str]:
    """(tracker, store URI, experiment); an unusable URI fails here in seconds (``TrackingError``)."""
    tracking = cast(dict[str, Any], OmegaConf.to_container(cfg.tracking, resolve=True))
    uri = resolve_tracking_uri(tracking.get("uri") or "sqlite:///mlflow.db", root)
    check_tracking_uri(uri)
    art = tracking.get("artifact_root")
    if art and "://" not in art and not Path(art).is_absolute():
        art = str(root / art)
    experiment = tracking.get("experiment") or plan.name
    return Tracker(uri, experiment, art), uri, experiment


def preflight(cells: Iterable[Cell]) -> None:
    """Each scorer that some cell needs runs its own preflight checks now, before any model loads (e.g. an
    OpenAI-compatible judge must answer ``/models``); once per scorer and judge config."""
    seen = set()
    for cell in cells:
        scorer = scorer_for(task_of(cell.dataset).scorer)
        if scorer is None:
            continue
        once = (scorer.name, json.dumps(cell.judge, sort_keys=True, default=str))
        if once in seen:
            continue
        seen.add(once)
        try:
            scorer.preflight(cell.judge)
        except ValueError as err:
            raise SweepConfigError(str(err)) from None


def _judge_tag(cell: Cell) -> str:
    ident = judge_identity(cell)
    return json.dumps(ident, sort_keys=True) if ident else ""


def classify(cells: list[Cell], active: Mapping[str, Any]) -> tuple[list[Cell], list[Cell], list[Cell]]:
    """(cells to run, cells whose logged generations are to be scored again, cells done).

    Re-scored: ``score_failed`` cells (scoring/judging failed after generating), and finished cells
    whose run was scored by another judge than the one configured now (tag ``judge``).
    """
    to_run: list[Cell] = []
    to_rescore: list[Cell] = []
    done: list[Cell] = []
    for cell in cells:
        run = active.get(cell.key)
        status = run.data.tags.get(TAG_STATUS) if run is not None else None
        if status == STATUS_SCORE_FAILED:
            to_rescore.append(cell)
        elif status == STATUS_FINISHED:
            wanted = _judge_tag(cell)
            tags = cast(Any, run).data.tags  # a finished status: its run is there
            (to_rescore if wanted and tags.get(TAG_JUDGE, "") != wanted else done).append(cell)
        else:
            to_run.append(cell)
    return to_run, to_rescore, done


@dataclass
class Outcome:
    """What became of an invocation's cells, tallied as results arrive (the parent run's metrics;
    ``run_sweep`` returns it as a dict, ``as_dict``, with the result rows)."""

    total: int
    skipped: int
    ran: int = 0
    logged: int = 0
    finished: int = 0
    failed: int = 0
    rescored: int = 0
    elsewhere: int = 0
    results: list[dict[str, Any]] = field(default_factory=list)  # per cell run: key, status, node, error

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def store_failed(tracker: Tracker, err: BaseException, doing: str, outcome: Outcome | None = None) -> StoreWriteError:
    """The one error a sweep ends with when its store fails mid-run: what happened, and that the same command
    resumes."""
    if isinstance(err, StoreWriteError):
        return err
    done = ""
    if outcome is not None:
        done = (
            f" {outcome.ran} cell result(s) had arrived, {outcome.logged} logged; cells in flight were "
            "stopped and no further cell was started."
        )
    return StoreWriteError(
        f"the tracking store {tracker.tracking_uri} failed while {doing} "
        f"({type(err).__name__}: {' '.join(str(err).split())[:300]})."
        f"{done} Make the store reachable and writable again (or point tracking.uri at it), then run the same command: "
        "it resumes, skipping every cell already logged as finished."
    )


def claimer(tracker: Tracker, known: set[str]) -> Callable[[Cell], str]:
    """``claim(cell)`` for ``run_cells``: take the cell's lease; skip it if another driver logged it meanwhile.

    ``known``: ids of the cell runs seen when the plan was made; a newer run of the key (not left
    mid-logging) means another driver ran the cell in the meantime: its outcome stands for this invocation.
    """

    def claim(cell: Cell) -> str:
        key = cell.key
        try:
            if not tracker.claim(key):
                return "wait"
        except Exception as err:  # noqa: BLE001 - the store's folder (its leases) is gone
            raise store_failed(tracker, err, f"leasing cell {key}") from err
        try:
            now = tracker.key_runs(key)
        except Exception as err:  # noqa: BLE001 - the store is gone: nothing more is scheduled
            tracker.release(key)
            raise store_failed(tracker, err, f"looking up cell {key}") from err
        if any(r.info.run_id not in known and r.data.tags.get(TAG_STATUS) != STATUS_LOGGING for r in now) or any(
            r.data.tags.get(TAG_STATUS) == STATUS_FINISHED for r in now
        ):
            tracker.release(key)
            return "skip"
        return "run"

    return claim


def rescore_cells(tracker: Tracker, cells: list[Cell], active: Mapping[str, Any], outcome: Outcome) -> None:
    """Score logged generations again, in this process (no pair loads), each under its cell's lease."""
    for cell in cells:
        key = cell.key
        try:
            claimed = tracker.claim(key)
        except Exception as err:  # noqa: BLE001 - the store's folder (its leases) is gone
            raise store_failed(tracker, err, f"leasing cell {key}") from err
        if not claimed:
            print(f"re-score {cell.label} [{key}]: held by another driver, left to it", flush=True)
            continue
        try:
            try:
                run = tracker.key_runs(key)
            except Exception as err:  # noqa: BLE001
                raise store_failed(tracker, err, f"looking up cell {key}") from err
            run = next((r for r in run if r.info.run_id == active[key].info.run_id), None)
            if run is None:
                continue  # superseded meanwhile
            try:
                records = tracker.samples(run.info.run_id)
            except Exception as err:  # noqa: BLE001 - the store cannot be read: stop here
                raise store_failed(tracker, err, f"reading the generations of cell {key}") from err
            try:
                result = rescore(cell, records)
                tags = {
                    TAG_JUDGE: _judge_tag(cell),
                    TAG_RESCORED_AT: time.strftime("%Y-%m-%d %H:%M:%S"),
                    TAG_SCORE_METRIC: result.score_metric or "",
                }
                error = None if result.finished else result.error
            except Exception as err:  # noqa: BLE001 - the run keeps its status and generations: tried again next time
                result, error = None, f"{type(err).__name__}: {err}"
            if result is not None:
                try:
                    tracker.record_scores(run.info.run_id, result, tags)
                except Exception as err:  # noqa: BLE001 - the store failed: the run keeps its old status, scored next time
                    raise store_failed(tracker, err, f"writing the scores of cell {key}") from err
            outcome.rescored += 1
            if error:
                outcome.failed += 1
                print(
                    f"RE-SCORE FAILED {cell.label} {cell.dataset_name} seed={cell.seed} [{key}]: {error}",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            tracker.release(key)


def run(cfg: DictConfig, root: Path | None = None) -> dict[str, Any]:
    """Plan, skip finished cells, run the rest on Ray, log to MLflow, print the tables."""
    root = Path(root or CONF_DIR.parent)
    t0 = time.perf_counter()
    plan = expand(cfg, root)  # every configuration error is raised here, before Ray
    cluster = OmegaConf.to_container(cfg.cluster, resolve=True)
    tracker, uri, experiment = open_tracker(cfg, root, plan)  # an unusable store fails here, before Ray
    try:
        return _run(cfg, plan, cluster, tracker, uri, experiment, t0)
    finally:
        tracker.close()


PLANNED_CELLS_ARTIFACT = "planned_cells.json"  # on a parent run: the cells its driver set out to run


def _run(cfg, plan: Plan, cluster, tracker: Tracker, uri: str, experiment: str, t0: float) -> dict[str, Any]:
    if tracker.leases is None:
        print(
            f"note: {uri} is a remote store: cells are not leased, so run one driver per experiment on it", flush=True
        )
    closed = tracker.close_stale()
    if closed:
        print(f"closed {len(closed)} run(s) left RUNNING by a driver that is gone (status KILLED)", flush=True)
    runs = tracker.cell_runs()
    active = pick_active(runs)[0]
    known = {r.info.run_id for r in runs}
    todo, to_rescore, _ = classify(plan.cells, active)
    n_retry = sum(1 for c in todo if c.key in active)
    print(
        f"sweep {plan.name!r}: {len(plan.cells)} cells "
        f"({', '.join(f'{k}: {v} samples' for k, v in plan.sample_counts.items())})",
        flush=True,
    )
    n_done = len(plan.cells) - len(todo) - len(to_rescore)
    print(
        f"cells: {len(plan.cells)} total, {n_done} finished, {len(todo)} to run"
        + (f" ({n_retry} failed before)" if n_retry else "")
        + (f", {len(to_rescore)} to score again from their logged generations" if to_rescore else ""),
        flush=True,
    )
    preflight(todo + to_rescore)  # before any model loads
    outcome = Outcome(total=len(plan.cells), skipped=n_done)
    if todo or to_rescore:
        tracker.start_parent(
            run_name=f"{plan.name} {time.strftime('%Y-%m-%d %H:%M:%S')}",
            tags=layout.parent_tags(plan.name, cluster, " ".join(sys.argv)),
            params=layout.parent_params(plan.name, cluster, len(plan.cells), len(todo), len(to_rescore)),
        )
        # what this driver set out to run, on its parent run: a cell it never logs (its driver killed mid-cell)
        # is still listed by the report (analysis.runs.unfinished_cells), not silently left out
        tracker.client.log_text(
            tracker.parent_run_id,
            json.dumps([{"cell_key": c.key, "label": c.label, "seed": c.seed} for c in todo + to_rescore], indent=0),
            PLANNED_CELLS_ARTIFACT,
        )
        status = "FAILED"
        started_ray = False
        failure: StoreWriteError | None = None
        try:
            if to_rescore:
                rescore_cells(tracker, to_rescore, active, outcome)
            if todo:
                started_ray = start_ray(cluster)
                _run_on_ray(cfg, plan, cluster, tracker, todo, known, outcome)
            status = "FINISHED"
        except StoreWriteError as err:  # the store failed mid-run: nothing more is scheduled
            failure = err
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM (ours, or Ray's handler once Ray is up)
            status = "KILLED"
            raise
        finally:
            try:
                tracker.end_parent(
                    status, layout.parent_metrics(len(plan.cells), outcome.as_dict(), time.perf_counter() - t0)
                )
            except Exception as err:  # noqa: BLE001 - the store is gone: said once, below, not as a traceback
                failure = failure or store_failed(tracker, err, "closing the sweep's parent run", outcome)
            finally:
                if started_ray:
                    ray.shutdown()
        if failure is not None:
            raise failure
    try:
        rows = tracker.rows(
            (c.key for c in plan.cells), warn=lambda text: print(f"warning: {text}", file=sys.stderr, flush=True)
        )
    except Exception as err:  # noqa: BLE001
        raise store_failed(tracker, err, "reading the results for the tables", outcome) from err
    base_method = next((c.method for c in plan.cells if c.baseline), None)
    cell_text, mean_text = summary_tables(rows, plan.baselines)
    print("\nper cell:\n" + cell_text)
    print(
        f"\nmean ± std over seeds (speedup: tokens/s over the {base_method or 'no'} baseline cell of the same pair, "
        "dataset, seed, batch size, rate and temperature):\n" + mean_text
    )
    n_failed = sum(1 for r in rows if r.get(TAG_STATUS) != STATUS_FINISHED)
    if n_failed:
        print(
            f"\n{n_failed} cell(s) not finished; run the same command again to retry only those (cells whose scoring "
            "failed are scored again from their logged generations; errors: MLflow tag `error`, artifact "
            "traceback.txt)."
        )
    if outcome.elsewhere:
        print(f"{outcome.elsewhere} cell(s) were run by another driver sharing this store.")
    print(f"\nwall time: {time.perf_counter() - t0:.1f} s")
    print(
        f"MLflow: experiment {experiment!r} in {uri}\n  open the UI: mlflow ui --backend-store-uri {uri} --port 5000"
        f"  (then http://127.0.0.1:5000, experiment {experiment!r}; select runs -> Compare)"
    )
    return {**outcome.as_dict(), "rows": rows, "experiment": experiment, "tracking_uri": uri, "plan": plan}


def _run_on_ray(
    cfg, plan: Plan, cluster, tracker: Tracker, todo: list[Cell], known: set[str], outcome: Outcome
) -> None:
    opts, capacity = actor_options(cluster)
    print(
        f"ray: {len([n for n in ray.nodes() if n.get('Alive')])} node(s), {capacity} cell(s) in flight "
        f"({'GPU' if opts.get('num_gpus') else 'CPU'} actors, isolation {opts['isolation']['mode']}, "
        f"{opts['isolation']['threads']} thread(s) each)",
        flush=True,
    )
    prepare_pairs(plan, opts)

    def on_result(cell: Cell, result: CellResult) -> None:
        failure = None
        try:
            tracker.log_cell(cell, result)
            outcome.logged += 1
        except Exception as err:  # noqa: BLE001 - the store failed mid-write (log_cell marked the run failed): retried next time
            result = replace(
                result, status=STATUS_FAILED, error=f"logging to MLflow failed: {type(err).__name__}: {err}"
            )
            failure = err
        finally:
            tracker.release(cell.key)
        outcome.ran += 1
        if result.finished:
            outcome.finished += 1
        else:
            outcome.failed += 1
        outcome.results.append(
            {"cell_key": cell.key, "status": result.status, "node_id": result.node_id, "error": result.error}
        )
        if failure is not None:  # the first logging failure stops the sweep: no further cell is started
            raise store_failed(tracker, failure, f"logging cell {cell.key} ({cell.label})", outcome) from failure
        if not result.finished:
            tqdm.write(
                f"{'SCORE FAILED' if result.status == STATUS_SCORE_FAILED else 'FAILED'} "
                f"{cell.describe()}: {result.error}",
                file=sys.stderr,
            )

    def on_skip(cell: Cell) -> None:
        outcome.elsewhere += 1

    run_cells(
        todo,
        cluster,
        on_result,
        progress=bool(cfg.get("progress", True)),
        claim=claimer(tracker, known),
        on_skip=on_skip,
    )
