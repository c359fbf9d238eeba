"""specinfer: SpecInfer (Miao et al., ASPLOS 2024) with a token tree sampled from the draft.

The draft samples ``k_config[d]`` children i.i.d. (with replacement) from its warped row under every
depth-d node, e.g. (4, 2, 2) = 4 + 8 + 16 nodes; one target pass with tree attention scores them
all; multi-step speculative sampling (MSS) walks the tree from the root: the first child accepted
with probability min(1, p/q) is descended into, each rejection replaces p by norm(relu(p - q));
when no child is accepted the next token comes from the updated p (the plain target row at a
leaf). Lossless (docs/ALGORITHMS.md 8). Temperature 0: the draft's top-k distinct tokens as children and
greedy acceptance (exactly ``ar`` greedy).
"""

from __future__ import annotations

from .base import Param, int_list_at_least
from .drafters import drafter_param, resolve_drafter
from .speculative import TreeVerifyDecoder
from .tree_verify import mss_tree_walk, sample_token_tree
from .warping import sample


class SpecInferDecoder(TreeVerifyDecoder):
    name = "specinfer"
    needs_draft = True
    lossless = True
    replacement = True
    params = {
        "drafter": drafter_param(("model",)),
        "k_config": Param([4, 2, 2], int_list_at_least(1), "children per node at each depth"),
    }

    @classmethod
    def resolve_drafter(cls, values, ctx) -> None:
        resolve_drafter(cls.name, values, ("model",), ctx)

    @property
    def tree_depth(self) -> int:
        return len(self.k_config)

    def propose(self, context, depth, generator):
        return sample_token_tree(self.draft, context, list(self.k_config[:depth]), self.warper, generator, self.replacement)

    def verify(self, P, tree, generator):
        path, dist = mss_tree_walk(P, tree, generator, self.replacement)
        return path, int(sample(dist, generator))
