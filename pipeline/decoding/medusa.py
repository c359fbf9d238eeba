"""medusa: Medusa heads on the target (Cai et al. 2024), a token tree of their top-k, one target pass.

Heads (docs/ALGORITHMS.md 10.2): head i (i = 1..K) reads the target's last hidden state h_t (the input of
its LM head) and predicts token t+i+1: ``logits_i = LMHead(ResBlock_i^L(h_t))`` with
``ResBlock(x) = x + SiLU(Linear(x))``, Linear zero-initialised (a head starts as the LM head itself).
Here the head's output projection is the target's own (tied) LM head, shared and frozen, so a head is
one 576x576 block for SmolLM2 (a few MB for all heads); ``python -m pipeline.train_medusa`` trains the
blocks with the backbone frozen (Medusa-1).

The heads themselves (architecture, save/load) are in ``medusa_heads.py``. Where they come from: a pair
config's ``medusa: models/<dir>`` key; ``load_pair`` loads them (``load_medusa_heads(path, target)``, placed on the
target's device, not attached to it) into ``LoadedPair.assets["medusa"]``. ``build_decoder("medusa", target,
assets={"medusa": heads})`` (and any method with ``drafter: medusa``: ``typical``) reads them through the
``medusa`` drafter (``drafters.MedusaDrafter``).

Decoding: the root (the last emitted token) comes from the target; depth d of the tree holds the
``k_config[d]`` most likely tokens of head d+1 under every depth-(d-1) node (a Cartesian tree, the
heads see only the root's hidden state). One target pass with tree attention scores every node;
``acceptance: typical`` keeps the longest path whose tokens pass typical acceptance (lossy, Medusa-2's
rule, ties broken by likelihood) and ``acceptance: exact`` walks the tree with the one-hot recursive
rule for deterministic children (lossless: the output follows the warped target exactly). The next
token is drawn from the target row at the end of the path (``recovery: argmax`` takes its argmax, as
Medusa's default "fast" mode does); its hidden state feeds the heads for the next tree.
"""

from __future__ import annotations

from dataclasses import replace

from .base import Param, in_closed, int_list_at_least, nonneg_number, one_of
from .capabilities import Capabilities
from .drafters import MedusaDrafter
from .rules import TreeWalk
from .speculative import TreeVerifyDecoder
from .tree_verify import one_hot_tree_walk
from .typical import TYPICAL_WALK

ONE_HOT_WALK = TreeWalk(one_hot_tree_walk, children="top")

MEDUSA_PARAMS = {
    "k_config": Param([4, 2, 2], int_list_at_least(1), "top-k of head d+1 under each depth-d node (depth <= heads)"),
    "acceptance": Param("typical", one_of("typical", "exact"), "typical (lossy, Medusa-2) or exact (one-hot walk)"),
    "epsilon": Param(0.09, in_closed(0.0, 1.0), "typical acceptance: posterior threshold"),
    "delta": Param(0.3, nonneg_number, "typical acceptance: posterior alpha (entropy factor)"),
    "recovery": Param("sample", one_of("sample", "argmax"), "next token after the path: sample or argmax"),
}


class MedusaDecoder(TreeVerifyDecoder):
    """The ``medusa`` drafter's Cartesian token tree + typical (lossy) or exact one-hot tree acceptance.

    The first token of a generation comes from a plain target step (the heads need its hidden
    state); after every step the hidden state at the end of the accepted path seeds the next tree.
    """

    name = "medusa"
    verification_method = "tree_typical"
    prefix_drafts = False
    requires = ("medusa",)
    params = MEDUSA_PARAMS

    own_drafter = MedusaDrafter  # its own heads (no drafter parameter)

    @classmethod
    def capabilities_of(cls, values, drafter=None) -> Capabilities:
        """``acceptance: exact``: the one-hot walk, lossless; ``typical``: typical acceptance, lossy."""
        exact = values["acceptance"] == "exact"
        caps = super().capabilities_of(values, drafter)
        return replace(caps, lossless=exact, walk=ONE_HOT_WALK if exact else TYPICAL_WALK)

    @classmethod
    def check_combination(cls, values) -> None:
        if values["acceptance"] == "exact" and values["recovery"] != "sample":
            raise ValueError(
                f"method {cls.name!r}: acceptance=exact is lossless only with recovery=sample; "
                f"set recovery: sample, or use acceptance: typical"
            )
