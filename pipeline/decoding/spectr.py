"""spectr: SpecTr (Sun et al., NeurIPS 2023): k i.i.d. draft chains, K-SEQ selection at each depth.

The draft samples ``num_drafts`` independent chains of ``gamma`` tokens (as one tree of k chains:
one draft forward per depth); one target pass with tree attention scores every chain. Depth by
depth, K-SEQ with rho* (recomputed for every depth and number of surviving chains) accepts one of
the candidate tokens of the chains that still agree with the accepted prefix; chains carrying the
accepted token survive. When every candidate is rejected the next token comes from the K-SEQ
residual; after gamma accepted tokens, from the target's bonus row. Lossless (docs/ALGORITHMS.md 7, A.4).
Temperature 0: the chains start from the draft's top-k distinct tokens, greedy acceptance. The chains come
from the draft model or from an EAGLE head (``drafter: eagle | eagle3``: the head's tree shaped as k chains).
"""

from __future__ import annotations

from .base import Param, int_at_least
from .drafter_scope import drafter_param
from .exact import kseq_cases
from .rules import TreeWalk
from .specinfer import SpecInferDecoder
from .tree_verify import kseq_chain_walk

KSEQ_WALK = TreeWalk(kseq_chain_walk, children="iid", chains=True, exact=kseq_cases)


class SpecTrDecoder(SpecInferDecoder):
    """k chains drawn i.i.d. from the drafter (a tree of ``[k, 1, 1, ...]``), verified by K-SEQ."""

    name = "spectr"
    verification_method = "tree_spectr"
    prefix_drafts = False
    walk = KSEQ_WALK
    params = {
        "drafter": drafter_param(),
        "num_drafts": Param(4, int_at_least(1), "k i.i.d. draft chains"),
        "gamma": Param(4, int_at_least(1), "tokens per draft chain"),
    }

    @classmethod
    def resolve_drafter(cls, values, ctx) -> None:
        super().resolve_drafter(values, ctx)
        scope = values["drafter"]
        if "top_nodes" in scope:  # a drafter with a node budget (EAGLE): K-SEQ needs every chain whole
            k, gamma = values["num_drafts"], values["gamma"]
            if scope["top_nodes"] and scope["top_nodes"] < k:
                raise ValueError(
                    f"method 'spectr' with drafter {scope['kind']}: top_nodes={scope['top_nodes']} would stop "
                    f"{k - scope['top_nodes']} of the {k} chains; set top_nodes: 0 (every node) or >= num_drafts"
                )
            if scope.get("max_nodes") and scope["max_nodes"] < k * gamma:
                raise ValueError(
                    f"method 'spectr' with drafter {scope['kind']}: max_nodes={scope['max_nodes']} would cut the "
                    f"{k} x {gamma} chain nodes; set max_nodes: 0 (no budget) or >= num_drafts x gamma"
                )

    def tree_shape(self, depth: int) -> list[int]:
        return [self.args.num_drafts] + [1] * (depth - 1)
