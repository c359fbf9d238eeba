"""mcss: Multi-Candidate Speculative Sampling (Yang et al. 2024) over SpecInfer's token tree.

The same tree and walk as ``specinfer``, but the children of a node are drawn WITHOUT replacement
from the drafter's warped row, and after each rejected child q is renormalised without it (the
residual uses the q current at that child). Lossless, and accepts at least as much as SpecInfer
per node (docs/ALGORITHMS.md 9, 15). When the warped draft row has fewer tokens than ``k_config[d]``
(small top-k / top-p), that node simply gets fewer children.
"""

from __future__ import annotations

from functools import partial

from .exact import mss_distinct_cases
from .rules import TreeWalk
from .specinfer import SpecInferDecoder
from .tree_verify import mss_rule

MCSS_WALK = TreeWalk(partial(mss_rule, replacement=False), children="distinct", exact=mss_distinct_cases)


class MCSSDecoder(SpecInferDecoder):
    name = "mcss"
    verification_method = "tree_mcss"
    walk = MCSS_WALK
