"""What the planner checks before Ray starts (no model loads): a pair, a device, the measurement protocol, the cluster
and judge settings, seeds, and every number of the composed config (finite, within int64)."""

from __future__ import annotations

import json
import math
import os
import re
import struct
from pathlib import Path
from typing import Any, Mapping

import torch
from huggingface_hub import try_to_load_from_cache

from pipeline.measure.energy import check_energy_meter
from pipeline.models import ModelNotAvailableError, ModelSpec, PairSpec
from pipeline.sweep.compose import CONF_DIR, SweepConfigError

# The most requests that decode together (sweep.batch_sizes, the bench's batch_sizes): each slot holds a KV cache
# and, for a drafter that cannot batch its state, a drafter copy; the machines this targets hold tens, not thousands.
MAX_BATCH_SIZE = 256


def check_models_available(pair: Mapping[str, Any]) -> None:
    """Offline (HF_HUB_OFFLINE=1): every model must be a local folder, an installed package or cached. A
    ``random_init`` model has no weights to find: its ``tokenizer:`` spec is checked instead."""
    spec = PairSpec.from_config(pair)
    for role, model in (("target", spec.target), ("draft", spec.draft)):
        if model is None:
            continue
        if model.random_init:
            role, model = f"{role} tokenizer", ModelSpec.from_config(model.tokenizer)
        if (
            not model.package
            and not model.random_init
            and _looks_like_a_path(model.id)
            and not Path(model.location()).exists()
        ):
            raise SweepConfigError(
                f"pair {pair['name']!r} {role} model folder {model.id!r} does not exist "
                f"({Path(model.location()).expanduser()}): "
                "point the pair's `id` at an existing folder (relative paths are taken from the repository), "
                "or use a Hugging Face repo id (`org/name`)"
            )
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


# GGUF value types (gguf.GGUFValueType) -> struct formats of the fixed-size ones; 8 is a string, 9 an array
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _gguf_int(path: Path, suffix: str) -> int | None:
    """The first integer metadata value whose key ends with ``suffix``, read from the GGUF header by walking
    its key-value pairs and stopping there. ``gguf.GGUFReader`` parses every field, the tokenizer's 49k-entry
    vocabulary and merges included: about 15 s of a sweep's checks on this CPU for one number."""

    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        (version,) = struct.unpack("<I", f.read(4))
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported (2 or newer)")
        _tensors, kv_count = struct.unpack("<QQ", f.read(16))

        def string() -> bytes:
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n)

        def skip(kind: int, count: int = 1) -> None:
            if kind in _GGUF_SCALARS:
                f.seek(struct.calcsize("<" + _GGUF_SCALARS[kind]) * count, 1)
            elif kind == 8:
                for _ in range(count):
                    (n,) = struct.unpack("<Q", f.read(8))
                    f.seek(n, 1)
            elif kind == 9:
                for _ in range(count):
                    inner, n = struct.unpack("<IQ", f.read(12))
                    skip(inner, n)
            else:
                raise ValueError(f"{path}: unknown GGUF value type {kind}")

        for _ in range(kv_count):
            key = string().decode("utf-8", "replace")
            (kind,) = struct.unpack("<I", f.read(4))
            if key.endswith(suffix) and kind in _GGUF_SCALARS and kind not in (6, 7, 12):
                fmt = "<" + _GGUF_SCALARS[kind]
                return int(struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0])
            skip(kind)
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
            return _gguf_int(location / target.gguf_file, ".context_length")
        config_file = location / "config.json" if location.is_dir() else None
        if config_file is None or not config_file.is_file():
            cached = try_to_load_from_cache(str(target.id), "config.json", revision=target.revision)
            config_file = Path(cached) if isinstance(cached, str) else None
        if config_file is not None:
            return _context_from_config(json.loads(config_file.read_text()))
    except (OSError, ValueError, KeyError, IndexError, ImportError, struct.error):
        return None
    return None


def check_device(pair: Mapping[str, Any], cluster: Mapping[str, Any]) -> None:
    """The pair's device exists where its cells run: a valid torch device; CUDA only where there is a GPU."""
    device = str(pair.get("device") or "auto")
    fix = "set the pair's device to auto (the GPU when a cell has one, else the CPU) or cpu (pair.device=auto)"
    if device == "auto":
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise SweepConfigError(
            f"pair {pair['name']!r}: device {device!r} is not a torch device ({err}); {fix}"
        ) from None
    local = (cluster.get("kind") or "local") == "local" and not cluster.get("address")
    if dev.type == "cuda":
        if local and not torch.cuda.is_available():
            raise SweepConfigError(f"pair {pair['name']!r}: device {device!r} but this machine has no CUDA GPU; {fix}")
        visible = int(cluster.get("gpus_per_cell") or 1)  # a GPU cell sees only the GPU(s) Ray gave it
        if local and torch.cuda.is_available():
            visible = min(visible, torch.cuda.device_count())
        if dev.index is not None and dev.index >= visible:
            raise SweepConfigError(
                f"pair {pair['name']!r}: device {device!r} but a cell sees {visible} GPU(s) "
                f"(cuda:0..cuda:{visible - 1}: Ray gives each cell its own, "
                f"cluster.gpus_per_cell={cluster.get('gpus_per_cell') or 1}); {fix} or cuda"
            )
    elif (
        dev.type == "mps" and local and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    ):
        raise SweepConfigError(f"pair {pair['name']!r}: device {device!r} but MPS is not available here; {fix}")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise SweepConfigError(
            f"pair {pair['name']!r}: device {device!r} is not supported (cpu, cuda, cuda:N, mps, auto); {fix}"
        )


INT64 = (-(2**63), 2**63 - 1)  # what torch's generators, MLflow's store and pandas' Int64 columns hold


def check_numbers(node: Any, where: str) -> list[str]:
    """Every number in a composed config section finite and within int64 (one error per offending key).

    Checked generically, whatever the key: a NaN compares false with every bound (so a range check lets it
    through and it silently turns a setting off), an infinity spins a loop for ever, and an integer past
    int64 finishes a cell and then breaks every later read of the store (seeds, pandas' Int64)."""
    errors: list[str] = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            errors += check_numbers(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            errors += check_numbers(value, f"{where}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        errors.append(
            f"{where}={node!r}: must be a finite number (NaN and infinities are not settings; give a value, or null "
            "where the key allows it)"
        )
    elif isinstance(node, int) and not isinstance(node, bool) and not INT64[0] <= node <= INT64[1]:
        errors.append(f"{where}={node}: out of range (integers must fit in 64 bits, |n| < 2**63)")
    return errors


def number_error(
    section: str,
    key: str,
    value: Any,
    *,
    integer: bool,
    low: float,
    strict: bool = False,
    nullable: bool = False,
    example: Any = 1,
    note: str = "",
) -> str | None:
    """The error for ``section.key=value`` (``key=value`` without a section) unless it is a finite number (an
    integer where ``integer``) >= ``low`` (> ``low`` where ``strict``), or null where ``nullable``; None when fine."""
    if value is None and nullable:
        return None
    types = (int,) if integer else (int, float)
    ok = (
        not isinstance(value, bool)
        and isinstance(value, types)
        and math.isfinite(value)
        and (value > low if strict else value >= low)
    )
    if ok:
        return None
    name = f"{section}.{key}" if section else key
    what = (
        ("null or " if nullable else "")
        + ("an integer" if integer else "a finite number")
        + (f" > {low:g}" if strict else f" >= {low:g}")
    )
    return f"{name}={value!r}: must be {what}{note} (e.g. {name}={example})"


_MEASURE_RULES = {  # key: (integer, minimum, nullable)
    "warmup_generations": (True, 0, False),
    "warmup_samples": (True, 0, False),
    "warmup_seconds": (False, 0, False),
    "idle_seconds": (False, 0, False),
    "threads": (True, 1, True),
}


def check_measure(measure: Mapping[str, Any]) -> list[str]:
    errors = []
    for key, (integer, low, nullable) in _MEASURE_RULES.items():
        problem = number_error(
            "measure", key, measure.get(key), integer=integer, low=low, nullable=nullable, example=max(low, 1)
        )
        if problem:
            errors.append(problem)
    for key in ("perplexity", "score"):
        if key in measure and not isinstance(measure[key], bool):
            errors.append(f"measure.{key}={measure[key]!r}: must be true or false")
    try:
        check_energy_meter(measure.get("energy_meter", "auto"))
    except ValueError as err:
        errors.append(f"measure.energy_meter: {err}")
    return errors


_CLUSTER_RULES = {  # key: (integer, minimum, strict, nullable, example, note)
    "num_cpus": (False, 0, True, True, 4, " (null: all cores)"),
    "num_gpus": (False, 0, False, True, 1, " (null: autodetected)"),
    "cpus_per_cell": (False, 0, True, True, 1, ""),
    "gpus_per_cell": (False, 0, True, True, 1, ""),
    "max_in_flight": (True, 1, False, True, 2, " (null: as many as the cluster holds)"),
    "cell_timeout_s": (False, 0, True, True, 3600, " (null or 0: no limit)"),
    "object_store_memory": (True, 0, True, True, 200000000, " (bytes; null: Ray's default)"),
}


def rule_errors(
    section: str, values: Mapping[str, Any], rules: Mapping[str, tuple], *, present_only: bool = False
) -> list[str]:
    """``number_error`` of every key of ``rules`` (``key: (integer, minimum, strict, nullable, example, note)``) in
    ``values`` (``present_only``: only the keys it has; a missing key is None otherwise)."""
    errors = []
    for key, (integer, low, strict, nullable, example, note) in rules.items():
        if present_only and key not in values:
            continue
        problem = number_error(
            section,
            key,
            values.get(key),
            integer=integer,
            low=low,
            strict=strict,
            nullable=nullable,
            example=example,
            note=note,
        )
        if problem:
            errors.append(problem)
    return errors


def check_cluster(cluster: Mapping[str, Any]) -> list[str]:
    """The cluster's numeric settings in range: a negative ``cell_timeout_s`` would fail every cell at once."""
    timeout = cluster.get("cell_timeout_s")
    if timeout == 0 and not isinstance(timeout, bool):  # 0, like null, is no limit (ray_runner.run_cells)
        cluster = {k: v for k, v in cluster.items() if k != "cell_timeout_s"}
    return rule_errors("cluster", cluster, _CLUSTER_RULES, present_only=True)


def check_judge(judge: Mapping[str, Any]) -> list[str]:
    """The judge's numeric settings (checked whether or not it is enabled: a sweep file's judge is switched on
    later)."""
    errors = []
    for key, integer, low, nullable, example in (
        ("max_new_tokens", True, 1, False, 256),
        ("max_retries", True, 0, True, 5),
    ):
        if key in judge:
            problem = number_error(
                "judge", key, judge[key], integer=integer, low=low, nullable=nullable, example=example
            )
            if problem:
                errors.append(problem)
    return errors


def check_dataset_numbers(name: str, ds: Mapping[str, Any]) -> list[str]:
    """A dataset slice's numbers in range (``max_new_tokens`` is checked where the slice is built)."""
    errors = []
    for key, integer, low, strict, nullable, example in (
        ("start", True, 0, False, True, 0),
        ("limit", True, 0, True, True, 10),
        ("max_turns", True, 0, True, True, 2),
        ("time_budget_s", False, 0, True, True, 600),
    ):
        problem = number_error(
            "dataset", key, ds.get(key), integer=integer, low=low, strict=strict, nullable=nullable, example=example
        )
        if problem:
            errors.append(f"dataset {name!r}: {problem}")
    return errors


def check_seeds(seeds: Any) -> list[str]:
    """A non-empty list of integers that fit in 64 bits (a seed past int64 finishes its cell and then breaks
    every later plan of the sweep and every ``load_runs`` of its store)."""
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    if (
        not seeds
        or not isinstance(seeds, (list, tuple))
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    ):
        return [f"seeds must be a non-empty list of integers, got {seeds!r} (e.g. seeds=[0,1,2])"]
    return [
        f"seeds: {s} is out of range: a seed must be an integer in [0, 2**63 - 1] (e.g. seeds=[0,1,2])"
        for s in seeds
        if not 0 <= s <= INT64[1]
    ]


BATCH_SUFFIX = re.compile(r" \(batch \d+\)$")  # cell_types.batch_label's suffix: the cells of a batch size above 1


def check_labels(methods: list[Mapping[str, Any]], baseline: Mapping[str, Any] | None) -> list[str]:
    """Sweep entries' labels: text, one per entry (cells, resolved parameters and tables are keyed by label: two
    entries labelled alike would run one's cells with the other's parameters or collapse to one), not the
    baseline's unless the entry is the baseline's configuration (else it is dropped for the baseline), and not
    ending in `` (batch N)``, the suffix of the cells of a batch size (``cell_types.batch_label``)."""
    errors: list[str] = []
    seen: dict[str, Any] = {}
    for m in methods:
        label = m["label"]
        if not isinstance(label, str) or not label.strip():
            errors.append(f"sweep entry {m['config_name']!r}: label {label!r} must be non-empty text (label: <name>)")
            continue
        if BATCH_SUFFIX.search(label):
            errors.append(
                f"sweep entry {m['config_name']!r}: label {label!r} ends in ' (batch N)', the suffix the cells of a "
                f"batch size get (sweep.batch_sizes); rename it (e.g. label: {BATCH_SUFFIX.sub('', label)}_b) or "
                "give the entry batch_sizes"
            )
        if label in seen:
            errors.append(
                f"sweep entries {seen[label]['config_name']!r} and {m['config_name']!r} share the label {label!r}: "
                "each entry needs its own label (label: <name>), as cells, parameters and tables are keyed by it"
            )
        seen[label] = m
        if baseline is not None and label == baseline["label"]:
            if (m["name"], m["params"]) != (baseline["name"], baseline["params"]):
                errors.append(
                    f"sweep entry {m['config_name']!r} has the label {label!r} of the baseline (sweep.baseline) "
                    "with another configuration: rename it (label: <name>)"
                )
    return errors
