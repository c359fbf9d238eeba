"""Run a sweep: methods x pairs x datasets x seeds, one Ray actor per cell, every cell in MLflow.

    python -m pipeline.sweep                                   # the smoke sweep (make run)
    python -m pipeline.sweep sweep=mtad_table5 cluster=ray cluster.accelerator_type=A100
    python -m pipeline.sweep method=mtad method.tau=0.3 seeds=[0]

Flow (DESIGN.md sections 1 and 7):

1. Hydra composes ``conf/config.yaml`` with a ``sweep/`` and a ``cluster/`` config and the overrides.
2. The grid is expanded into cells; every method/pair/dataset name is looked up in its config group
   and every method's parameters validated (``check_method``), pairs and data paths checked, before
   Ray starts: configuration errors stop here with a message naming the fix.
3. ``ar`` baseline cells are added for every (pair, dataset, seed) that has other methods.
4. MLflow is asked which cell keys have a finished run; those are skipped (failed cells run again).
5. Ray runs the rest, one actor per cell, never more in flight than the cluster holds; a cell that
   raises, exceeds ``cluster.cell_timeout_s`` or whose actor dies is recorded as failed.
6. Each result is logged by the driver as it arrives; the end prints a per-cell table, the
   mean ± std table over seeds (speedup against the same sweep's baseline) and how to open the UI.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import hydra
from omegaconf import DictConfig, OmegaConf

from pipeline.cell import HARNESS_VERSION
from pipeline.tracking import Tracker, cell_key, resolve_tracking_uri

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUP_KEYS = {"method": "methods", "pair": "pairs", "dataset": "datasets"}
DATASET_KEYS = ("name", "path", "split", "start", "limit", "ids", "max_new_tokens", "max_turns", "time_budget_s", "options")


class SweepConfigError(ValueError):
    """A sweep configuration that cannot run; raised before Ray starts."""


@dataclass
class Plan:
    """The expanded sweep: cells in run order and what was checked."""

    name: str
    cells: list[dict[str, Any]]
    root: Path
    sample_counts: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------------------- composition


def compose(overrides: Sequence[str] = (), config_dir: str | Path | None = None) -> DictConfig:
    """Compose the sweep config outside ``@hydra.main`` (tests, notebooks); leaves Hydra initialised."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    initialize_config_dir(config_dir=str(Path(config_dir or CONF_DIR).resolve()), version_base="1.3")
    return hydra_compose(config_name="config", overrides=list(overrides))


def _group_options(group: str) -> list[str]:
    from hydra.core.global_hydra import GlobalHydra

    return sorted(GlobalHydra.instance().config_loader().get_group_options(group))


def _group_option(cfg: DictConfig, group: str, name: str) -> dict[str, Any]:
    """``conf/<group>/<name>.yaml`` resolved in the context of ``cfg`` (so ``${data_root}`` works)."""
    from hydra import compose as hydra_compose

    options = _group_options(group)
    if name not in options:
        raise SweepConfigError(
            f"unknown {group} {name!r} in sweep.{GROUP_KEYS[group]}; valid {group}s: {options} "
            f"(add conf/{group}/{name}.yaml or pick one of these)"
        )
    node = hydra_compose(config_name="config", overrides=[f"{group}={name}"])[group]
    context = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    OmegaConf.set_struct(context, False)
    context[group] = node
    return OmegaConf.to_container(context[group], resolve=True)


def _plain(node: Any) -> Any:
    """A plain Python value of a config node (resolved), whatever it is."""
    if isinstance(node, (DictConfig,)) or OmegaConf.is_list(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _entries(items: Any, group: str) -> list[tuple[str, dict[str, Any]]]:
    """Sweep list entries -> (config name, overrides); an entry is a name or {<group>: name, ...}."""
    out = []
    for item in items or []:
        if isinstance(item, str):
            out.append((item, {}))
        elif isinstance(item, Mapping) and group in item:
            rest = {k: v for k, v in item.items() if k != group}
            out.append((str(item[group]), rest))
        else:
            raise SweepConfigError(
                f"sweep.{GROUP_KEYS[group]}: entry {item!r} must be a {group} config name or a mapping "
                f"with a `{group}:` key, e.g. {{{group}: <name>, <key>: <value>}}"
            )
    return out


def _selected(cfg: DictConfig, group: str) -> list[tuple[str, dict[str, Any]]] | None:
    """A command-line selection (``method=mtad method.tau=0.3``) replacing the sweep's list."""
    node = cfg.get(group)
    if node is None:
        return None
    resolved = OmegaConf.to_container(node, resolve=True)
    name = resolved.get("name")
    return [(name, {"__resolved__": resolved})]


# ---------------------------------------------------------------------------------- expansion


def _method_entry(cfg: DictConfig, name: str, overrides: dict[str, Any], common: Mapping[str, Any]) -> dict[str, Any]:
    if "__resolved__" in overrides:
        base = dict(overrides["__resolved__"])
        default = _group_option(cfg, "method", name) if name in _group_options("method") else {}
        label = overrides.get("label")
    else:
        base = _group_option(cfg, "method", name)
        default = dict(base)
        label = overrides.get("label")
        base.update({k: v for k, v in overrides.items() if k != "label"})
    base.update(common)
    method_name = base.pop("name", name)
    changed = {k: v for k, v in base.items() if default.get(k) != v}
    if not label:
        label = method_name + (("(" + ",".join(f"{k}={v}" for k, v in sorted(changed.items())) + ")") if changed else "")
    return {"config_name": name, "name": method_name, "params": base, "label": label}


def _pair_entry(cfg: DictConfig, name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    from pipeline.models import PairSpec

    pair = dict(overrides["__resolved__"]) if "__resolved__" in overrides else _group_option(cfg, "pair", name)
    pair.update({k: v for k, v in overrides.items() if k != "__resolved__"})
    pair.setdefault("name", name)
    try:
        PairSpec.from_config(pair)
    except ValueError as err:
        raise SweepConfigError(f"pair {name!r}: {err} (fix conf/pair/{name}.yaml or the override)") from None
    return pair


def _dataset_entry(cfg: DictConfig, name: str, overrides: dict[str, Any], root: Path) -> dict[str, Any]:
    from pipeline.data import DATASETS

    ds = dict(overrides["__resolved__"]) if "__resolved__" in overrides else _group_option(cfg, "dataset", name)
    extra = {k: v for k, v in overrides.items() if k != "__resolved__"}
    unknown = sorted(set(extra) - set(DATASET_KEYS))
    if unknown:
        raise SweepConfigError(f"dataset {name!r}: unknown key(s) {unknown}; valid keys: {list(DATASET_KEYS)}")
    ds.update(extra)
    ds.setdefault("name", name)
    if ds["name"] not in DATASETS:
        raise SweepConfigError(f"dataset config {name!r} names dataset {ds['name']!r}; valid datasets: {sorted(DATASETS)}")
    ds = {k: ds.get(k) for k in DATASET_KEYS}
    ds["options"] = dict(ds["options"] or {})
    ds["config_path"] = ds["path"]  # as configured (part of the key); `path` becomes absolute
    if ds["path"] is not None:
        path = Path(str(ds["path"])).expanduser()
        path = path if path.is_absolute() else (root / path)
        if not path.exists():
            raise SweepConfigError(
                f"dataset {name!r}: data path {path} does not exist; set `data_root=<folder>` (or the "
                f"PIPELINE_DATA_ROOT environment variable) to the folder holding the offline copies, or "
                f"`dataset.path=<path>` / null for the Hub copy"
            )
        ds["path"] = str(path.resolve())
    if not isinstance(ds["max_new_tokens"], int) or ds["max_new_tokens"] < 1:
        raise SweepConfigError(f"dataset {name!r}: max_new_tokens must be an integer >= 1, got {ds['max_new_tokens']!r}")
    return ds


def _check_models_available(pair: Mapping[str, Any]) -> None:
    """Offline (HF_HUB_OFFLINE=1): every model must be a local folder, an installed package or cached."""
    from pipeline.models import ModelNotAvailableError, PairSpec

    spec = PairSpec.from_config(pair)
    for role, model in (("target", spec.target), ("draft", spec.draft)):
        if model is None:
            continue
        try:
            location = model.location()
        except ModelNotAvailableError as err:
            raise SweepConfigError(f"pair {pair['name']!r} {role}: {err}") from None
        if Path(location).exists() or os.environ.get("HF_HUB_OFFLINE", "0") in ("0", "", "false"):
            continue
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(location, "config.json", revision=model.revision)
        if not isinstance(cached, str):
            raise SweepConfigError(
                f"pair {pair['name']!r} {role} model {model.id!r} is not available offline (HF_HUB_OFFLINE=1 "
                "and not in the Hugging Face cache): download it where the Hub is reachable "
                "(`huggingface-cli download <id>`), point the pair's `id` at a local folder, unset "
                "HF_HUB_OFFLINE on a machine with Hub access, or use pair=smollm2-offline"
            )


def expand(cfg: DictConfig, root: Path | None = None) -> Plan:
    """Expand and validate the grid (no Ray, no models): the cells in run order."""
    from pipeline.cell import load_slice
    from pipeline.decoding import check_method

    root = Path(root or CONF_DIR.parent)
    sweep = cfg.sweep
    if sweep is None or not sweep.get("name"):
        raise SweepConfigError("no sweep selected: pass sweep=<name>; valid sweeps: " + str(_group_options("sweep")))
    common = _plain(sweep.get("method_overrides")) or {}
    method_items = _selected(cfg, "method") or _entries(_plain(sweep.get("methods")), "method")
    pair_items = _selected(cfg, "pair") or _entries(_plain(sweep.get("pairs")), "pair")
    dataset_items = _selected(cfg, "dataset") or _entries(_plain(sweep.get("datasets")), "dataset")
    seeds = _plain(cfg.seeds) if cfg.get("seeds") is not None else _plain(sweep.get("seeds"))
    if isinstance(seeds, int):
        seeds = [seeds]
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise SweepConfigError(f"seeds must be a non-empty list of integers, got {seeds!r} (e.g. seeds=[0,1,2])")
    for what, items in (("methods", method_items), ("pairs", pair_items), ("datasets", dataset_items)):
        if not items:
            raise SweepConfigError(f"sweep.{what} is empty")

    errors: list[str] = []

    def attempt(fn, *args):
        try:
            return fn(*args)
        except SweepConfigError as err:
            errors.append(str(err))
        except ValueError as err:
            errors.append(str(err))
        return None

    methods = [m for m in (attempt(_method_entry, cfg, n, o, common) for n, o in method_items) if m]
    baseline_name = sweep.get("baseline")
    baseline = attempt(_method_entry, cfg, baseline_name, {}, common) if baseline_name else None
    pairs = [p for p in (attempt(_pair_entry, cfg, n, o) for n, o in pair_items) if p]
    datasets = [d for d in (attempt(_dataset_entry, cfg, n, o, root) for n, o in dataset_items) if d]
    for pair in pairs:
        attempt(_check_models_available, pair)
    resolved_params: dict[tuple[str, str], dict[str, Any]] = {}
    for m in methods + ([baseline] if baseline else []):
        for pair in pairs:
            try:
                resolved_params[(m["label"], pair["name"])] = check_method(m["name"], m["params"], has_draft=bool(pair.get("draft")))
            except ValueError as err:
                errors.append(f"{err} (sweep entry {m['label']!r}, pair {pair['name']!r}; fix the override or conf/method/{m['config_name']}.yaml)")
    counts: dict[str, int] = {}
    for ds in datasets:
        try:
            measured, _, _ = load_slice(ds)
            if not measured:
                raise ValueError("the slice is empty (check start/limit/ids)")
            counts[ds["name"]] = len(measured)
        except Exception as err:  # noqa: BLE001 - any loader failure is a configuration error here
            errors.append(f"dataset {ds['name']!r} ({ds.get('path') or 'Hub/package copy'}): {type(err).__name__}: {err}")
    judge = OmegaConf.to_container(cfg.judge, resolve=True) if cfg.get("judge") is not None else {"enabled": False}
    if judge.get("enabled") and judge.get("kind") not in ("transformers", "openai"):
        errors.append(f"judge.kind={judge.get('kind')!r}; valid: transformers, openai")
    if errors:
        raise SweepConfigError("the sweep cannot run:\n  - " + "\n  - ".join(errors))

    measure = OmegaConf.to_container(cfg.measure, resolve=True)
    cluster = OmegaConf.to_container(cfg.cluster, resolve=True)
    fault = OmegaConf.to_container(cfg.fault_injection, resolve=True) if cfg.get("fault_injection") else None
    cells: dict[str, dict[str, Any]] = {}
    for pair, ds, seed in itertools.product(pairs, datasets, seeds):
        group = list(methods)
        if baseline and any(m["name"] != baseline["name"] or m["params"] != baseline["params"] for m in methods):
            group = [baseline] + [m for m in methods if m["label"] != baseline["label"]]
        for m in group:
            cell = _make_cell(sweep.name, m, resolved_params[(m["label"], pair["name"])], pair, ds, seed, measure, judge, cluster, fault)
            cell["baseline"] = baseline is not None and m["label"] == baseline["label"]
            cells.setdefault(cell["key"], cell)
    return Plan(name=str(sweep.name), cells=list(cells.values()), root=root, sample_counts=counts)


def _make_cell(sweep_name, method, params, pair, ds, seed, measure, judge, cluster, fault) -> dict[str, Any]:
    pair_identity = {k: v for k, v in pair.items() if k not in ("device",)}
    ds_identity = {k: v for k, v in ds.items() if k not in ("path",)}
    measure_identity = dict(measure)
    judge_used = judge if (judge.get("enabled") and ds["name"] == "mt_bench") else None
    identity = {
        "harness": HARNESS_VERSION,
        "method": {"name": method["name"], "params": params},
        "pair": pair_identity,
        "dataset": ds_identity,
        "seed": seed,
        "measure": measure_identity,
        "judge": judge_used,
        "hardware": cluster.get("accelerator_type") or "any",
    }
    key = cell_key(identity)
    config = {
        "cell_key": key,
        "sweep": sweep_name,
        "label": method["label"],
        "method": {"name": method["name"], "config": method["config_name"], **params},
        "pair": pair,
        "dataset": ds,
        "seed": seed,
        "measure": measure,
        "judge": judge_used,
        "hardware": identity["hardware"],
        "harness_version": HARNESS_VERSION,
    }
    return {
        "key": key,
        "sweep": sweep_name,
        "label": method["label"],
        "method": {"name": method["name"], "params": params},
        "pair": pair,
        "dataset": ds,
        "seed": seed,
        "measure": measure,
        "judge": judge_used,
        "fault": fault,
        "config": config,
    }


# ---------------------------------------------------------------------------------- Ray


def start_ray(cluster: Mapping[str, Any]) -> bool:
    """Start (local) or join (``address``) Ray unless already initialised; True when we started it."""
    import ray

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
        kwargs.update(num_cpus=cluster.get("num_cpus") or os.cpu_count(), object_store_memory=cluster.get("object_store_memory"))
        if cluster.get("num_gpus") is not None:
            kwargs["num_gpus"] = cluster["num_gpus"]
    else:
        kwargs["address"] = cluster.get("address") or "auto"
    ray.init(**kwargs)
    return True


def actor_options(cluster: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """Resources of one cell's actor and how many such actors the cluster holds at once."""
    import ray

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
    cpus = float(cluster.get("cpus_per_cell") or 1)
    opts: dict[str, Any] = {"num_cpus": cpus, "max_restarts": 0, "max_task_retries": 0}
    if use_gpu:
        gpus = float(cluster.get("gpus_per_cell") or 1)
        opts["num_gpus"] = gpus
        capacity = sum(min(math.floor(r.get("GPU", 0) / gpus), math.floor(r.get("CPU", 0) / cpus) if cpus else 10**9) for r in pool)
    else:
        opts["num_gpus"] = 0
        capacity = sum(math.floor(r.get("CPU", 0) / cpus) for r in pool) if cpus else len(pool)
    if custom:
        opts["resources"] = custom
        capacity = min(capacity, sum(min(math.floor(r.get(k, 0) / v) for k, v in custom.items()) for r in pool))
    if accel:
        opts["accelerator_type"] = accel
    strategy = cluster.get("scheduling_strategy") or "DEFAULT"
    if strategy != "DEFAULT":
        opts["scheduling_strategy"] = strategy
    limit = cluster.get("max_in_flight")
    capacity = int(limit) if limit else capacity
    if capacity < 1:
        need = f"{opts['num_gpus']} GPU" if use_gpu else f"{cpus} CPU"
        raise SweepConfigError(
            f"no node of the Ray cluster can hold a cell ({need}"
            + (f", accelerator_type={accel}" if accel else "") + (f", resources={custom}" if custom else "")
            + "): lower cluster.cpus_per_cell, fix cluster.accelerator_type/resources, or set cluster.max_in_flight "
            "for an autoscaling cluster"
        )
    return opts, capacity


def _prepare_pairs(plan: Plan, opts: Mapping[str, Any]) -> None:
    """Convert GGUF models once (a Ray task) before many actors would race to do it."""
    import ray

    from pipeline import models
    from pipeline.cell import prepare_pair

    todo = {}
    for cell in plan.cells:
        spec = models.PairSpec.from_config(cell["pair"])
        for m in (spec.target, spec.draft):
            if m is None or not m.gguf_file:
                continue
            try:
                ready = (models._gguf_cache_dir(m.location(), m.gguf_file) / "config.json").exists()
            except Exception:  # noqa: BLE001 - private helper changed: just prepare
                ready = False
            if not ready:
                todo[spec.name] = cell["pair"]
    if todo:
        task = ray.remote(prepare_pair).options(num_cpus=opts.get("num_cpus", 1), num_gpus=opts.get("num_gpus", 0))
        print(f"preparing {len(todo)} pair(s) once (GGUF conversion): {', '.join(todo)}", flush=True)
        ray.get([task.remote(p) for p in todo.values()])


def run_cells(plan_cells: list[dict[str, Any]], cluster: Mapping[str, Any], on_result, progress: bool = True) -> None:
    """Run cells on Ray, at most ``capacity`` in flight; ``on_result(cell, result)`` for each (driver side)."""
    import ray
    from ray.exceptions import RayActorError, RayError
    from tqdm import tqdm

    from pipeline.cell import CellActor

    opts, capacity = actor_options(cluster)
    remote_cls = ray.remote(CellActor)
    timeout = float(cluster.get("cell_timeout_s") or 0) or None
    pending = list(plan_cells)
    in_flight: dict[Any, tuple[dict[str, Any], Any, float]] = {}
    bar = tqdm(total=len(pending), unit="cell", disable=not progress, dynamic_ncols=True, file=sys.stderr)
    done = {"finished": 0, "failed": 0}
    try:
        while pending or in_flight:
            while pending and len(in_flight) < capacity:
                cell = pending.pop(0)
                actor = remote_cls.options(**opts).remote()
                ref = actor.run.remote(cell)
                in_flight[ref] = (cell, actor, time.monotonic())
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
                    finished_refs.append((ref, _failure(cell, f"timed out after {timeout:.0f} s (cluster.cell_timeout_s)", None, now - t0)))
            for ref, result in finished_refs:
                cell, actor, _ = in_flight.pop(ref)
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
                done[result["status"] if result["status"] == "finished" else "failed"] += 1
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


def _failure(cell: Mapping[str, Any], error: str, err: BaseException | None, elapsed: float) -> dict[str, Any]:
    import traceback

    tb = "".join(traceback.format_exception(err)) if err is not None else error
    return {"cell_key": cell["key"], "status": "failed", "stage": "actor", "stages": {}, "error": error, "traceback": tb, "metrics": {"cell_wall_s": elapsed}}


# ---------------------------------------------------------------------------------- tables


def _fmt(mean: float, std: float, digits: int = 2) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def summary_tables(rows: list[dict[str, Any]], baseline_label: str | None) -> tuple[str, str]:
    """(per-cell table, mean ± std table over seeds) as text."""
    import pandas as pd

    if not rows:
        return "(no cells)", "(no cells)"
    df = pd.DataFrame(rows)
    for col in ("tokens_per_s", "j_per_token", "score", "accepted_per_step", "perplexity"):
        if col not in df:
            df[col] = float("nan")
    df["seed"] = df["seed"].astype(int)
    per_cell = df[["label", "pair", "dataset", "seed", "cell_status", "tokens_per_s", "j_per_token", "score", "cell_key"]].copy()
    per_cell = per_cell.sort_values(["pair", "dataset", "label", "seed"])
    per_cell.columns = ["method", "pair", "dataset", "seed", "status", "tokens/s", "J/token", "score", "cell_key"]
    cell_text = per_cell.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-")

    ok = df[df["cell_status"] == "finished"].copy()
    if ok.empty:
        return cell_text, "(no finished cells)"
    if baseline_label is not None:
        base = ok[ok["label"] == baseline_label].set_index(["pair", "dataset", "seed"])["tokens_per_s"]
        ok["speedup"] = [
            row.tokens_per_s / base.get((row.pair, row.dataset, row.seed), float("nan")) for row in ok.itertuples()
        ]
    else:
        ok["speedup"] = float("nan")
    out = []
    for (pair, dataset, label), g in ok.groupby(["pair", "dataset", "label"], sort=True):
        out.append({
            "pair": pair, "dataset": dataset, "method": label, "seeds": len(g),
            "tokens/s": _fmt(g["tokens_per_s"].mean(), g["tokens_per_s"].std()),
            "speedup": _fmt(g["speedup"].mean(), g["speedup"].std()),
            "accepted/step": _fmt(g["accepted_per_step"].mean(), g["accepted_per_step"].std()),
            "J/token": _fmt(g["j_per_token"].mean(), g["j_per_token"].std(), 4),
            "perplexity": _fmt(g["perplexity"].mean(), g["perplexity"].std()),
            "score": _fmt(g["score"].mean(), g["score"].std()),
        })
    return cell_text, pd.DataFrame(out).to_string(index=False)


# ---------------------------------------------------------------------------------- driver


def run(cfg: DictConfig, root: Path | None = None) -> dict[str, Any]:
    """Plan, skip finished cells, run the rest on Ray, log to MLflow, print the tables."""
    root = Path(root or CONF_DIR.parent)
    t0 = time.perf_counter()
    plan = expand(cfg, root)  # every configuration error is raised here, before Ray
    cluster = OmegaConf.to_container(cfg.cluster, resolve=True)
    tracking = OmegaConf.to_container(cfg.tracking, resolve=True)
    uri = resolve_tracking_uri(tracking.get("uri") or "sqlite:///mlflow.db", root)
    art = tracking.get("artifact_root")
    if art and "://" not in art and not Path(art).is_absolute():
        art = str(root / art)
    experiment = tracking.get("experiment") or plan.name
    tracker = Tracker(uri, experiment, art)
    finished = tracker.finished_keys()
    failed_before = tracker.failed_runs()
    todo = [c for c in plan.cells if c["key"] not in finished]
    n_retry = sum(1 for c in todo if c["key"] in failed_before)
    print(
        f"sweep {plan.name!r}: {len(plan.cells)} cells ({', '.join(f'{k}: {v} samples' for k, v in plan.sample_counts.items())})",
        flush=True,
    )
    print(f"cells: {len(plan.cells)} total, {len(plan.cells) - len(todo)} finished, {len(todo)} to run"
          + (f" ({n_retry} failed before)" if n_retry else ""), flush=True)
    outcome = {"total": len(plan.cells), "skipped": len(plan.cells) - len(todo), "ran": 0, "finished": 0, "failed": 0, "results": []}
    if todo:
        started_ray = start_ray(cluster)
        import ray

        tracker.start_parent(
            run_name=f"{plan.name} {time.strftime('%Y-%m-%d %H:%M:%S')}",
            tags={"sweep": plan.name, "cluster": cluster.get("kind"), "ray_address": cluster.get("address") or "local",
                  "command": " ".join(sys.argv)},
            params={"sweep.name": plan.name, "cells.total": len(plan.cells), "cells.to_run": len(todo),
                    "cluster.kind": cluster.get("kind"), "ray.nodes": len([n for n in ray.nodes() if n.get("Alive")])},
        )
        status = "FAILED"
        try:
            opts, capacity = actor_options(cluster)
            print(f"ray: {len([n for n in ray.nodes() if n.get('Alive')])} node(s), {capacity} cell(s) in flight "
                  f"({'GPU' if opts.get('num_gpus') else 'CPU'} actors)", flush=True)
            _prepare_pairs(plan, opts)

            def on_result(cell, result):
                tracker.log_cell(cell, result)
                outcome["ran"] += 1
                outcome["finished" if result["status"] == "finished" else "failed"] += 1
                outcome["results"].append({"cell_key": cell["key"], "status": result["status"], "node_id": result.get("node_id"), "error": result.get("error")})
                if result["status"] != "finished":
                    from tqdm import tqdm

                    tqdm.write(f"FAILED {cell['label']} {cell['pair']['name']} {cell['dataset']['name']} seed={cell['seed']} [{cell['key']}]: {result.get('error')}", file=sys.stderr)

            run_cells(todo, cluster, on_result, progress=bool(cfg.get("progress", True)))
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            tracker.end_parent(status, {"cells_total": len(plan.cells), "cells_ran": outcome["ran"], "cells_finished": outcome["finished"],
                                        "cells_failed": outcome["failed"], "wall_s": time.perf_counter() - t0})
            if started_ray:
                ray.shutdown()
    rows = tracker.rows(c["key"] for c in plan.cells)
    base_label = next((c["label"] for c in plan.cells if c.get("baseline")), None)
    cell_text, mean_text = summary_tables(rows, base_label)
    print("\nper cell:\n" + cell_text)
    print(f"\nmean ± std over seeds (speedup: tokens/s over the {base_label or 'no'} baseline of the same pair, dataset and seed):\n" + mean_text)
    n_failed = sum(1 for r in rows if r.get("cell_status") != "finished")
    if n_failed:
        print(f"\n{n_failed} cell(s) failed; run the same command again to retry only those (errors: MLflow tag `error`, artifact traceback.txt).")
    print(f"\nwall time: {time.perf_counter() - t0:.1f} s")
    print(f"MLflow: experiment {experiment!r} in {uri}\n  open the UI: mlflow ui --backend-store-uri {uri} --port 5000"
          f"  (then http://127.0.0.1:5000, experiment {experiment!r}; select runs -> Compare)")
    outcome["rows"] = rows
    outcome["experiment"] = experiment
    outcome["tracking_uri"] = uri
    outcome["plan"] = plan
    return outcome


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        outcome = run(cfg)
    except SweepConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if outcome["failed"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
