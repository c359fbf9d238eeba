"""The heads that read a target (Medusa heads, EAGLE heads): their checkpoint folders, a JSON config
beside the weights (safetensors, or a PyTorch ``.bin`` state dict as some published heads ship), and
how they are placed beside the target model.

``read_checkpoint`` finds the folder (a relative path from the current directory, else from the
repository root), reads the config and the first weights file present, and refuses a folder without
them with a message naming the command that trains one; ``write_checkpoint`` writes the weights in a
given dtype and the config. What the config holds and how the state becomes a module is the head's
own business (``medusa_heads.py``, ``eagle.py``). ``place`` checks a head's width against the target and moves it
to the target's device and dtype; the pair's heads are passed to the decoders as assets, never set on the target
(``attach`` remains for an EAGLE head attached by hand).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

REPO_ROOT = Path(__file__).resolve().parents[2]

# a transformers model (a target or a draft): its config fields and submodules (``get_output_embeddings()``,
# ``config.hidden_size``) are read by name, which ``nn.Module``'s types cannot follow
HFModel = Any


def resolve_dir(path: str | Path) -> Path:
    """A checkpoint folder: ``path`` (``~`` expanded) when it exists or is absolute, else from the repository root."""
    directory = Path(path).expanduser()
    if not directory.is_absolute() and not directory.exists():
        directory = REPO_ROOT / directory
    return directory


class LazyState(Mapping[str, torch.Tensor]):
    """A safetensors file's tensors by name, each read when asked for; ``shapes`` come from the file's header, so
    that a head's config can be checked against its weights before anything is built or read."""

    def __init__(self, file: Path) -> None:
        self.file = file
        try:
            with safe_open(str(file), framework="pt") as handle:
                self.shapes = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}  # noqa: SIM118 - not a dict
        except Exception as err:  # noqa: BLE001 - safetensors' own errors on a truncated or foreign file
            raise ValueError(f"{file} is not a readable safetensors file ({err}); write it again or retrain") from None

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.shapes:
            raise KeyError(key)
        with safe_open(str(self.file), framework="pt") as handle:
            return handle.get_tensor(key)

    def __contains__(self, key: object) -> bool:  # Mapping's would read the tensor
        return key in self.shapes

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def shapes_of(state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a state (a ``LazyState``'s from its header: nothing is read)."""
    return dict(state.shapes) if isinstance(state, LazyState) else {k: tuple(v.shape) for k, v in state.items()}


def check_against_weights(
    build: Callable[[], nn.Module],
    shapes: Mapping[str, Sequence[int]],
    *,
    what: str,
    directory: Path,
    config_file: str,
    ignore: Sequence[str] = ("rotary.",),
    optional: Sequence[str] = (),
) -> None:
    """The module a head's config describes, built on the meta device (no memory), against the tensors its weights
    file holds: names and shapes. A config that says ``hidden_size: 20000`` beside 2 MB of weights would otherwise
    build gigabytes of parameters before failing on a wall of size mismatches. ValueError naming the fix."""
    try:
        with torch.device("meta"):
            module = build()
    except Exception as err:  # noqa: BLE001 - any constructor error on nonsense config values
        raise ValueError(
            f"{what} at {directory}: {config_file} does not describe a module ({type(err).__name__}: {err}); "
            f"fix {config_file} or write the checkpoint again"
        ) from None
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items() if not k.startswith(tuple(ignore))}
    found = {k: tuple(v) for k, v in shapes.items() if not k.startswith(tuple(ignore))}
    missing = sorted(set(expected) - set(found) - set(optional))
    unexpected = sorted(set(found) - set(expected))
    wrong = [
        f"{k}: the config gives {list(expected[k])}, the file holds {list(found[k])}"
        for k in sorted(set(expected) & set(found))
        if expected[k] != found[k]
    ]
    if missing or unexpected or wrong:
        parts = (
            ([f"missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}"] if missing else [])
            + ([f"unexpected tensors {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}"] if unexpected else [])
            + wrong[:3]
        )
        raise ValueError(
            f"{what} at {directory}: {config_file} does not match the weights ({'; '.join(parts)}"
            f"{' ...' if len(wrong) > 3 else ''}); fix {config_file} to the shapes the weights were trained with, "
            "or write the checkpoint again"
        )


def config_ints(
    config: Mapping[str, Any],
    keys: Sequence[str],
    *,
    what: str,
    directory: Path,
    config_file: str,
    defaults: Mapping[str, int] | None = None,
) -> list[int]:
    """``config[key]`` for each key as a positive integer (a ValueError naming the key and the file otherwise)."""
    out = []
    for key in keys:
        value = config.get(key, (defaults or {}).get(key))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} at {directory}: {config_file} has {key}={value!r}; it must be a positive integer")
        out.append(value)
    return out


def read_checkpoint(
    path: str | Path, *, config_file: str, weights_files: Sequence[str], what: str, trainer: str
) -> tuple[Path, dict[str, Any], Mapping[str, torch.Tensor]]:
    """(folder, config, state) of the checkpoint at ``path``; ``weights_files`` in order of preference.

    A safetensors state is a ``LazyState`` (tensors read on access, shapes from the header: ``shapes_of``), so that
    the loader checks its config against the weights before it builds anything; a ``.bin`` is read whole.
    ``what`` names the checkpoint in errors ("EAGLE head"), ``trainer`` the ``pipeline`` command that makes one.
    """
    directory = resolve_dir(path)
    if not (directory / config_file).exists():
        raise ValueError(
            f"no {what} at {path!r} (expected {config_file} and {weights_files[0]}); train one with "
            f"`python -m pipeline.{trainer} pair=<pair> out_dir={path}`"
        )
    try:
        config = json.loads((directory / config_file).read_text())
    except ValueError as err:
        raise ValueError(f"{what} at {directory}: {config_file} is not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{what} at {directory}: {config_file} is not a JSON object of settings")
    for name in weights_files:
        file = directory / name
        if file.exists():
            if name.endswith(".safetensors"):
                return directory, config, LazyState(file)
            return directory, config, torch.load(file, map_location="cpu", weights_only=True)
    raise ValueError(f"{what} at {directory}: none of {list(weights_files)} found beside {config_file}")


def write_checkpoint(
    directory: str | Path,
    state: dict[str, torch.Tensor],
    config: dict[str, Any],
    *,
    dtype: torch.dtype,
    config_file: str,
    weights_file: str,
) -> Path:
    """Write ``state`` (cast to ``dtype``) as safetensors and ``config`` as indented JSON into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to(dtype).contiguous() for k, v in state.items()}, directory / weights_file)
    (directory / config_file).write_text(json.dumps(config, indent=2, default=str) + "\n")
    return directory


def place(target: HFModel, head: nn.Module, what: str) -> nn.Module:
    """Check ``head`` (with a ``hidden_size``) against ``target``'s width and move it to the target's device and dtype.

    The head is returned, never set on the target: it reaches the drafters that read it only where it is passed
    (``LoadedPair.assets``, ``build_decoder(..., assets={...})``); the target's state dict and forward stay
    untouched.
    """
    weight = target.get_output_embeddings().weight
    if head.hidden_size != weight.shape[1]:
        raise ValueError(f"{what} expects hidden size {head.hidden_size}, the target has {weight.shape[1]}")
    head.to(weight.device, weight.dtype)
    return head


def attach(target: HFModel, head: nn.Module, attr: str, what: str) -> HFModel:
    """``place`` and put ``head`` on ``target`` as the plain attribute ``target.<attr>`` (an EAGLE head attached by
    hand, ``eagle.attach_eagle_head``; the pair's heads are never attached: ``load_pair`` passes them as assets)."""
    object.__setattr__(target, attr, place(target, head, what))
    return target
