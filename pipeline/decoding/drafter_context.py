"""What a pair offers its drafters, known before any model loads, and the registry of drafter kinds.

``DrafterContext`` (a draft model, an EAGLE head and its version, Medusa heads, the pair's default drafter) is what
``validate_params`` checks a method's ``drafter`` against (``drafter_scope.resolve_drafter``); ``DRAFTERS`` is the one
registry of drafter kinds (``pipeline/decoding/__init__.py`` registers the built-in ones).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from pipeline.registry import Registry

from .checkpoints import resolve_dir


def _drafter_problem(entry: Any) -> str | None:
    ok = (
        isinstance(entry, type)
        and callable(getattr(entry, "create", None))
        and isinstance(getattr(entry, "shapes", None), frozenset)
    )
    return None if ok else "is not a Drafter subclass (pipeline.decoding.drafters.Drafter)"


# kind -> Drafter class: the one registry of drafter kinds (pipeline/decoding/__init__.py registers the built-in
# ones; a config may name a drafter of its own as `drafter: {kind: mypkg.drafts:MyDrafter}`)
DRAFTERS: Registry[Any] = Registry("drafter", name_of=lambda cls: cls.kind, check=_drafter_problem)


def eagle_version(path: Any) -> int | None:
    """3 when the EAGLE head folder at ``path`` holds an EAGLE-3 head (authors' or ``speculators`` layout),
    1 for an EAGLE-1/2 head, None when it cannot be read (the loader then says what is missing).

    Reads ``config.json`` only: no weights, no model (validation before anything loads).
    """
    if not path:
        return None
    file = resolve_dir(path) / "config.json"
    if not file.exists():
        return None
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    archs = " ".join(config.get("architectures") or []).lower()
    if "speculators_config" in config or "draft_vocab_size" in config or "eagle3" in archs:
        return 3
    return 1


@dataclass(frozen=True)
class DrafterContext:
    """What a pair offers, known before any model loads: its draft model, EAGLE head (folder and version),
    Medusa heads and default drafter (a kind name or a ``{kind: ..., <param>: ...}`` scope)."""

    has_draft: bool = True
    has_eagle: bool = False
    default: Any = None
    eagle_path: str | None = None
    eagle_version: int | None = None
    has_medusa: bool = False

    def offers(self, asset: str | None) -> bool:
        """Whether the pair has ``asset`` (a drafter's or method's declared need; None: nothing): the field
        ``has_<asset>`` (``has_draft``, ``has_eagle``, ``has_medusa``); an asset without such a field is not offered."""
        return asset is None or bool(getattr(self, f"has_{asset}", False))

    @classmethod
    def of_pair(cls, pair: Mapping[str, Any]) -> "DrafterContext":
        """From a pair config mapping (``conf/pair/<name>.yaml``)."""
        default = pair.get("drafter")
        kind = default.get("kind") if isinstance(default, Mapping) else default
        if default is not None and kind not in DRAFTERS and not (isinstance(kind, str) and ":" in kind):
            raise ValueError(
                f"pair {pair.get('name')!r}: drafter: {default!r} must be one of {DRAFTERS.names()} "
                f"(or {{kind: <one of them>, ...}}, or `module:attr` of a Drafter of your own)"
            )
        path = pair.get("eagle")
        ctx = cls(
            has_draft=bool(pair.get("draft")),
            has_eagle=bool(path),
            default=default,
            eagle_path=str(path) if path else None,
            eagle_version=eagle_version(path),
            has_medusa=bool(pair.get("medusa")),
        )
        asset = DRAFTERS.get(kind).asset if isinstance(kind, str) else None  # a str whenever default is set
        if asset is not None and not ctx.offers(asset) and not (isinstance(default, Mapping) and default.get("path")):
            raise ValueError(
                f"pair {pair.get('name')!r}: drafter: {kind} reads the pair's `{asset}:`, which this pair has not: "
                f"add `{asset}: <...>` or choose another drafter"
            )
        return ctx

    @classmethod
    def of_models(cls, target: Any, draft: Any, assets: Mapping[str, Any] | None = None) -> "DrafterContext":
        """From loaded models and the assets passed beside them (``LoadedPair.assets``: ``eagle``, ``medusa`` heads
        and the pair's default ``drafter``); an EAGLE head attached to the target by hand is read too."""
        assets = assets or {}
        head = assets.get("eagle")
        if head is None:
            head = getattr(target, "eagle_head", None)  # attached by hand (eagle.attach_eagle_head)
        return cls(
            has_draft=draft is not None,
            has_eagle=head is not None,
            default=assets.get("drafter"),
            eagle_version=None if head is None else int(getattr(head, "eagle_version", 1)),
            has_medusa=assets.get("medusa") is not None,
        )
