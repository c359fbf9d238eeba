"""The sweep's plan: compose the Hydra config, expand the grid into cells, validate it before Ray starts.

Flow (docs/DESIGN.md sections 1 and 7), steps 1-3 of ``python -m pipeline.sweep``:

1. Hydra composes ``conf/config.yaml`` with a ``sweep/`` and a ``cluster/`` config and the overrides.
2. The grid is expanded into cells; every method/pair/dataset name is looked up in its config group
   and every method's parameters validated (``check_method``), pairs and data paths checked, before
   Ray starts: configuration errors stop here with a message naming the fix.
3. ``ar`` baseline cells are added for every (pair, dataset, seed) that has other methods.

A cell is a ``pipeline.cell_types.Cell``; its key is the hash of its identity (``HARNESS_VERSION``,
method and resolved parameters, pair, dataset, seed, measurement protocol, hardware; the judge is not
part of it): the same configuration gives the same key.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import gguf
import torch
import yaml
from huggingface_hub import try_to_load_from_cache
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from pipeline.cell_types import Cell, cell_key
from pipeline.data.slices import load_slice
from pipeline.data.tasks import TaskSpec
from pipeline.decoding import DrafterContext, check_method
from pipeline.models import ModelNotAvailableError, PairSpec
from pipeline.scoring.registry import check_task_scorer

# Bump when a change to the harness changes what a cell measures (new cell keys). 2: CPU isolation.
# 3: (a) per-model precision: dtype `auto` by default (bf16 kernels on CPUs with native bf16, bf16 on CUDA),
# and the resolved dtypes, kernel paths and the CPU's bf16 capability in every cell's identity (the same
# config measures bf16 kernels on one machine and float32 on another), so every key changes, `ar`, `beam`
# and `mtjd` included (their cells now measure another precision); (b) drafters as plugins: a draft-based
# method's parameters carry only its drafter's own scope (`drafter: {kind: ngram, max_ngram: 3,
# min_ngram: 1}`, not max_ngram/min_ngram on every cell) and its cost ratio c is its own drafter's.
HARNESS_VERSION = "3"
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
GROUP_KEYS = {"method": "methods", "pair": "pairs", "dataset": "datasets"}
DATASET_KEYS = ("name", "path", "split", "start", "limit", "ids", "max_new_tokens", "max_turns", "time_budget_s", "options")
SWEEP_KEYS = ("name", "methods", "method_overrides", "baseline", "pairs", "datasets", "seeds")
# Keys a sweep may set in these sections beyond those conf/config.yaml declares (cluster: any conf/cluster/ file).
OPTIONAL_KEYS = {"measure": ("costs",), "judge": ("base_url", "api_key_env", "max_retries")}


ISOLATION_MODES = ("exclusive", "pinned", "shared")  # cluster.cpu_isolation (see ray_runner.actor_options)


class SweepConfigError(ValueError):
    """A sweep configuration that cannot run; raised before Ray starts."""


@dataclass
class Plan:
    """The expanded sweep: cells in run order and what was checked."""

    name: str
    cells: list[Cell]
    sample_counts: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------------------- composition


def compose(overrides: Sequence[str] = (), config_dir: str | Path | None = None) -> DictConfig:
    """Compose the sweep config outside ``@hydra.main`` (tests, notebooks); leaves Hydra initialised.
    A group selection naming a missing or broken file is a :class:`SweepConfigError` (as on the command line)."""
    check_command_line(overrides, Path(config_dir or CONF_DIR))
    GlobalHydra.instance().clear()
    initialize_config_dir(config_dir=str(Path(config_dir or CONF_DIR).resolve()), version_base="1.3")
    conf_path = [o for o in overrides if o.split("=", 1)[0].lstrip("+") == "conf_path"]
    folders = OverridesParser.create().parse_overrides(conf_path)[-1].value() if conf_path else None
    return hydra_compose(config_name="config", overrides=[*overrides, *_search_path(folders)])


def _search_path(folders: Any) -> list[str]:
    """The Hydra override that searches ``conf_path``'s folders after conf/ (none when there are none)."""
    folders = [folders] if isinstance(folders, str) else list(folders or [])
    if not folders:
        return []
    return ["hydra.searchpath=[" + ",".join("file://" + str(Path(str(f)).expanduser().resolve()) for f in folders) + "]"]


SELECTABLE_GROUPS = ("method", "pair", "dataset", "sweep", "cluster")


def _yaml_problem(path: Path) -> str | None:
    """Why ``path`` is not a usable config file (a YAML syntax error with its line, or not a mapping); None if fine."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{path} is not valid YAML{where}: {err.problem or err.context}"
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as err:
        return f"{path} cannot be read as YAML: {err}"
    if data is not None and not isinstance(data, dict):
        return f"{path} is a YAML {type(data).__name__}, not a mapping of keys (e.g. `name: ...`)"
    return None


def check_group_file(group: str, name: str, conf_dir: Path | None = None) -> None:
    """``conf/<group>/<name>.yaml`` exists and is a YAML mapping; else a :class:`SweepConfigError` naming the fix."""
    conf = Path(conf_dir or CONF_DIR)
    path = conf / group / f"{name}.yaml"
    if not path.is_file():
        valid = sorted(str(p.relative_to(conf / group))[:-5] for p in (conf / group).rglob("*.yaml"))
        raise SweepConfigError(f"unknown {group} {name!r} ({group}={name}): there is no {path}; valid {group}s: {valid} "
                               f"(add conf/{group}/{name}.yaml or pick one of these)")
    problem = _yaml_problem(path)
    if problem:
        raise SweepConfigError(f"{group}={name}: {problem}; fix the file or pick another {group}")


def check_command_line(argv: Sequence[str], conf_dir: Path | None = None) -> None:
    """Group selections on the command line (``method=``, ``pair=``, ``dataset=``, ``sweep=``, ``cluster=``) name
    files that exist and parse, checked before Hydra composes (whose own errors are tracebacks with exit 1)."""
    args = list(argv)
    if any(a.lstrip("+").startswith(("hydra.searchpath", "conf_path", "--config-dir", "-cd", "--config-path", "-cp")) for a in args):
        return  # another config tree: Hydra resolves it
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+")
        if key not in SELECTABLE_GROUPS:
            continue
        for name in value.split(","):
            name = name.strip().strip("'\"")
            if name and name != "null":
                check_group_file(key, name, conf_dir)


def _group_options(group: str, cfg: DictConfig | None = None) -> list[str]:
    """The names of a config group, in conf/ and in ``cfg.conf_path``'s folders."""
    folders = cfg.get("conf_path") if cfg is not None else None
    return sorted(GlobalHydra.instance().config_loader().get_group_options(group, overrides=_search_path(folders)))


def _group_option(cfg: DictConfig, group: str, name: str) -> dict[str, Any]:
    """``conf/<group>/<name>.yaml`` (or a ``conf_path`` folder's) resolved in the context of ``cfg`` (so ``${data_root}`` works)."""
    options = _group_options(group, cfg)
    if name not in options:
        raise SweepConfigError(
            f"unknown {group} {name!r} in sweep.{GROUP_KEYS[group]}; valid {group}s: {options} "
            f"(add conf/{group}/{name}.yaml or pick one of these)"
        )
    search = _search_path(cfg.get("conf_path"))
    for folder in [_conf_dir(), *[Path(str(f)).expanduser() for f in (cfg.get("conf_path") or [])]]:
        if folder is not None and (folder / group / f"{name}.yaml").is_file():
            check_group_file(group, name, folder)
            break
    try:
        node = hydra_compose(config_name="config", overrides=[f"{group}={name}", *search])[group]
    except Exception as err:  # noqa: BLE001 - Hydra/OmegaConf errors on a broken group file
        raise SweepConfigError(f"conf/{group}/{name}.yaml cannot be composed: {' '.join(str(err).split())[:300]}") from None
    if not isinstance(node, DictConfig):
        raise SweepConfigError(f"conf/{group}/{name}.yaml is not a mapping of keys (got {type(node).__name__})")
    context = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    OmegaConf.set_struct(context, False)
    context[group] = node
    return OmegaConf.to_container(context[group], resolve=True)


def _conf_dir() -> Path | None:
    """The config folder Hydra composes from (the primary file search path), if it is a folder."""
    try:
        sources = GlobalHydra.instance().config_loader().get_sources()
    except Exception:  # noqa: BLE001 - not initialised
        return None
    for source in sources:
        if source.scheme() == "file" and Path(source.path, "config.yaml").is_file():
            return Path(source.path)
    return None


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
        default = _group_option(cfg, "method", name) if name in _group_options("method", cfg) else {}
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
    pair = dict(overrides["__resolved__"]) if "__resolved__" in overrides else _group_option(cfg, "pair", name)
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
        if ds["name"] not in _group_options("dataset", cfg):
            raise SweepConfigError(f"dataset config {name!r} names dataset {ds['name']!r}, which has no conf/dataset/{ds['name']}.yaml "
                                   f"with a `task:`; add one (docs/extending.md) or give this file a `task:`")
        task = _group_option(cfg, "dataset", ds["name"]).get("task")
    if task is None:
        raise SweepConfigError(f"dataset {ds['name']!r} has no `task:` in conf/dataset/{ds['name']}.yaml (loader, stop strings, "
                               "scorer: docs/extending.md)")
    spec = TaskSpec.from_config(str(ds["name"]), task)
    check_task_scorer(spec)
    return spec


def _dataset_entry(cfg: DictConfig, name: str, overrides: dict[str, Any], root: Path) -> dict[str, Any]:
    ds = dict(overrides["__resolved__"]) if "__resolved__" in overrides else _group_option(cfg, "dataset", name)
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
        raise SweepConfigError(f"dataset {name!r}: max_new_tokens must be an integer >= 1, got {ds['max_new_tokens']!r}")
    ds["task"] = task.to_dict()
    return ds


def slice_label(ds: Mapping[str, Any]) -> str:
    """``humaneval[0:20]``, ``spider[ids=5]``, ``mt_bench``: a dataset slice as the driver names it."""
    if ds.get("ids") is not None:
        return f"{ds['name']}[ids={len(ds['ids'])}]"
    start, limit = int(ds.get("start") or 0), ds.get("limit")
    if not start and limit is None:
        return str(ds["name"])
    return f"{ds['name']}[{start}:{'' if limit is None else start + int(limit)}]"


def _check_models_available(pair: Mapping[str, Any]) -> None:
    """Offline (HF_HUB_OFFLINE=1): every model must be a local folder, an installed package or cached."""
    spec = PairSpec.from_config(pair)
    for role, model in (("target", spec.target), ("draft", spec.draft)):
        if model is None:
            continue
        if not model.package and not model.random_init and _looks_like_a_path(model.id) and not Path(model.location()).exists():
            raise SweepConfigError(
                f"pair {pair['name']!r} {role} model folder {model.id!r} does not exist ({Path(model.location()).expanduser()}): "
                "point the pair's `id` at an existing folder (relative paths are taken from the repository), "
                "or use a Hugging Face repo id (`org/name`)")
        try:
            location = model.location()
        except ModelNotAvailableError as err:
            raise SweepConfigError(f"pair {pair['name']!r} {role}: {err}") from None
        if Path(location).exists() or os.environ.get("HF_HUB_OFFLINE", "0") in ("0", "", "false"):
            continue
        cached = try_to_load_from_cache(location, "config.json", revision=model.revision)
        if not isinstance(cached, str):
            raise SweepConfigError(
                f"pair {pair['name']!r} {role} model {model.id!r} is not available offline (HF_HUB_OFFLINE=1 "
                "and not in the Hugging Face cache): download it where the Hub is reachable "
                "(`huggingface-cli download <id>`), point the pair's `id` at a local folder, unset "
                "HF_HUB_OFFLINE on a machine with Hub access, or use pair=smollm2-offline"
            )


def _looks_like_a_path(model_id: str) -> bool:
    """A local folder rather than a Hub repo id (``org/name``): absolute, ``./``, ``../``, ``~``, several parts,
    or a first part that is a folder here (``models/<name>``)."""
    text = str(model_id)
    if text.startswith(("/", "./", "../", "~")) or text in (".", "..") or text.count("/") > 1:
        return True
    first = text.split("/", 1)[0]
    return "/" in text and any((base / first).is_dir() for base in (CONF_DIR.parent, Path.cwd()))


_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx", "max_sequence_length")


def _context_from_config(config: Mapping[str, Any]) -> int | None:
    for node in (config, config.get("text_config") or {}):
        for key in _CONTEXT_KEYS:
            value = node.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def context_length(pair: Mapping[str, Any]) -> int | None:
    """The target's context (positions), from its config (random init, a local folder, the Hub cache, a
    GGUF file's metadata); None when it cannot be read without loading the model."""
    target = PairSpec.from_config(pair).target
    if target.random_init:
        return _context_from_config(dict(target.config or {}))
    try:
        location = Path(target.location())
    except ModelNotAvailableError:
        return None
    try:
        if location.is_dir() and target.gguf_file and (location / target.gguf_file).is_file():
            reader = gguf.GGUFReader(str(location / target.gguf_file))
            for name, field_ in reader.fields.items():
                if name.endswith(".context_length"):
                    return int(field_.parts[field_.data[0]][0])
            return None
        config_file = location / "config.json" if location.is_dir() else None
        if config_file is None or not config_file.is_file():
            cached = try_to_load_from_cache(str(target.id), "config.json", revision=target.revision)
            config_file = Path(cached) if isinstance(cached, str) else None
        if config_file is not None:
            return _context_from_config(json.loads(config_file.read_text()))
    except (OSError, ValueError, KeyError, IndexError, ImportError):
        return None
    return None


def _check_device(pair: Mapping[str, Any], cluster: Mapping[str, Any]) -> None:
    """The pair's device exists where its cells run: a valid torch device; CUDA only where there is a GPU."""
    device = str(pair.get("device") or "auto")
    fix = "set the pair's device to auto (the GPU when a cell has one, else the CPU) or cpu (pair.device=auto)"
    if device == "auto":
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise SweepConfigError(f"pair {pair['name']!r}: device {device!r} is not a torch device ({err}); {fix}") from None
    local = (cluster.get("kind") or "local") == "local" and not cluster.get("address")
    if dev.type == "cuda":
        if local and not torch.cuda.is_available():
            raise SweepConfigError(f"pair {pair['name']!r}: device {device!r} but this machine has no CUDA GPU; {fix}")
        visible = int(cluster.get("gpus_per_cell") or 1)  # a GPU cell sees only the GPU(s) Ray gave it
        if local and torch.cuda.is_available():
            visible = min(visible, torch.cuda.device_count())
        if dev.index is not None and dev.index >= visible:
            raise SweepConfigError(
                f"pair {pair['name']!r}: device {device!r} but a cell sees {visible} GPU(s) (cuda:0..cuda:{visible - 1}: Ray gives "
                f"each cell its own, cluster.gpus_per_cell={cluster.get('gpus_per_cell') or 1}); {fix} or cuda")
    elif dev.type == "mps" and local and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise SweepConfigError(f"pair {pair['name']!r}: device {device!r} but MPS is not available here; {fix}")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise SweepConfigError(f"pair {pair['name']!r}: device {device!r} is not supported (cpu, cuda, cuda:N, mps, auto); {fix}")


_MEASURE_RULES = {  # key: (types, minimum, what)
    "warmup_generations": (int, 0, "an integer >= 0"),
    "warmup_samples": (int, 0, "an integer >= 0"),
    "warmup_seconds": ((int, float), 0, "a number >= 0"),
    "idle_seconds": ((int, float), 0, "a number >= 0"),
    "threads": (int, 1, "null or an integer >= 1"),
}
ENERGY_METERS = ("auto", "nvml", "rapl", "none")


def _check_measure(measure: Mapping[str, Any]) -> list[str]:
    errors = []
    for key, (types, low, what) in _MEASURE_RULES.items():
        value = measure.get(key)
        if value is None and key == "threads":
            continue
        if isinstance(value, bool) or not isinstance(value, types) or value < low:
            errors.append(f"measure.{key}={value!r}: must be {what} (e.g. measure.{key}={max(low, 1)})")
    for key in ("perplexity", "score"):
        if key in measure and not isinstance(measure[key], bool):
            errors.append(f"measure.{key}={measure[key]!r}: must be true or false")
    if measure.get("energy_meter", "auto") not in ENERGY_METERS:
        errors.append(f"measure.energy_meter={measure.get('energy_meter')!r}: valid: {', '.join(ENERGY_METERS)}")
    return errors


def _declared_keys(section: str, root: Path) -> set[str]:
    """The keys ``conf/config.yaml`` declares for ``section`` (``cluster``: any file of ``conf/cluster/``)."""
    conf = root / "conf" if (root / "conf" / "config.yaml").exists() else CONF_DIR
    if section == "cluster":
        files = sorted((conf / "cluster").glob("*.yaml"))
        return set().union(*(set(OmegaConf.load(f) or {}) for f in files)) - {"defaults"}
    node = OmegaConf.load(conf / "config.yaml").get(section)
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
        raise SweepConfigError("no sweep selected: pass sweep=<name>; valid sweeps: " + str(_group_options("sweep")))
    unknown = sorted(set(sweep) - set(SWEEP_KEYS))
    if unknown:
        raise SweepConfigError(f"sweep {sweep.name!r}: unknown key(s) {unknown} under `sweep:`; valid keys: {list(SWEEP_KEYS)}")
    for section in ("measure", "judge", "cluster", "tracking"):
        _check_section_keys(cfg, section, root)
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
        except ValueError as err:  # SweepConfigError, TaskSpecError and the checkers' own ValueErrors
            errors.append(str(err))
        return None

    methods = [m for m in (attempt(_method_entry, cfg, n, o, common) for n, o in method_items) if m]
    baseline_name = sweep.get("baseline")
    baseline = attempt(_method_entry, cfg, baseline_name, {}, common) if baseline_name else None
    pairs = [p for p in (attempt(_pair_entry, cfg, n, o) for n, o in pair_items) if p]
    datasets = [d for d in (attempt(_dataset_entry, cfg, n, o, root) for n, o in dataset_items) if d]
    cluster_cfg = OmegaConf.to_container(cfg.cluster, resolve=True) or {}
    for pair in pairs:
        attempt(_check_models_available, pair)
        attempt(_check_device, pair, cluster_cfg)
    errors += _check_measure(OmegaConf.to_container(cfg.measure, resolve=True) or {})
    for pair in pairs:
        context = context_length(pair) if not any(f"pair {pair['name']!r}" in e for e in errors) else None
        for ds in datasets:
            if context is not None and ds["max_new_tokens"] >= context:
                errors.append(
                    f"dataset {ds['name']!r}: max_new_tokens={ds['max_new_tokens']} does not fit the context of pair {pair['name']!r}'s "
                    f"target ({context} positions, prompt included): set dataset.max_new_tokens below {context} minus the prompt length")
    resolved_params: dict[tuple[str, str], dict[str, Any]] = {}
    for m in methods + ([baseline] if baseline else []):
        for pair in pairs:
            try:
                resolved_params[(m["label"], pair["name"])] = check_method(m["name"], m["params"], drafters=DrafterContext.of_pair(pair))
            except ValueError as err:
                errors.append(f"{err} (sweep entry {m['label']!r}, pair {pair['name']!r}; fix the override or conf/method/{m['config_name']}.yaml)")
    counts: dict[str, int] = {}
    for ds in datasets:
        try:
            measured, _, _ = load_slice(ds)
            if not measured:
                raise ValueError("the slice is empty (check start/limit/ids)")
            counts[slice_label(ds)] = len(measured)
        except Exception as err:  # noqa: BLE001 - any loader failure is a configuration error here
            errors.append(f"dataset {ds['name']!r} ({ds.get('path') or 'Hub/package copy'}): {type(err).__name__}: {err}")
    judge = OmegaConf.to_container(cfg.judge, resolve=True) if cfg.get("judge") is not None else {"enabled": False}
    if judge.get("enabled"):
        for scorer in {s.name: s for s in (check_task_scorer(TaskSpec.from_dict(d["task"])) for d in datasets) if s}.values():
            attempt(scorer.check, judge)  # each scorer checks the judge config it would use
    isolation = (OmegaConf.to_container(cfg.cluster, resolve=True) or {}).get("cpu_isolation") or "exclusive"
    if isolation not in ISOLATION_MODES:
        errors.append(f"cluster.cpu_isolation={isolation!r}; valid: {', '.join(ISOLATION_MODES)}")
    if errors:
        raise SweepConfigError("the sweep cannot run:\n  - " + "\n  - ".join(errors))

    measure = OmegaConf.to_container(cfg.measure, resolve=True)
    cluster = OmegaConf.to_container(cfg.cluster, resolve=True)
    fault = OmegaConf.to_container(cfg.fault_injection, resolve=True) if cfg.get("fault_injection") else None
    cells: dict[str, Cell] = {}
    for pair, ds, seed in itertools.product(pairs, datasets, seeds):
        group = list(methods)
        if baseline and any(m["name"] != baseline["name"] or m["params"] != baseline["params"] for m in methods):
            group = [baseline] + [m for m in methods if m["label"] != baseline["label"]]
        for m in group:
            is_baseline = baseline is not None and m["label"] == baseline["label"]
            cell = _make_cell(sweep.name, m, resolved_params[(m["label"], pair["name"])], pair, ds, seed, measure, judge, cluster, fault, is_baseline)
            cells.setdefault(cell.key, cell)
    return Plan(name=str(sweep.name), cells=list(cells.values()), sample_counts=counts)


def _make_cell(sweep_name: str, method: Mapping[str, Any], params: dict[str, Any], pair: dict[str, Any], ds: dict[str, Any], seed: int,
               measure: dict[str, Any], judge: Mapping[str, Any], cluster: Mapping[str, Any], fault: Any, baseline: bool) -> Cell:
    pair_identity = {k: v for k, v in pair.items() if k not in ("device",)}
    # the slice as configured; its task by version only, and only from version 2 on: version 1 is what every
    # task measured before task specs existed, so the keys of existing sweeps stay what they were
    ds_identity = {k: v for k, v in ds.items() if k not in ("path", "task")}
    task = TaskSpec.from_dict(ds["task"])
    if task.version != 1:
        ds_identity["task_version"] = task.version
    scorer = check_task_scorer(task)
    hardware = cluster.get("accelerator_type") or "any"
    # The judge scores the generations, it does not change them: not part of the key (a judge change
    # re-judges the logged generations, see `driver.classify`). None here keeps the keys of earlier stores.
    harness = HARNESS_VERSION
    identity = {
        "harness": harness,
        "method": {"name": method["name"], "params": params},
        "pair": pair_identity,
        "dataset": ds_identity,
        "seed": seed,
        "measure": dict(measure),
        "judge": None,
        "hardware": hardware,
        "precision": PairSpec.from_config(pair).precision(predicted=True),
    }
    return Cell(
        key=cell_key(identity),
        sweep=sweep_name,
        label=method["label"],
        method=method["name"],
        params=params,
        method_config=method["config_name"],
        pair=pair,
        dataset=ds,
        seed=seed,
        measure=measure,
        hardware=hardware,
        harness=harness,
        judge=dict(judge) if (judge.get("enabled") and scorer is not None and scorer.uses_judge) else None,
        baseline=baseline,
        fault=fault,
    )
