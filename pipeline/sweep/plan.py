"""The sweep's plan: compose the Hydra config, expand the grid into cells, validate it before Ray starts.

Flow (docs/DESIGN.md sections 1 and 7), steps 1-3 of ``python -m pipeline.sweep``:

1. Hydra composes ``conf/config.yaml`` with a ``sweep/`` and a ``cluster/`` config and the overrides
   (``pipeline.sweep.compose``).
2. The grid is expanded into cells; every method/pair/dataset name is looked up in its config group,
   every method's parameters validated (``check_method``), every dataset's task spec and scorer checked,
   pairs, devices and data paths checked (``pipeline.sweep.checks``), before Ray starts: configuration
   errors stop here with a message naming the fix.
3. ``ar`` baseline cells are added for every (pair, dataset, seed, batch size) that has other methods;
   ``sweep.batch_sizes`` (default ``[1]``) is a grid axis like the seeds, its cells labelled
   ``<label> (batch B)`` above 1 (``cell_types.batch_label``), and a method that cannot batch says so here.

A cell is a ``pipeline.cell_types.Cell``; its key is the hash of its identity (``HARNESS_VERSION``,
method and resolved parameters, pair, dataset, seed, batch size, measurement protocol, hardware, precision, and the
content of the local weights it reads; the judge is not part of it): the same configuration on the same
weights gives the same key.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, cast

from omegaconf import DictConfig, OmegaConf

from pipeline.cell_types import Cell, batch_label, cell_key, split_batch_label, temperature_label
from pipeline.data.slices import load_slice
from pipeline.data.tasks import TaskSpec
from pipeline.decoding import DrafterContext, check_method, method_class
from pipeline.decoding.batched import check_batch
from pipeline.fingerprints import weights_identity
from pipeline.models import PairSpec
from pipeline.scoring.registry import check_task_scorer
from pipeline.sweep.axes import (
    batch_axis,
    every_method,
    largest_batches,
    rate_label,
    slice_label,
    temperature_axis,
    workload_axis,
)
from pipeline.sweep.checks import (
    check_cluster,
    check_dataset_numbers,
    check_device,
    check_judge,
    check_labels,
    check_measure,
    check_models_available,
    check_numbers,
    check_seeds,
    context_length,
)
from pipeline.sweep.compose import (
    CONF_DIR,
    SweepConfigError,
    check_command_line,
    check_conf_path,
    compose,
    entries,
    group_option,
    group_options,
    plain,
    selected,
)

__all__ = [
    "CONF_DIR",
    "HARNESS_VERSION",
    "Plan",
    "SweepConfigError",
    "check_command_line",
    "compose",
    "expand",
    "slice_label",
    "rate_label",
]

# Bump when a change to the harness changes what a cell measures (new cell keys). 2: CPU isolation.
# 3: (a) per-model precision: dtype `auto` by default (bf16 kernels on CPUs with native bf16, bf16 on CUDA),
# and the resolved dtypes, kernel paths and the CPU's bf16 capability in every cell's identity (the same
# config measures bf16 kernels on one machine and float32 on another), so every key changes, `ar`, `beam`
# and `mtjd` included (their cells now measure another precision); (b) drafters as plugins: a draft-based
# method's parameters carry only its drafter's own scope (`drafter: {kind: ngram, max_ngram: 3,
# min_ngram: 1}`, not max_ngram/min_ngram on every cell) and its cost ratio c is its own drafter's.
# 4: the content of the local weights a cell reads (target GGUF or folder, draft model, EAGLE or Medusa
# heads; ``fingerprints.weights_identity``) in its identity: retraining a checkpoint in models/ re-measures the
# cells that use it on resume, where before an old store served the old checkpoint's cells.
# 5: batch size as a measured axis: every cell's identity holds its ``batch_size`` (1 unless the sweep's
# ``batch_sizes`` asks for more; decoding/batched.py), so every key changes once.
# 6: the loop measures itself (pipeline/decoding/phase_clock.py): every cost metric is read off the loop's own clock
# (cost_ratio_c is MTAD's beams' cost, t_target_step_ms a plain step at the window's contexts, row_cost_v new), the
# warm-up drafts the calibration schedule, draft_cost: auto reads live costs, `disturbed` is the window's own drift:
# the same config measures other numbers, so every key changes once.
HARNESS_VERSION = "6"
DATASET_KEYS = (
    "name",
    "path",
    "split",
    "start",
    "limit",
    "ids",
    "max_new_tokens",
    "max_turns",
    "time_budget_s",
    "options",
)
AXES = ("batch_sizes", "rates", "temperatures")  # the grid's axes beyond the seeds (sweep.<axis>: [...])
SWEEP_KEYS = ("name", "methods", "method_overrides", "baseline", "pairs", "datasets", "seeds", *AXES)
# Keys a sweep may set in these sections beyond those conf/config.yaml declares (cluster: any conf/cluster/ file).
OPTIONAL_KEYS = {"measure": ("costs",), "judge": ("base_url", "api_key_env", "max_retries")}
ISOLATION_MODES = ("exclusive", "pinned", "shared")  # cluster.cpu_isolation (see ray_runner.actor_options)


@dataclass
class Plan:
    """The expanded sweep: cells in run order and what was checked."""

    name: str
    cells: list[Cell]
    sample_counts: dict[str, int] = field(default_factory=dict)
    baselines: dict[str, str] = field(default_factory=dict)
    """Each cell's key -> the key of the baseline cell it is compared with: the same pair, dataset, seed, batch size,
    rate and temperature (absent for cells of a group without a baseline)."""


# ---------------------------------------------------------------------------------- expansion


def _method_entry(cfg: DictConfig, name: str, overrides: dict[str, Any], common: Mapping[str, Any]) -> dict[str, Any]:
    if "__resolved__" in overrides:
        base = dict(overrides["__resolved__"])
        default = group_option(cfg, "method", name) if name in group_options("method", cfg) else {}
        label = overrides.get("label")
    else:
        # a method of one's own named `module:attr` needs no YAML: its declared Params are its defaults
        own = ":" in name and name not in group_options("method", cfg)
        base = {"name": name} if own else group_option(cfg, "method", name)
        default = dict(base)
        label = overrides.get("label")
        base.update({k: v for k, v in overrides.items() if k not in ("label", "batch_sizes")})
    base.update(common)
    method_name = base.pop("name", name)
    changed = {k: v for k, v in base.items() if default.get(k) != v}
    if not label:
        label = method_name + (
            ("(" + ",".join(f"{k}={v}" for k, v in sorted(changed.items())) + ")") if changed else ""
        )
    entry = {"config_name": name, "name": method_name, "params": base, "label": label}
    if overrides.get("batch_sizes") is not None:  # this entry's own batch axis (else the sweep's)
        entry["batch_sizes"] = batch_axis(overrides["batch_sizes"], f"sweep entry {label!r}: batch_sizes")
    return entry


def _pair_entry(cfg: DictConfig, name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    pair = dict(overrides["__resolved__"]) if "__resolved__" in overrides else group_option(cfg, "pair", name)
    pair.update({k: v for k, v in overrides.items() if k != "__resolved__"})
    pair.setdefault("name", name)
    try:
        PairSpec.from_config(pair)
    except ValueError as err:
        raise SweepConfigError(f"pair {name!r}: {err} (fix conf/pair/{name}.yaml or the override)") from None
    return pair


def _task(cfg: DictConfig, name: str, ds: Mapping[str, Any]) -> TaskSpec:
    """The dataset config's task spec (its ``task:``, else that of the dataset it names), with its scorer checked."""
    task = ds.get("task")
    if task is None:
        if ds["name"] not in group_options("dataset", cfg):
            raise SweepConfigError(
                f"dataset config {name!r} names dataset {ds['name']!r}, which has no conf/dataset/{ds['name']}.yaml "
                f"with a `task:`; add one (docs/extending.md) or give this file a `task:`"
            )
        task = group_option(cfg, "dataset", ds["name"]).get("task")
    if task is None:
        raise SweepConfigError(
            f"dataset {ds['name']!r} has no `task:` in conf/dataset/{ds['name']}.yaml (loader, stop strings, "
            "scorer: docs/extending.md)"
        )
    spec = TaskSpec.from_config(str(ds["name"]), task)
    check_task_scorer(spec)
    return spec


def _dataset_entry(cfg: DictConfig, name: str, overrides: dict[str, Any], root: Path) -> dict[str, Any]:
    ds = dict(overrides["__resolved__"]) if "__resolved__" in overrides else group_option(cfg, "dataset", name)
    extra = {k: v for k, v in overrides.items() if k != "__resolved__"}
    unknown = sorted(set(extra) - set(DATASET_KEYS))
    if unknown:
        raise SweepConfigError(f"dataset {name!r}: unknown key(s) {unknown}; valid keys: {list(DATASET_KEYS)}")
    ds.update(extra)
    ds.setdefault("name", name)
    task = _task(cfg, name, ds)
    unknown = sorted(set(ds) - set(DATASET_KEYS) - {"task"})
    if unknown:
        raise SweepConfigError(
            f"dataset {name!r}: unknown key(s) {unknown} (conf/dataset/{name}.yaml); valid keys: {list(DATASET_KEYS)}"
        )
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
        raise SweepConfigError(
            f"dataset {name!r}: max_new_tokens must be an integer >= 1, got {ds['max_new_tokens']!r}"
        )
    ds["task"] = task.to_dict()
    return ds


def _declared_keys(section: str, root: Path) -> set[str]:
    """The keys ``conf/config.yaml`` declares for ``section`` (``cluster``: any file of ``conf/cluster/``)."""
    conf = root / "conf" if (root / "conf" / "config.yaml").exists() else CONF_DIR
    if section == "cluster":
        files = sorted((conf / "cluster").glob("*.yaml"))
        return set().union(*(set(OmegaConf.load(f) or {}) for f in files)) - {"defaults"}
    node = cast(DictConfig, OmegaConf.load(conf / "config.yaml")).get(section)
    return set(node or {}) | set(OPTIONAL_KEYS.get(section, ()))


def _check_section_keys(cfg: DictConfig, section: str, root: Path) -> None:
    node = cfg.get(section)
    if node is None:
        return
    valid = _declared_keys(section, root)
    unknown = sorted(set(node) - valid)
    if unknown:
        where = "conf/cluster/*.yaml" if section == "cluster" else "conf/config.yaml"
        raise SweepConfigError(
            f"unknown key(s) {unknown} in `{section}:` (a sweep file or an override); valid keys: {sorted(valid)} "
            f"(declared in {where})"
        )


def expand(cfg: DictConfig, root: Path | None = None) -> Plan:
    """Expand and validate the grid (no Ray, no models): the cells in run order."""
    root = Path(root or CONF_DIR.parent)
    sweep = cfg.sweep
    if sweep is None or not sweep.get("name"):
        raise SweepConfigError("no sweep selected: pass sweep=<name>; valid sweeps: " + str(group_options("sweep")))
    unknown = sorted(set(sweep) - set(SWEEP_KEYS))
    if unknown:
        raise SweepConfigError(
            f"sweep {sweep.name!r}: unknown key(s) {unknown} under `sweep:`; valid keys: {list(SWEEP_KEYS)}"
        )
    for section in ("measure", "judge", "cluster", "tracking"):
        _check_section_keys(cfg, section, root)
    check_conf_path(plain(cfg.get("conf_path")))
    common = plain(sweep.get("method_overrides")) or {}
    method_items = selected(cfg, "method") or every_method(entries(plain(sweep.get("methods")), "method"))
    pair_items = selected(cfg, "pair") or entries(plain(sweep.get("pairs")), "pair")
    dataset_items = selected(cfg, "dataset") or entries(plain(sweep.get("datasets")), "dataset")
    seeds = plain(cfg.seeds) if cfg.get("seeds") is not None else plain(sweep.get("seeds"))
    if isinstance(seeds, int):
        seeds = [seeds]
    bad_seeds = check_seeds(seeds)
    if bad_seeds:
        raise SweepConfigError("; ".join(bad_seeds))
    batch_sizes = (
        batch_axis(sweep.get("batch_sizes"), "sweep.batch_sizes") if sweep.get("batch_sizes") is not None else [1]
    )
    for what, items in (("methods", method_items), ("pairs", pair_items), ("datasets", dataset_items)):
        if not items:
            raise SweepConfigError(f"sweep.{what} is empty")
    try:  # the workload (conf/workload/) and its rate axis, the temperature axis, before any model loads
        workload, rates = workload_axis(cfg, sweep.get("rates"))
        temperatures = temperature_axis(sweep.get("temperatures"))
    except ValueError as err:
        raise SweepConfigError(str(err)) from None

    errors: list[str] = []

    def attempt(fn, *args):
        try:
            return fn(*args)
        except ValueError as err:  # SweepConfigError, TaskSpecError and the checkers' own ValueErrors
            errors.append(str(err))
        return None

    methods = [m for m in (attempt(_method_entry, cfg, n, o, common) for n, o in method_items) if m]
    baseline_name = sweep.get("baseline")
    baseline = attempt(_method_entry, cfg, baseline_name, {}, common) if baseline_name else None
    errors += check_labels(methods, baseline)
    pairs = [p for p in (attempt(_pair_entry, cfg, n, o) for n, o in pair_items) if p]
    datasets = [d for d in (attempt(_dataset_entry, cfg, n, o, root) for n, o in dataset_items) if d]
    cluster_cfg = cast(dict[str, Any], OmegaConf.to_container(cfg.cluster, resolve=True)) or {}
    for pair in pairs:
        attempt(check_models_available, pair)
        attempt(check_device, pair, cluster_cfg)
    judge_cfg = (
        cast(dict[str, Any], OmegaConf.to_container(cfg.judge, resolve=True)) if cfg.get("judge") is not None else {}
    )
    ranges = (
        check_measure(cast(dict[str, Any], OmegaConf.to_container(cfg.measure, resolve=True)) or {})
        + check_cluster(cluster_cfg)
        + check_judge(judge_cfg or {})
    )
    # every number of every setting a cell or the driver reads, whatever its key: finite and within int64
    generic = [
        e
        for section in sorted(set(cfg) - {"method", "pair", "dataset", "sweep", "seeds", "hydra"})
        for e in check_numbers(plain(cfg.get(section)), section)
    ]
    for m in methods + ([baseline] if baseline else []):
        generic += [f"method {m['label']!r}: {e}" for e in check_numbers(m["params"], "method")]
    for pair in pairs:
        generic += [f"pair {pair['name']!r}: {e}" for e in check_numbers(pair, "pair")]
    for ds in datasets:
        generic += [f"dataset {ds['name']!r}: {e}" for e in check_numbers({k: ds[k] for k in DATASET_KEYS}, "dataset")]
        ranges += check_dataset_numbers(str(ds["name"]), ds)
    said = {e.split("=", 1)[0] for e in ranges}  # a key with its own range check is reported once, by it
    errors += ranges + [e for e in generic if e.split("=", 1)[0] not in said]
    for pair in pairs:
        context = context_length(pair) if not any(f"pair {pair['name']!r}" in e for e in errors) else None
        for ds in datasets:
            if context is not None and ds["max_new_tokens"] >= context:
                errors.append(
                    f"dataset {ds['name']!r}: max_new_tokens={ds['max_new_tokens']} does not fit the context of "
                    f"pair {pair['name']!r}'s target ({context} positions, prompt included): "
                    f"set dataset.max_new_tokens below {context} minus the prompt length"
                )
    resolved_params: dict[tuple[Any, ...], dict[str, Any]] = {}  # (label, pair[, temperature]) -> parameters
    for m in methods + ([baseline] if baseline else []):
        for pair in pairs:
            try:
                resolved_params[(m["label"], pair["name"])] = check_method(
                    m["name"], m["params"], drafters=DrafterContext.of_pair(pair)
                )
            except ValueError as err:
                where = (
                    f"the module {m['config_name'].partition(':')[0]!r} of {m['config_name']!r}"
                    if ":" in str(m["config_name"]) and m["config_name"] not in group_options("method", cfg)
                    else f"conf/method/{m['config_name']}.yaml"
                )
                errors.append(f"{err} (sweep entry {m['label']!r}, pair {pair['name']!r}; fix the override or {where})")
                continue
            for t in temperatures or ():  # the temperature axis: each entry at each temperature, checked as such
                try:
                    resolved_params[(m["label"], pair["name"], t)] = check_method(
                        m["name"], dict(m["params"], temperature=t), drafters=DrafterContext.of_pair(pair)
                    )
                except ValueError as err:
                    errors.append(f"{err} (sweep entry {m['label']!r} at sweep.temperatures {t:g})")
            own = m.get("batch_sizes") or batch_sizes
            if m is baseline:  # the baseline runs at every batch size some entry runs at
                own = sorted({b for e in methods for b in (e.get("batch_sizes") or batch_sizes)})
            for b in own:  # before any model loads: a method that decodes one sequence at a time says so
                try:
                    check_batch(method_class(m["name"]), resolved_params[(m["label"], pair["name"])], b)
                except ValueError as err:
                    where = "its batch_sizes" if m.get("batch_sizes") else "sweep.batch_sizes"
                    errors.append(f"{err} (sweep entry {m['label']!r}, {where} {own})")
                    break
    counts: dict[str, int] = {}
    for ds in datasets:
        if any(e.startswith(f"dataset {ds['name']!r}: dataset.") for e in errors):
            continue  # its slice's numbers are wrong (said above): the loader's own error would say it again
        try:
            measured, _, _ = load_slice(ds)
            if not measured:
                raise ValueError("the slice is empty (check start/limit/ids)")
            counts[slice_label(ds)] = len(measured)
            for where, largest in largest_batches(methods, batch_sizes):
                if largest > len(measured):
                    errors.append(
                        f"{where} has {largest} but dataset {ds['name']!r}'s slice has "
                        f"{len(measured)} requests: a batch holds at most the slice's requests (lower the batch size "
                        "or raise dataset.limit)"
                    )
        except Exception as err:  # noqa: BLE001 - any loader failure is a configuration error here
            errors.append(
                f"dataset {ds['name']!r} ({ds.get('path') or 'Hub/package copy'}): {type(err).__name__}: {err}"
            )
    judge: dict[str, Any] = (
        cast(dict[str, Any], OmegaConf.to_container(cfg.judge, resolve=True))
        if cfg.get("judge") is not None
        else {"enabled": False}
    )
    if judge.get("enabled"):
        for scorer in {
            s.name: s for s in (check_task_scorer(TaskSpec.from_dict(d["task"])) for d in datasets) if s
        }.values():
            attempt(scorer.check, judge)  # each scorer checks the judge config it would use
    for label, n in counts.items():  # workload.requests within each slice
        try:
            workload.count(n)
        except ValueError as err:
            errors.append(f"dataset {label}: {err}")
    if methods:
        try:
            workload.check_slots(max(b for m in methods for b in (m.get("batch_sizes") or batch_sizes)))
        except ValueError as err:
            errors.append(str(err))
    isolation = (cast(dict[str, Any], OmegaConf.to_container(cfg.cluster, resolve=True)) or {}).get(
        "cpu_isolation"
    ) or "exclusive"
    if isolation not in ISOLATION_MODES:
        errors.append(f"cluster.cpu_isolation={isolation!r}; valid: {', '.join(ISOLATION_MODES)}")
    if errors:
        raise SweepConfigError("the sweep cannot run:\n  - " + "\n  - ".join(errors))

    measure = cast(dict[str, Any], OmegaConf.to_container(cfg.measure, resolve=True))
    cluster = cast(dict[str, Any], OmegaConf.to_container(cfg.cluster, resolve=True))
    fault = OmegaConf.to_container(cfg.fault_injection, resolve=True) if cfg.get("fault_injection") else None
    cells: dict[str, Cell] = {}
    baselines: dict[str, str] = {}
    all_batches = sorted({b for m in methods for b in (m.get("batch_sizes") or batch_sizes)})
    axis: list[float | None] = list(rates) if rates else [None]  # the rate axis (None: the workload's own rate)
    temps: list[float | None] = list(temperatures) if temperatures else [None]  # None: each entry's own
    for pair, ds, seed, batch, rate, temp in itertools.product(pairs, datasets, seeds, all_batches, axis, temps):
        group = [m for m in methods if batch in (m.get("batch_sizes") or batch_sizes)]
        if baseline and any(m["name"] != baseline["name"] or m["params"] != baseline["params"] for m in group):
            group = [baseline] + [m for m in group if m["label"] != baseline["label"]]
        at = workload if rate is None else replace(workload, rate=rate)
        keys, base_key = [], None
        for m in group:
            is_baseline = baseline is not None and m["label"] == baseline["label"]
            entry = dict(m, label=rate_label(batch_label(temperature_label(m["label"], temp), batch), rate))
            cell = _make_cell(
                sweep.name,
                entry,
                resolved_params[(m["label"], pair["name"]) if temp is None else (m["label"], pair["name"], temp)],
                pair,
                ds,
                seed,
                measure,
                judge,
                cluster,
                fault,
                is_baseline,
                batch,
                at.identity(),
            )
            keys.append(cell.key)
            base_key = cell.key if is_baseline else base_key
            same = cells.setdefault(cell.key, cell)
            if same.label != cell.label:  # one configuration under two labels: one would be dropped without a word
                raise SweepConfigError(
                    f"sweep entries {split_batch_label(same.label)[0]!r} and {m['label']!r} are the same configuration "
                    f"(method, parameters{', batch size' if batch > 1 else ''}): drop one of them"
                )
        if base_key is not None:
            baselines.update(dict.fromkeys(keys, base_key))
    return Plan(name=str(sweep.name), cells=list(cells.values()), sample_counts=counts, baselines=baselines)


def _make_cell(
    sweep_name: str,
    method: Mapping[str, Any],
    params: dict[str, Any],
    pair: dict[str, Any],
    ds: dict[str, Any],
    seed: int,
    measure: dict[str, Any],
    judge: Mapping[str, Any],
    cluster: Mapping[str, Any],
    fault: Any,
    baseline: bool,
    batch_size: int = 1,
    workload: dict[str, Any] | None = None,
) -> Cell:
    scorer = check_task_scorer(TaskSpec.from_dict(ds["task"]))
    cell = Cell(
        key="",
        sweep=sweep_name,
        label=method["label"],
        method=method["name"],
        params=params,
        method_config=method["config_name"],
        pair=pair,
        dataset=ds,
        seed=seed,
        measure=measure,
        hardware=cluster.get("accelerator_type") or "any",
        harness=HARNESS_VERSION,
        batch_size=batch_size,
        workload=workload,
        weights=weights_identity(pair, method["name"], params),
        # the judge scores the generations, it does not change them: not part of the key (Cell.identity)
        judge=dict(judge) if (judge.get("enabled") and scorer is not None and scorer.uses_judge) else None,
        baseline=baseline,
        fault=fault,
        precision=PairSpec.from_config(pair).precision(predicted=True),
    )
    return replace(cell, key=cell_key(cell.identity))  # the key is the hash of the identity (Cell.identity)
