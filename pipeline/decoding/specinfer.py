"""specinfer: SpecInfer (Miao et al., ASPLOS 2024) with a token tree sampled from the drafter.

The drafter (a draft model, or an EAGLE head's EAGLE-2 tree) samples ``k_config[d]`` children i.i.d.
(with replacement) from its warped row under every depth-d node, e.g. (4, 2, 2) = 4 + 8 + 16 nodes; one
target pass with tree attention scores them all; multi-step speculative sampling (MSS) walks the tree
from the root: the first child accepted with probability min(1, p/q) is descended into, each rejection
replaces p by norm(relu(p - q)); when no child is accepted the next token comes from the updated p (the
plain target row at a leaf). Lossless (docs/ALGORITHMS.md 8). Temperature 0: the drafter's top-k distinct
tokens as children and greedy acceptance (exactly ``ar`` greedy).
"""

from __future__ import annotations

from .base import Param, int_list_at_least
from .drafter_scope import drafter_param
from .exact import mss_iid_cases
from .rules import TreeWalk
from .speculative import TreeVerifyDecoder
from .tree_verify import mss_rule

MSS_WALK = TreeWalk(mss_rule, children="iid", exact=mss_iid_cases)


class SpecInferDecoder(TreeVerifyDecoder):
    name = "specinfer"
    verification_method = "tree_specinfer"
    prefix_drafts = False
    lossless = True
    walk = MSS_WALK
    params = {
        "drafter": drafter_param(),
        "k_config": Param([4, 2, 2], int_list_at_least(1), "children per node at each depth"),
    }
