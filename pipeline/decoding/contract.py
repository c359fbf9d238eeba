"""The contract between a method and the loop: one ``Capabilities`` per configured method, and the protocols the loop
takes a method through.

A configured method's ``Capabilities`` (``Decoder.capabilities_of(values)``, the one override point) is computed once,
when its parameters are validated into its ``Args`` (``args.capabilities``), and carried with them: the decoder
(``Decoder.capabilities``), the loop, the cell, the bench, the sweep's batch check and the analysis (through the
cell's ``draft_depth`` / ``tree_draft`` metrics) read it, none asks the class again.

Its ``loop`` says how ``batched.BatchedDecoder`` runs the method, each with its protocol (checked when the loop is
built, so a method that declares a loop and lacks a part of it is refused with the part named):

- ``plain``: every iteration one target step (``ar``; ``SteppedMethod``);
- ``chain``: a drafter's chain, one target forward, the method's rule (``ChainMethod``);
- ``tree``: a drafter's token tree, one target forward with tree attention, the method's walk (``TreeMethod``);
- ``draw``: the target draws its own tokens, unverified (``DrawMethod``: mtjd);
- ``own``: a loop of its own (beam search): its ``generate``, request by request, at batch 1 only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from .drafters import Drafter
    from .drafting import ChainAsk, TreeAsk
    from .kv import CachedModel
    from .packed import Lanes
    from .tree import TokenTree

# a configured method's capabilities (capabilities.py, which base.py imports: it imports nothing of the engine)
from .capabilities import DRAFT_SHAPES, LOOPS, Capabilities  # noqa: E402, F401 - the contract's first half


@runtime_checkable
class SteppedMethod(Protocol):
    """What every method the loop runs offers (``plain``: nothing more): its target and a plain step's token."""

    name: str
    target: CachedModel

    def next_token(self, logits: torch.Tensor, generator: torch.Generator | None) -> int: ...

    def prefill_seconds(self) -> float: ...


@runtime_checkable
class ChainMethod(SteppedMethod, Protocol):
    """A chain method: its drafter's chains (``propose_chains``, up to ``draft_depth`` tokens each, a request's
    ``length_policy`` saying how many) and its rule over one target forward (``verify``: drafts kept, next token)."""

    drafter_impl: Drafter
    length_policy: Any  # its draft_length.DraftLength (typed loosely: a protocol of the loop's, not of the policy)

    @property
    def draft_depth(self) -> int: ...

    def propose_chains(self, asks: list[ChainAsk]) -> list[tuple[torch.Tensor, Any] | None]: ...

    def verify(
        self, logits: torch.Tensor, x: torch.Tensor, q: Any, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class TreeMethod(SteppedMethod, Protocol):
    """A tree method: its drafter's trees of ``tree_shape(depth)`` (``propose_trees``, at most ``draft_depth``
    levels) and its walk over one target forward with tree attention (``verify_tree``: path kept, next token)."""

    drafter_impl: Drafter
    length_policy: Any  # as ChainMethod's

    @property
    def draft_depth(self) -> int: ...

    def tree_shape(self, depth: int) -> list[int]: ...

    def propose_trees(self, asks: list[TreeAsk]) -> list[TokenTree | None]: ...

    def verify_tree(
        self, logits: torch.Tensor, tree: TokenTree, generator: torch.Generator | None
    ) -> tuple[list[int], int]: ...


@runtime_checkable
class DrawMethod(SteppedMethod, Protocol):
    """A method whose target draws its own tokens (``draw_tokens`` over the loop's target sequences)."""

    def draw_tokens(self, target: Lanes, asks: list[ChainAsk]) -> list[list[int]]: ...


def _lacks(method: object, protocol: type, loop: str) -> TypeError:
    """The error of a method whose declared ``loop`` needs ``protocol``, naming the members it lacks."""
    members: set[str] = set()
    for cls in protocol.__mro__:
        if cls not in (object, Protocol, Generic):
            members |= set(vars(cls).get("__annotations__", {})) | set(vars(cls))
    missing = sorted(m for m in members if not m.startswith("_") and not hasattr(method, m))
    return TypeError(
        f"method {type(method).__name__} declares loop {loop!r} but lacks {', '.join(missing) or 'part'} of "
        f"{protocol.__name__} (pipeline/decoding/contract.py): implement it, or declare another loop"
    )


def chain_method(method: object) -> ChainMethod:
    """``method`` as a ``ChainMethod`` (its declared loop: ``chain``); TypeError names what it lacks."""
    if isinstance(method, ChainMethod):
        return method
    raise _lacks(method, ChainMethod, "chain")


def tree_method(method: object) -> TreeMethod:
    """``method`` as a ``TreeMethod`` (its declared loop: ``tree``); TypeError names what it lacks."""
    if isinstance(method, TreeMethod):
        return method
    raise _lacks(method, TreeMethod, "tree")


def draw_method(method: object) -> DrawMethod:
    """``method`` as a ``DrawMethod`` (its declared loop: ``draw``); TypeError names what it lacks."""
    if isinstance(method, DrawMethod):
        return method
    raise _lacks(method, DrawMethod, "draw")


def stepped_method(method: object) -> SteppedMethod:
    """``method`` as a ``SteppedMethod`` (every loop but ``own``); TypeError names what it lacks."""
    if isinstance(method, SteppedMethod):
        return method
    raise _lacks(method, SteppedMethod, "plain")
