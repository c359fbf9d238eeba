"""spectr: SpecTr (Sun et al., NeurIPS 2023): k i.i.d. draft chains, K-SEQ selection at each depth.

The draft samples ``num_drafts`` independent chains of ``gamma`` tokens (as one tree of k chains:
one draft forward per depth); one target pass with tree attention scores every chain. Depth by
depth, K-SEQ with rho* (recomputed for every depth and number of surviving chains) accepts one of
the candidate tokens of the chains that still agree with the accepted prefix; chains carrying the
accepted token survive. When every candidate is rejected the next token comes from the K-SEQ
residual; after gamma accepted tokens, from the target's bonus row. Lossless (docs/ALGORITHMS.md 7, A.4).
Temperature 0: the chains start from the draft's top-k distinct tokens, greedy acceptance.
"""

from __future__ import annotations

from .base import Param, int_at_least
from .drafters import drafter_param, resolve_drafter
from .speculative import TreeVerifyDecoder
from .tree_verify import kseq_chain_walk, sample_token_tree
from .warping import sample


class SpecTrDecoder(TreeVerifyDecoder):
    name = "spectr"
    needs_draft = True
    lossless = True
    params = {
        "drafter": drafter_param(("model",)),
        "num_drafts": Param(4, int_at_least(1), "k i.i.d. draft chains"),
        "gamma": Param(4, int_at_least(1), "tokens per draft chain"),
    }

    @classmethod
    def resolve_drafter(cls, values, ctx) -> None:
        resolve_drafter(cls.name, values, ("model",), ctx)

    @property
    def tree_depth(self) -> int:
        return self.gamma

    def propose(self, context, depth, generator):
        k_config = [self.num_drafts] + [1] * (depth - 1)
        return sample_token_tree(self.draft, context, k_config, self.warper, generator, replacement=True)

    def verify(self, P, tree, generator):
        path, dist = kseq_chain_walk(P, tree, generator)
        return path, int(sample(dist, generator))
