"""The heads that ride on a target (Medusa heads, EAGLE heads): their checkpoint folders, a JSON config
beside the weights (safetensors, or a PyTorch ``.bin`` state dict as some published heads ship), and
how they are attached to the target model.

``read_checkpoint`` finds the folder (a relative path from the current directory, else from the
repository root), reads the config and the first weights file present, and refuses a folder without
them with a message naming the command that trains one; ``write_checkpoint`` writes the weights in a
given dtype and the config. What the config holds and how the state becomes a module is the head's
own business (``medusa_heads.py``, ``eagle.py``). ``attach`` puts a head on the target as a plain
attribute after checking its width; ``attached`` reads it back or says how to provide one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import load_file, save_file
from torch import nn

REPO_ROOT = Path(__file__).resolve().parents[2]


def resolve_dir(path: str | Path) -> Path:
    """A checkpoint folder: ``path`` (``~`` expanded) when it exists or is absolute, else from the repository root."""
    directory = Path(path).expanduser()
    if not directory.is_absolute() and not directory.exists():
        directory = REPO_ROOT / directory
    return directory


def read_checkpoint(
    path: str | Path, *, config_file: str, weights_files: Sequence[str], what: str, trainer: str
) -> tuple[Path, dict[str, Any], dict[str, torch.Tensor]]:
    """(folder, config, state dict) of the checkpoint at ``path``; ``weights_files`` in order of preference.

    ``what`` names the checkpoint in errors ("EAGLE head"), ``trainer`` the ``pipeline`` command that makes one.
    """
    directory = resolve_dir(path)
    if not (directory / config_file).exists():
        raise ValueError(
            f"no {what} at {path!r} (expected {config_file} and {weights_files[0]}); train one with "
            f"`python -m pipeline.{trainer} pair=<pair> out_dir={path}`"
        )
    config = json.loads((directory / config_file).read_text())
    for name in weights_files:
        file = directory / name
        if file.exists():
            if name.endswith(".safetensors"):
                return directory, config, load_file(file)
            return directory, config, torch.load(file, map_location="cpu", weights_only=True)
    raise ValueError(f"{what} at {directory}: none of {list(weights_files)} found beside {config_file}")


def write_checkpoint(
    directory: str | Path, state: dict[str, torch.Tensor], config: dict[str, Any], *, dtype: torch.dtype,
    config_file: str, weights_file: str,
) -> Path:
    """Write ``state`` (cast to ``dtype``) as safetensors and ``config`` as indented JSON into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to(dtype).contiguous() for k, v in state.items()}, directory / weights_file)
    (directory / config_file).write_text(json.dumps(config, indent=2, default=str) + "\n")
    return directory


def attach(target: nn.Module, head: nn.Module, attr: str, what: str) -> nn.Module:
    """Put ``head`` (with a ``hidden_size``) on ``target`` as ``target.<attr>``, on the target's device and dtype.

    A plain attribute, not a registered submodule: the target's state dict and forward stay untouched.
    """
    weight = target.get_output_embeddings().weight
    if head.hidden_size != weight.shape[1]:
        raise ValueError(f"{what} expects hidden size {head.hidden_size}, the target has {weight.shape[1]}")
    head.to(weight.device, weight.dtype)
    object.__setattr__(target, attr, head)
    return target


def attached(target: nn.Module, attr: str, missing: str) -> nn.Module:
    """``target.<attr>``, or a ValueError with ``missing`` (what the method needs and how to provide it)."""
    head = getattr(target, attr, None)
    if head is None:
        raise ValueError(missing)
    return head
