"""The restricted-vocabulary contract between a draft and the decoding engine.

A draft distilled by ``pipeline.distill`` can carry, beside its (stock, full-vocabulary) checkpoint, a
``restricted_head_map.json``: the target token ids its restricted head covers. ``restrict_head``
turns a loaded model into one whose logits cover only those ids and records the map on the model as
``model.draft_token_map`` (a LongTensor: logit i -> target id). The engine reads the map with
``token_map_of`` and scatters the draft's rows onto the target vocabulary (q = 0 elsewhere), so
verification stays exact.

The file is read only by ``restrict_head`` (``restrict_head: true`` in a pair's draft spec): a stock
loader does not restrict the head, so the engine never reads the file itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

MAP_FILE = "restricted_head_map.json"


def map_file(directory: str | Path) -> Path:
    """Where a checkpoint directory keeps its restricted-head map."""
    return Path(directory) / MAP_FILE


def restrict_head(model, token_map: torch.Tensor | list[int] | None = None):
    """Make ``model`` output logits only for ``token_map`` (default: its checkpoint's ``MAP_FILE``).

    The LM head becomes a copy of the mapped rows of the (tied) embedding; the input embedding keeps
    the full vocabulary because the decoding engine feeds target token ids. The map is kept as
    ``model.draft_token_map`` (a LongTensor: logit i -> target id). A model without a map is returned
    unchanged.
    """
    if token_map is None:
        token_map = read_token_map(getattr(model, "name_or_path", "") or ".")
        if token_map is None:
            return model
    token_map = torch.as_tensor(token_map, dtype=torch.long)
    weight = model.get_input_embeddings().weight.detach()[token_map].clone()
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    head.weight.data.copy_(weight)
    model.lm_head = head
    model.config.tie_word_embeddings = False
    model.draft_token_map = token_map
    return model


def read_token_map(directory: str | Path) -> torch.Tensor | None:
    """The map a checkpoint folder keeps in ``MAP_FILE`` (logit i -> target id), or None without one."""
    file = map_file(directory)
    return torch.tensor(json.loads(file.read_text()), dtype=torch.long) if file.exists() else None


def save_token_map(token_map: torch.Tensor | None, directory: str | Path, vocab_size: int | None = None) -> None:
    """Write ``MAP_FILE`` beside a checkpoint when ``token_map`` restricts the vocabulary (else remove it).

    Without ``vocab_size`` any given map is written; with it, a map covering the whole vocabulary is not.
    """
    file = map_file(directory)
    if token_map is not None and (vocab_size is None or token_map.numel() < vocab_size):
        file.write_text(json.dumps([int(t) for t in token_map.tolist()]))
    elif file.exists():
        file.unlink()


def token_map_of(model) -> torch.Tensor | None:
    """A restricted-vocabulary draft's map (draft logit i -> target token id), or None for a full head."""
    attached = getattr(model, "draft_token_map", None)
    return None if attached is None else torch.as_tensor(attached, dtype=torch.long)
