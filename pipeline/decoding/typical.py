"""typical: typical acceptance (Medusa-2, Cai et al. 2024) over any drafter's chain or tree.

A chain (``drafter: model``, the MTAD paper's baseline, ``draft`` is an alias; ``eagle``, ``eagle3`` or
``ngram``): the drafter proposes up to gamma tokens as for ``spd``; one target pass scores them; the
longest prefix whose tokens all satisfy ``p(x_i) > min(epsilon, delta * exp(-H(p_i)))`` is kept (p = the
warped target row), and the next token is drawn from the target row after it (``recovery: argmax`` takes
its argmax, as Medusa's "fast" mode does). A tree (``tree: true`` with a drafter that drafts trees, or
``drafter: medusa``, whose heads draft only trees): the drafter proposes a tree of ``k_config`` with the
top-k children per node (EAGLE-2's and Medusa's own drafting), one target pass scores it, and the longest
typical path is kept (``drafter: medusa`` is the ``medusa`` method with ``acceptance: typical``). Lossy by
design; epsilon = 1 accepts nothing (plain sampling), epsilon = 0 accepts every token in the target's
warped support. Temperature 0: exactly ``ar`` greedy.
"""

from __future__ import annotations

from .base import Param, boolean, in_closed, int_list_at_least, nonneg_number, one_of
from .capabilities import Capabilities
from .drafter_scope import DRAFT, drafter_class, drafter_param, drafter_scope
from .drafters import ModelDrafter
from .rules import ChainRule, TreeWalk
from .speculative import DraftVerifyDecoder
from .tree_verify import typical_tree_rule
from .verification import typical_verify


def typical_rule(P, Q, x, u, *, epsilon: float, delta: float, recovery: str = "sample"):
    """Typical acceptance over a chain (no draft rows, no coins): the longest typical prefix, then the target
    row after it, or its argmax token with ``recovery: argmax``."""
    n, row = typical_verify(P, x, epsilon, delta)
    return n, row.argmax(-1) if recovery == "argmax" else row


TYPICAL_RULE = ChainRule(typical_rule, params=("epsilon", "delta", "recovery"), coins=False, draft="none")
TYPICAL_WALK = TreeWalk(typical_tree_rule, children="top", params=("epsilon", "delta", "recovery"))


class TypicalDecoder(DraftVerifyDecoder):
    name = "typical"
    verification_method = "typical_acceptance"
    prefix_drafts = True
    rule = TYPICAL_RULE
    walk = TYPICAL_WALK
    params = {
        **DraftVerifyDecoder.params,
        "epsilon": Param(0.09, in_closed(0.0, 1.0), "posterior threshold"),
        "delta": Param(0.3, nonneg_number, "posterior alpha: the entropy-scaled threshold factor"),
        "drafter": drafter_param(
            extra=(DRAFT,),
            help="who drafts: the pair's drafter (pair), a drafter kind (draft = model; medusa: the pair's Medusa "
            "heads, a tree), or {kind: ..., <its parameters>}",
        ),
        "recovery": Param("sample", one_of("sample", "argmax"), "next token after the kept prefix"),
        "k_config": Param(
            [4, 2, 2], int_list_at_least(1), "the tree's top-k per depth (tree: true, or drafter: medusa)"
        ),
        "tree": Param(
            False, boolean, "a tree of k_config from a drafter that drafts trees, instead of a chain of gamma"
        ),
    }

    @classmethod
    def capabilities_of(cls, values, drafter=None) -> Capabilities:
        """A tree of ``k_config`` with ``tree: true`` or a drafter that drafts only trees (Medusa's heads), else a
        chain of ``gamma``."""
        caps = super().capabilities_of(values, drafter)
        plugin = drafter if drafter is not None else (drafter_class(caps.drafter) if caps.drafter else None)
        if values.get("tree") or (plugin is not None and "chain" not in plugin.shapes):
            return cls.as_tree(caps, values)
        return caps

    @classmethod
    def resolve_drafter(cls, values, ctx) -> None:
        scope = drafter_scope(values["drafter"])
        if scope["kind"] == DRAFT:
            scope["kind"] = ModelDrafter.kind
        values["drafter"] = scope
        super().resolve_drafter(values, ctx)
