"""Ray: start or join the cluster, size one cell's actor, convert GGUF pairs once, run cells.

Steps 5 of ``python -m pipeline.sweep`` (docs/DESIGN.md section 7): Ray runs the cells, one actor per
cell, never more in flight than the cluster holds; a cell that raises, exceeds
``cluster.cell_timeout_s`` or whose actor dies is recorded as failed.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import replace
from typing import Any, Callable, Mapping, cast

import ray
from ray.exceptions import RayActorError, RayError
from tqdm import tqdm

from pipeline import models
from pipeline.cell import CellActor, prepare_pair
from pipeline.cell_types import STATUS_FAILED, STATUS_FINISHED, Cell, CellResult
from pipeline.sweep.plan import Plan, SweepConfigError


def start_ray(cluster: Mapping[str, Any]) -> bool:
    """Start (local) or join (``address``) Ray unless already initialised; True when we started it."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": bool(cluster.get("log_to_driver", False)),
        "logging_level": logging.ERROR,
        "configure_logging": True,
    }
    runtime_env = {k: v for k, v in (cluster.get("runtime_env") or {}).items() if v not in (None, {}, [])}
    if "excludes" in runtime_env and "working_dir" not in runtime_env:
        runtime_env.pop("excludes")
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    if cluster.get("kind") == "local" and not cluster.get("address"):
        # address "local": a new Ray instance of our own, even when this machine runs another (ray.init()
        # without an address joins the newest `ray start` cluster it finds, and then refuses num_cpus)
        kwargs.update(
            address="local",
            num_cpus=cluster.get("num_cpus") or os.cpu_count(),
            object_store_memory=cluster.get("object_store_memory"),
        )
        if cluster.get("num_gpus") is not None:
            kwargs["num_gpus"] = cluster["num_gpus"]
    else:
        kwargs["address"] = cluster.get("address") or "auto"
    ray.init(**kwargs)
    return True


def actor_options(cluster: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """Resources of one cell's actor and how many such actors the cluster holds at once.

    ``opts["isolation"]`` (popped by ``run_cells``) says how a CPU cell's measured window is kept
    from sharing cores (``cluster.cpu_isolation``): ``exclusive`` (default: one cell per node holding
    all of the node's CPUs, torch threads = those CPUs), ``pinned`` (``cpus_per_cell`` cores each, bound
    to disjoint core sets by the driver; local clusters only) or ``shared`` (cells share the cores:
    throughput runs, not speed measurement). GPU cells: ``gpu`` (one GPU each, ``cpus_per_cell`` threads).
    """
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    accel = cluster.get("accelerator_type")
    custom = dict(cluster.get("resources") or {})

    def eligible(node) -> bool:
        res = node.get("Resources", {})
        if accel and f"accelerator_type:{accel}" not in res:
            return False
        return all(res.get(k, 0) >= v for k, v in custom.items())

    pool = [n["Resources"] for n in nodes if eligible(n)]
    total_gpus = sum(r.get("GPU", 0) for r in pool)
    use_gpu = cluster.get("use_gpu", "auto")
    use_gpu = total_gpus > 0 if use_gpu == "auto" else bool(use_gpu)
    mode = cluster.get("cpu_isolation") or "exclusive"
    cpus = float(cluster.get("cpus_per_cell") or 1)
    opts: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0}
    if use_gpu:
        gpus = float(cluster.get("gpus_per_cell") or 1)
        opts["num_gpus"] = gpus
        capacity = sum(
            min(math.floor(r.get("GPU", 0) / gpus), math.floor(r.get("CPU", 0) / cpus) if cpus else 10**9) for r in pool
        )
        isolation = {"mode": "gpu", "threads": int(cpus)}
    elif mode == "exclusive":
        opts["num_gpus"] = 0
        node_cpus = [r.get("CPU", 0) for r in pool if r.get("CPU", 0) >= 1]
        cpus = float(min(node_cpus)) if node_cpus else cpus  # every core of the smallest eligible node
        capacity = sum(1 for c in node_cpus if c >= cpus)
        isolation = {"mode": "exclusive", "threads": int(cpus)}
    else:
        opts["num_gpus"] = 0
        capacity = sum(math.floor(r.get("CPU", 0) / cpus) for r in pool) if cpus else len(pool)
        isolation = {"mode": mode, "threads": int(cpus)}
        if mode == "pinned" and (cluster.get("kind") != "local" or cluster.get("address")):
            raise SweepConfigError(
                "cluster.cpu_isolation=pinned binds cells to core sets of this machine: use it with "
                "cluster=local, or cpu_isolation=exclusive on a multi-node cluster"
            )
    opts["num_cpus"] = cpus
    if custom:
        opts["resources"] = custom
        capacity = min(capacity, sum(min(math.floor(r.get(k, 0) / v) for k, v in custom.items()) for r in pool))
    if accel:
        opts["accelerator_type"] = accel
    strategy = cluster.get("scheduling_strategy") or "DEFAULT"
    if strategy != "DEFAULT":
        opts["scheduling_strategy"] = strategy
    limit = cluster.get("max_in_flight")
    if limit:  # local: only lowers what the machine holds (more would queue cells in Ray, sharing cores)
        capacity = (
            min(int(limit), capacity) if cluster.get("kind") == "local" and not cluster.get("address") else int(limit)
        )
    if capacity < 1:
        need = f"{opts['num_gpus']} GPU" if use_gpu else f"{cpus} CPU"
        raise SweepConfigError(
            f"no node of the Ray cluster can hold a cell ({need}"
            + (f", accelerator_type={accel}" if accel else "")
            + (f", resources={custom}" if custom else "")
            + "): lower cluster.cpus_per_cell, fix cluster.accelerator_type/resources, or set cluster.max_in_flight "
            "for an autoscaling cluster"
        )
    opts["isolation"] = isolation
    return opts, capacity


def core_sets(threads: int, capacity: int) -> list[list[int]]:
    """Disjoint core sets of this process's CPUs for ``pinned`` isolation (at most ``capacity``)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    sets = [cores[i : i + threads] for i in range(0, len(cores) - threads + 1, threads)]
    if not sets:
        raise SweepConfigError(f"cluster.cpus_per_cell={threads} exceeds this machine's {len(cores)} core(s)")
    return sets[:capacity]


def prepare_pairs(plan: Plan, opts: Mapping[str, Any]) -> None:
    """Convert GGUF models once (a Ray task) before many actors would race to do it."""
    todo = {}
    for cell in plan.cells:
        spec = models.PairSpec.from_config(cell.pair)
        for m in (spec.target, spec.draft):
            if m is None or not m.gguf_file:
                continue
            if not models.is_converted(m):
                todo[spec.name] = cell.pair
    if todo:
        task = ray.remote(prepare_pair).options(num_cpus=opts.get("num_cpus", 1), num_gpus=opts.get("num_gpus", 0))
        print(f"preparing {len(todo)} pair(s) once (GGUF conversion): {', '.join(todo)}", flush=True)
        ray.get([task.remote(p) for p in todo.values()])


DRIVER_POLL_S = 1.0  # how often a cell's actor looks for its driver (DriverBoundActor)


def driver_alive(driver: tuple[str, int]) -> bool:
    """Whether the driver ``(host, pid)`` is alive, as this process can tell: on its own host by its pid; on
    another host Ray's own fate-sharing ends the actor when its owner's job goes (True here)."""
    host, pid = driver
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class DriverBoundActor(CellActor):
    """A cell's actor that dies with its driver: only the driver writes to the store (docs/sweeps.md, "A killed
    sweep"), so a cell whose driver is gone has no one to log it and must not go on holding cores; a thread ends
    the actor's process within ``DRIVER_POLL_S`` of its driver's death."""

    def run(self, cell: Cell, driver: tuple[str, int] | None = None) -> CellResult:
        if driver is not None:

            def watch() -> None:
                while driver_alive(driver):
                    time.sleep(DRIVER_POLL_S)
                os._exit(70)  # the driver is gone: nothing this cell measures can be logged

            threading.Thread(target=watch, name="driver-watch", daemon=True).start()
        return super().run(cell)


def run_cells(
    plan_cells: list[Cell],
    cluster: Mapping[str, Any],
    on_result: Callable[[Cell, CellResult], None],
    progress: bool = True,
    claim: Callable[[Cell], str] | None = None,
    on_skip: Callable[[Cell], None] | None = None,
    poll_s: float = 2.0,
) -> None:
    """Run cells on Ray, at most ``capacity`` in flight; ``on_result(cell, result)`` for each (driver side).

    ``claim(cell)`` (optional) is asked before a cell starts: ``"run"`` (this driver holds its lease),
    ``"skip"`` (another driver has done it: ``on_skip(cell)``) or ``"wait"`` (another live driver holds
    it: asked again every ``poll_s`` seconds once nothing else is left, so a lease that ends with its
    driver is picked up). Each cell runs with its ``isolation`` set (see ``actor_options``).
    """
    opts, capacity = actor_options(cluster)
    isolation = opts.pop("isolation")
    free_cores = core_sets(isolation["threads"], capacity) if isolation["mode"] == "pinned" else None
    if free_cores is not None:
        capacity = min(capacity, len(free_cores))
    remote_cls = ray.remote(DriverBoundActor)
    driver = (socket.gethostname(), os.getpid())
    timeout = float(cluster.get("cell_timeout_s") or 0) or None
    pending = list(plan_cells)
    waiting: list[Cell] = []
    last_poll = time.monotonic()
    told_waiting = False
    in_flight: dict[Any, tuple[Cell, Any, float]] = {}
    bar = tqdm(total=len(pending), unit="cell", disable=not progress, dynamic_ncols=True, file=sys.stderr)
    done = {"finished": 0, "failed": 0}
    try:
        while pending or in_flight or waiting:
            while pending and len(in_flight) < capacity:
                cell = pending.pop(0)
                verdict = claim(cell) if claim is not None else "run"
                if verdict == "skip":
                    if on_skip is not None:
                        on_skip(cell)
                    bar.update(1)
                    continue
                if verdict == "wait":
                    waiting.append(cell)
                    continue
                iso = dict(isolation)
                if free_cores is not None:
                    iso["cores"] = free_cores.pop(0)
                cell = replace(cell, isolation=iso)
                actor = remote_cls.options(**opts).remote()
                ref = actor.run.remote(cell, driver)  # type: ignore[attr-defined]  # a Ray actor's method
                in_flight[ref] = (cell, actor, time.monotonic())
            if waiting and not pending:
                if not told_waiting:
                    tqdm.write(
                        f"{len(waiting)} cell(s) are being run by another driver on this store; waiting for them "
                        "(taken over if that driver stops)",
                        file=sys.stderr,
                    )
                    told_waiting = True
                if time.monotonic() - last_poll >= poll_s:
                    pending, waiting, last_poll = waiting, [], time.monotonic()
                    continue
            if not in_flight:
                time.sleep(min(poll_s, 0.5))
                continue
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
            now = time.monotonic()
            finished_refs = []
            for ref in ready:
                cell, actor, t0 = in_flight[ref]
                try:
                    result = ray.get(ref)
                except RayActorError as err:
                    result = _failure(cell, f"actor died mid-cell: {type(err).__name__}: {_short(err)}", err, now - t0)
                except RayError as err:
                    result = _failure(cell, f"{type(err).__name__}: {_short(err)}", err, now - t0)
                finished_refs.append((ref, result))
            for ref, (cell, actor, t0) in list(in_flight.items()):
                if timeout and ref not in ready and now - t0 > timeout:
                    finished_refs.append(
                        (
                            ref,
                            _failure(cell, f"timed out after {timeout:.0f} s (cluster.cell_timeout_s)", None, now - t0),
                        )
                    )
            for ref, result in finished_refs:
                cell, actor, _ = in_flight.pop(ref)
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
                if free_cores is not None and (cell.isolation or {}).get("cores"):
                    free_cores.append(cast(dict[str, Any], cell.isolation)["cores"])
                if result.isolation is None:  # failed before applying it (or the actor died): what was asked
                    result = replace(result, isolation=cell.isolation)
                done["finished" if result.status == STATUS_FINISHED else "failed"] += 1
                on_result(cell, result)
                bar.set_postfix(finished=done["finished"], failed=done["failed"], refresh=False)
                bar.update(1)
    finally:
        bar.close()
        for _, (cell, actor, _) in in_flight.items():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass


def _short(err: BaseException, limit: int = 500) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:limit]


def _failure(cell: Cell, error: str, err: BaseException | None, elapsed: float) -> CellResult:
    """The result of a cell whose actor died, raised through Ray or timed out."""
    tb = "".join(traceback.format_exception(err)) if err is not None else error
    now = time.time()
    return CellResult(
        cell_key=cell.key,
        status=STATUS_FAILED,
        stage="actor",
        error=error,
        traceback=tb,
        metrics={"cell_wall_s": elapsed},
        started_at=now - elapsed,
        ended_at=now,
    )
