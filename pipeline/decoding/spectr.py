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

from .base import EAGLE_KINDS, Param, int_at_least
from .drafters import drafter_param
from .specinfer import TREE_DRAFTERS, SpecInferDecoder
from .tree_verify import kseq_chain_walk
from .warping import sample


class SpecTrDecoder(SpecInferDecoder):
    """SpecInfer's drafting (a draft model's tree, or an EAGLE head's: i.i.d. children with replacement)
    shaped as ``num_drafts`` chains, verified by K-SEQ."""

    name = "spectr"
    params = {
        "drafter": drafter_param(TREE_DRAFTERS),
        "num_drafts": Param(4, int_at_least(1), "k i.i.d. draft chains"),
        "gamma": Param(4, int_at_least(1), "tokens per draft chain"),
    }

    @classmethod
    def resolve_drafter(cls, values, ctx) -> None:
        super().resolve_drafter(values, ctx)
        scope = values["drafter"]
        if scope["kind"] in EAGLE_KINDS:  # K-SEQ needs every chain whole: no node may be left unexpanded
            k, gamma = values["num_drafts"], values["gamma"]
            if scope["top_nodes"] and scope["top_nodes"] < k:
                raise ValueError(f"method 'spectr' with drafter {scope['kind']}: top_nodes={scope['top_nodes']} would stop "
                                 f"{k - scope['top_nodes']} of the {k} chains; set top_nodes: 0 (every node) or >= num_drafts")
            if scope["max_nodes"] and scope["max_nodes"] < k * gamma:
                raise ValueError(f"method 'spectr' with drafter {scope['kind']}: max_nodes={scope['max_nodes']} would cut the "
                                 f"{k} x {gamma} chain nodes; set max_nodes: 0 (no budget) or >= num_drafts x gamma")

    @property
    def tree_depth(self) -> int:
        return self.gamma

    def propose(self, context, depth, generator):
        return self.propose_tree(context, [self.num_drafts] + [1] * (depth - 1), generator)

    def verify(self, P, tree, generator):
        path, dist = kseq_chain_walk(P, tree, generator)
        return path, int(sample(dist, generator))
