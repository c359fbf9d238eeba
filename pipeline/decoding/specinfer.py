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

from .base import EAGLE_KINDS, Param, int_list_at_least
from .drafters import build_drafter, drafter_param, resolve_drafter
from .speculative import TreeVerifyDecoder
from .tree_verify import commit_draft, mss_tree_walk, sample_token_tree
from .warping import sample

TREE_DRAFTERS = ("model", "eagle", "eagle3")


class SpecInferDecoder(TreeVerifyDecoder):
    name = "specinfer"
    needs_draft = True
    lossless = True
    replacement = True
    deterministic_children = False  # EAGLE trees: children drawn from q (the walks' contract)
    params = {
        "drafter": drafter_param(TREE_DRAFTERS),
        "k_config": Param([4, 2, 2], int_list_at_least(1), "children per node at each depth"),
    }

    @classmethod
    def resolve_drafter(cls, values, ctx) -> None:
        resolve_drafter(cls.name, values, TREE_DRAFTERS, ctx)

    @classmethod
    def draft_needed(cls, values):
        return "drafter: model" if values["drafter"]["kind"] == "model" else False

    @classmethod
    def draft_alternative(cls) -> str:
        return ", or set drafter: eagle | eagle3 (with an EAGLE head in the pair)"

    def __init__(self, target, draft=None, assets=None, **params) -> None:
        super().__init__(target, draft, assets, **params)
        self.eagle = self.drafter["kind"] in EAGLE_KINDS
        if self.eagle:  # an EAGLE head drafts the tree (EAGLE-2's dynamic tree, drafters.EagleDrafter.propose_tree)
            self.drafter_impl = build_drafter(self)

    def _start(self, prompt: list[int]) -> None:
        if not self.eagle:
            return super()._start(prompt)
        self.target.reset()
        self.target.capture_hidden = True  # the head reads the target's features of every accepted position
        self.drafter_impl.start(prompt, self.target.prefill_hidden(prompt[:-1]))

    def commit(self, length, tree, path) -> None:
        if not self.eagle:
            if tree is not None:
                commit_draft(self.draft, length, tree, path)
            return
        rows = [0] + [1 + i for i in path] if tree is not None else [0]  # the root's row, then the path's
        self.drafter_impl.observe(self.target.hidden[rows], length - 1)

    @property
    def tree_depth(self) -> int:
        return len(self.k_config)

    def propose(self, context, depth, generator):
        return self.propose_tree(context, list(self.k_config[:depth]), generator)

    def propose_tree(self, context, k_config: list[int], generator):
        """A token tree with ``k_config[d]`` children per depth-d node, from the draft model or the EAGLE head."""
        if self.eagle:
            return self.drafter_impl.propose_tree(context, k_config, self.warper, generator, self.replacement,
                                                  self.deterministic_children)
        return sample_token_tree(self.draft, context, k_config, self.warper, generator, self.replacement)

    def verify(self, P, tree, generator):
        path, dist = mss_tree_walk(P, tree, generator, self.replacement)
        return path, int(sample(dist, generator))
