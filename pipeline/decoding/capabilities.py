"""A configured method's ``Capabilities``: what it does as configured (its loop, what it drafts and how deep, whether it
is lossless, why it cannot batch, its drafter), computed once when its parameters are validated into its ``Args``
(``Decoder.capabilities_of(values)``, the one override point) and read by the loop, the cell, the bench, the sweep and
the analysis. The protocols the loop takes a method through by its ``loop`` are ``contract.py``'s; this module imports
nothing of the engine, so ``base.py`` can."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LOOPS = ("plain", "chain", "tree", "draw", "own")  # how the loop runs a method (this module's docstring)
DRAFT_SHAPES = ("chain", "tree", "none")  # what one target forward of a method verifies


@dataclass(frozen=True)
class Capabilities:
    """What a configured method does: the answer every reader asks for, rather than the class's defaults (a
    ``typical`` with ``tree: true`` verifies trees, a ``medusa`` with ``acceptance: exact`` is lossless)."""

    loop: str  # LOOPS
    draft_shape: str  # chain | tree | none
    draft_depth: int | None  # a chain's length or a tree's levels at most (None: no draft)
    lossless: bool
    batch_refusal: str | None  # why it cannot decode several requests together (None: it can)
    drafter: str | None  # the drafter kind (None: no drafter)
    requires: tuple[str, ...]
    walk: Any = field(default=None, compare=False, repr=False)  # a tree method's rules.TreeWalk as configured

    def __post_init__(self) -> None:
        if self.loop not in LOOPS:
            raise ValueError(f"Capabilities.loop must be one of {LOOPS}, got {self.loop!r}")
        if self.draft_shape not in DRAFT_SHAPES:
            raise ValueError(f"Capabilities.draft_shape must be one of {DRAFT_SHAPES}, got {self.draft_shape!r}")

    @property
    def batchable(self) -> bool:
        return self.batch_refusal is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "loop": self.loop,
            "draft_shape": self.draft_shape,
            "draft_depth": self.draft_depth,
            "lossless": self.lossless,
            "batchable": self.batchable,
            "drafter": self.drafter,
            "requires": self.requires,
        }
