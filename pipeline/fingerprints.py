"""Content fingerprints of a pair's local weights: part of a cell's key (``weights_identity``), so that retraining a
checkpoint in ``models/`` re-measures exactly the cells that read it. The fingerprint itself is
``models.content_fingerprint`` (models names its GGUF copies by it too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pipeline.decoding.base import DRAFTERS, METHODS
from pipeline.decoding.checkpoints import resolve_dir
from pipeline.models import ModelNotAvailableError, ModelSpec, PairSpec, content_fingerprint


def model_fingerprint(spec: ModelSpec) -> str | None:
    """The content fingerprint of a model that lives in files here (a local folder, or a package's or
    folder's GGUF file), else None: a Hub model is named by its id and ``revision``, a ``random_init`` one
    by its config and seed (both already in the pair's identity)."""
    if spec.random_init:
        return None
    try:
        location = Path(spec.location())
    except ModelNotAvailableError:
        return None
    if not location.exists():
        return None
    return content_fingerprint(location / spec.gguf_file if spec.gguf_file else location)


def weights_identity(pair: Mapping[str, Any], method: str, params: Mapping[str, Any]) -> dict[str, str]:
    """Content fingerprints of the local weights one cell reads (part of its key): the target, and the
    draft model, EAGLE head or Medusa heads its drafter takes. Retraining a checkpoint in ``models/``
    therefore gives new keys to exactly the cells that use it, and a resumed sweep re-measures them."""
    spec = PairSpec.from_config(pair)
    out: dict[str, str] = {}
    found = model_fingerprint(spec.target)
    if found:
        out["target"] = found
    drafter = params.get("drafter")
    scope = drafter if isinstance(drafter, Mapping) else {"kind": drafter}
    # the asset the drafter declares it reads, or what the method itself requires (medusa: its heads)
    kind = scope.get("kind")
    assets = [DRAFTERS.get(kind).asset] if kind else list(METHODS.get(method).requires)
    if "draft" in assets and spec.draft is not None:  # the pair's draft model
        found = model_fingerprint(spec.draft)
        if found:
            out["draft"] = found
        return out
    # a folder the pair names under the asset's own key (models.pair_attachments: an EAGLE head, Medusa heads)
    role = next((a for a in assets if a is not None and a != "draft"), None)
    folder = role and (scope.get("path") or spec.extra.get(role))
    if role and folder and resolve_dir(folder).exists():
        out[role] = content_fingerprint(resolve_dir(folder))
    return out
