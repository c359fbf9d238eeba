"""What the planner checks of a pair, a device and the measurement protocol before Ray starts (no model loads)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import gguf
import torch
from huggingface_hub import try_to_load_from_cache

from pipeline.energy import check_energy_meter
from pipeline.models import ModelNotAvailableError, PairSpec
from pipeline.sweep.compose import CONF_DIR, SweepConfigError


def check_models_available(pair: Mapping[str, Any]) -> None:
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


def check_device(pair: Mapping[str, Any], cluster: Mapping[str, Any]) -> None:
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


def check_measure(measure: Mapping[str, Any]) -> list[str]:
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
    try:
        check_energy_meter(measure.get("energy_meter", "auto"))
    except ValueError as err:
        errors.append(f"measure.energy_meter: {err}")
    return errors

