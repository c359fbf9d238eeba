"""traversal: Traversal Verification (Weng et al., NeurIPS 2025) over MCSS's token tree.

The draft model (or an EAGLE head, ``drafter: eagle | eagle3``) samples ``k_config[d]`` children WITHOUT
replacement under every depth-d node, as for ``mcss``; one target pass with tree attention scores them
all; the walk (``traversal_verify.traversal_walk``) verifies from the leaves up with sequence-level
acceptance probabilities, deleting a rejected leaf and updating its parent's residuals, and keeps the
first path it accepts (docs/ALGORITHMS.md section 19). Lossless; on a single chain it is block
verification. Temperature 0: the draft's top-k distinct tokens as children and greedy acceptance
(exactly ``ar`` greedy).
"""

from __future__ import annotations

from .exact import traversal_cases
from .mcss import MCSSDecoder
from .rules import TreeWalk
from .traversal_verify import generator_coin, traversal_walk


def traversal_rule(P, tree, generator):
    """``traversal_walk`` as a walk of the tree loop: its coins are uniforms from the cell's generator."""
    return traversal_walk(P, tree, generator_coin(generator, P.device))


TRAVERSAL_WALK = TreeWalk(traversal_rule, children="distinct", exact=traversal_cases)


class TraversalDecoder(MCSSDecoder):
    """MCSS's drafting (children without replacement, from a draft model or an EAGLE head), verified leaves up."""

    name = "traversal"
    verification_method = "tree_traversal"
    walk = TRAVERSAL_WALK
