"""The speculative loop: draft, one target forward, the rule, roll back or compact, emit.

A speculative method declares what is particular to it (``rules.py``): a chain method its ``rule``, a tree
method its ``walk`` and tree shape, both their parameters; its ``drafter`` (``drafters.py``: a draft model,
an EAGLE head, n-gram lookup, Medusa heads, or one of your own) proposes. One iteration is

- a chain (the chain loop of ``batched.py``, at every batch size, batch 1 included; docs/ALGORITHMS.md appendix
  A.1): the drafter proposes g tokens (``propose_chains``); one target forward over ``[last token] + draft``
  gives g + 1 rows; the rule says how many drafts to keep and what comes next (``verify`` -> ``rule``, the one
  host read of the iteration after it); the target's cache is rolled back to what was kept and the drafter gets
  the verdict (``feedback``);
- a tree (the same loop of ``batched.py``, at every batch size): the drafter proposes a token tree
  (``tree.TokenTree``, ``propose_trees``) drawn as the walk needs; one target forward with tree attention scores
  every node, ``[last token] + nodes`` with the tree's mask (docs/ALGORITHMS.md A.2; at batch > 1 every request's
  tree in one packed forward, each with its own mask); the walk returns the accepted path and the next token
  (``verify_tree``); the path's KV is compacted into place and the drafter gets the verdict.

A chain's length is ``gamma``, or, with ``draft_stop`` (``draft_length.py``), at most ``gamma``: chosen before
drafting from the request's running acceptance, or cut where the draft's own confidence falls (the rule reads only
the draft, so every rule verifies what was proposed and the lossless ones stay lossless). Near ``max_new_tokens``
the draft is shortened so no work is wasted; when the drafter has nothing to
propose (n-gram lookup without a match, Medusa before the first hidden state) the iteration is a plain
target step. Temperature 0 uses each rule's ``greedy`` form and ``greedy_tree_walk`` (exactly ``ar`` greedy).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch

from .base import Decoder, Generation, Param, int_at_least
from .batched import BatchedDecoder
from .capabilities import Capabilities
from .draft_length import DRAFT_LENGTH_PARAMS, DraftLength, check_draft_length
from .drafter_context import DRAFTERS
from .drafter_scope import (
    accepted_kinds,
    build_drafter,
    drafter_class,
    drafter_param,
    fold_drafter_short_forms,
    resolve_drafter,
)
from .drafters import Drafter
from .drafting import ChainAsk, ChainDraft, TreeAsk
from .rules import ChainRule, TreeWalk
from .tree import TokenTree
from .tree_verify import greedy_tree_walk
from .warping import sample, sample_sparse

CHILDREN_WHY = {
    "iid": "i.i.d. from the draft's rows q",
    "distinct": "from q without replacement",
    "top": "as the top k",
}


# the chain draft of spd, block and hsd, gamma included (3: measured on the default pair,
# benchmarks/notes-cpu-bench-history.md)
CHAIN_GAMMA = Param(3, int_at_least(1), "draft tokens per iteration")


class DraftVerifyDecoder(Decoder):
    """A speculative method over a drafter: a chain ``rule`` (``draft_shape = "chain"``) or a tree ``walk``."""

    loop = "chain"
    draft_shape = "chain"
    # a method that drafts with a drafter of its own (medusa: its heads), not through a ``drafter`` parameter
    own_drafter: ClassVar[type[Drafter] | None] = None
    params = {
        "gamma": Param(4, int_at_least(1), "draft tokens per iteration"),
        "drafter": drafter_param(),
        **DRAFT_LENGTH_PARAMS,  # draft_stop, draft_threshold, draft_cost: how long each chain is (gamma: the most)
    }

    def __init__(self, target, draft=None, assets=None, **params) -> None:
        super().__init__(target, draft, assets, **params)
        self.drafter_impl: Drafter = self.make_drafter()
        values, caps = self.config, self.capabilities
        self.tree_walk = caps.walk
        self.rule_params = {k: values[k] for k in (self.rule.params if self.rule else ())}
        self.walk_params = {k: values[k] for k in (self.tree_walk.params if self.tree_walk else ())}
        # the draft positions one iteration puts to the target at most: a chain's budget, a tree's levels (at most
        # what the drafter drafts: Medusa's heads)
        depth = caps.draft_depth
        assert depth is not None, f"{type(self).__name__}: its capabilities declare no draft depth"
        self.draft_depth: int = min(depth, self.drafter_impl.max_depth or depth)
        self.length_policy = DraftLength.of(self.args)
        self.drafter_impl.stop = self.length_policy.drafter_stop()  # a drafter that stops inside its loop reads it

    @property
    def chain_rule(self) -> ChainRule:
        """The chain rule of a chain method (``rule``, which the class declares)."""
        assert self.rule is not None, f"{type(self).__name__} declares no chain rule"
        return self.rule

    @property
    def walk_impl(self) -> TreeWalk:
        """The tree walk of a tree method (``tree_walk``, set when the shape is a tree)."""
        assert self.tree_walk is not None, f"{type(self).__name__} verifies chains here, not trees"
        return self.tree_walk

    def make_drafter(self) -> Drafter:
        """The drafter the resolved ``drafter`` scope names, or the method's own (``own_drafter``)."""
        return self.own_drafter.create(self, {}) if self.own_drafter is not None else build_drafter(self)

    # ------------------------------------------------------------------ capabilities (before any model loads)

    @classmethod
    def capabilities_of(cls, values: dict[str, Any], drafter: Any = None) -> Capabilities:
        """A chain method's (``gamma`` drafts) or a tree method's (``k_config`` levels, else ``gamma``: spectr's
        chains; its ``walk``), over the drafter ``values`` name (or ``drafter``, a Drafter class, or the method's
        ``own_drafter``); refused above batch 1 when that drafter drafts one sequence at a time. A method whose shape,
        depth, walk or losslessness follows a parameter overrides this (``dataclasses.replace`` of it)."""
        plugin = drafter if drafter is not None else cls.own_drafter
        kind = plugin.kind if plugin is not None else None
        if plugin is None:
            scope = values.get("drafter")
            kind = scope.get("kind") if isinstance(scope, dict) else scope  # as configured (or `module:attr`)
            plugin = drafter_class(kind) if isinstance(kind, str) else None
        shape = cls.draft_shape
        refusal = None
        if plugin is None or not plugin.batchable:
            batchable = DRAFTERS.names(where=lambda c: c.batchable)
            refusal = f"drafter {kind} drafts one sequence at a time (batchable drafters: {batchable})"
        return Capabilities(
            loop=cls.loop,
            draft_shape=shape,
            draft_depth=len(values["k_config"]) if shape == "tree" and "k_config" in values else values.get("gamma"),
            lossless=cls.lossless,
            batch_refusal=refusal,
            drafter=kind,
            requires=cls.requires,
            walk=cls.walk if shape == "tree" else None,
        )

    @classmethod
    def as_tree(cls, caps: Capabilities, values: dict[str, Any]) -> Capabilities:
        """``caps`` of a configuration that verifies a tree of ``k_config`` with the class's ``walk`` (typical's
        ``tree: true``)."""
        return replace(caps, loop="tree", draft_shape="tree", draft_depth=len(values["k_config"]), walk=cls.walk)

    @classmethod
    def accepts(cls, drafter: type[Drafter], values: dict[str, Any]) -> str | None:
        """None when this method can verify ``drafter``'s proposals, else why not (its error messages)."""
        caps = cls.capabilities_of(values, drafter)
        shape = caps.draft_shape
        if shape not in drafter.shapes:
            return (
                f"drafter {drafter.kind} makes {' and '.join(sorted(drafter.shapes))} proposals; "
                f"this method verifies a {shape}"
            )
        if caps.walk is not None:
            need = caps.walk.children
            if need not in drafter.tree_children:
                return (
                    f"this method's walk needs a tree whose children are drawn {CHILDREN_WHY[need]}, "
                    f"which drafter {drafter.kind} cannot draw"
                )
        return None

    @classmethod
    def fold_params(cls, params):
        return fold_drafter_short_forms(params) if "drafter" in cls.params else params

    @classmethod
    def resolve_drafter(cls, values, ctx) -> None:
        if "drafter" in cls.params:
            resolve_drafter(cls, values, ctx)

    @classmethod
    def draft_needed(cls, values):
        if "drafter" not in cls.params:
            return super().draft_needed(values)
        return "drafter: model" if drafter_class(values["drafter"]["kind"]).asset == "draft" else False

    @classmethod
    def draft_alternative(cls, values) -> str:
        others = [k for k in accepted_kinds(cls, values) if drafter_class(k).asset != "draft"]
        return f", or set drafter: {' | '.join(others)} (each with what it needs in the pair)" if others else ""

    # ------------------------------------------------------------------ the loop

    @classmethod
    def check_combination(cls, values) -> None:
        super().check_combination(values)
        check_draft_length(values)

    def start(self, prompt: list[int]) -> None:
        """One request started by hand, outside the loop (a drafter's proposal asked directly, ``propose``): empty
        the caches; the target caches ``prompt[:-1]`` and the drafter starts (with the target's hidden states of
        those positions when it reads them)."""
        target, drafter = self.target, self.drafter_impl
        target.reset()
        hidden = None
        if drafter.uses_hidden and drafter.prompt_hidden:
            target.capture_hidden = True
            hidden = target.prefill_hidden(prompt[:-1])
        else:
            target.capture_hidden = False
            target.prefill(prompt[:-1])
        target.capture_hidden = drafter.uses_hidden
        drafter.start(prompt, hidden)
        self.length_policy.start()

    def _generate(self, prompt, max_new_tokens, eos, generator) -> Generation:
        """The loop of ``batched.py`` (chain or tree) over this one request."""
        return BatchedDecoder(self, 1).decode(prompt, max_new_tokens, eos, generator)

    # ------------------------------------------------------------------ the method's part

    def propose_chains(self, asks: list[ChainAsk]) -> list[tuple[torch.Tensor, Any] | None]:
        """Each ask's chain (the chain loop's step 1, for every live request at once): up to ``ask.gamma`` draft
        tokens after its context from its own drafter (``Drafter.propose_chains``; the asks' drafters are slots of
        ``drafter_impl``), cut by ``draft_stop: confidence``, with what the rule reads as Q (``ChainRule.draft``:
        the drafter's rows, their log-probabilities at the drafts, or None); None: nothing drafted."""
        chains = asks[0].drafter.propose_chains(asks, self.warper)
        return [None if c is None or c.tokens.shape[0] == 0 else self.rule_input(self.cut_draft(c)) for c in chains]

    def propose(self, context: list[int], gamma: int, generator) -> tuple[torch.Tensor, Any] | None:
        """``propose_chains`` of one request after ``start``."""
        return self.propose_chains([ChainAsk(0, context, gamma, generator, self.drafter_impl)])[0]

    def rule_input(self, draft: ChainDraft) -> tuple[torch.Tensor, Any]:
        """A chain's tokens and what the rule declares it reads (``ChainRule.draft``); a deterministic proposal's
        rows (``draft.probs`` None) stay None for a rule that declares ``point_mass``, else become one-hot rows."""
        rule = self.chain_rule
        if rule.draft == "log_q":
            return draft.tokens, torch.log(draft.q_at_tokens())
        if rule.draft != "rows":
            return draft.tokens, None
        return draft.tokens, (draft.probs if rule.point_mass else draft.one_hot(self.target.vocab_size))

    def cut_draft(self, draft: ChainDraft) -> ChainDraft:
        """The chain as ``draft_stop: confidence`` keeps it: up to and including the first draft whose own probability
        is under the threshold (the draft model stops inside its loop and comes back whole; the other drafters'
        drafts past the stop are discarded here, and ``feedback`` rolls their caches back to what the target
        kept)."""
        if self.length_policy.stop != "confidence":
            return draft
        k = self.length_policy.cut(draft.q_at_tokens())
        if k == draft.tokens.shape[0]:
            return draft
        return ChainDraft(draft.tokens[:k], None if draft.probs is None else draft.probs[:k])

    def verify(self, logits: torch.Tensor, x: torch.Tensor, q: Any, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The chain rule on target logits ``[g+1, V]``: (drafts accepted, next token) as 0-d tensors, left on the
        device (the loop reads them with the draft in one transfer). The sparse fast path when the rule has one
        and the warping is top-k on the CPU; the dense rule otherwise."""
        rule, params = self.chain_rule, self.rule_params
        if self.warper.greedy:
            return rule.greedy(logits, x, **params)
        u = torch.rand(x.shape[0], generator=generator, device=logits.device) if rule.coins else None
        rows = self.warper.sparse_rows(logits) if rule.sparse is not None else None
        if rows is not None and rule.sparse is not None:
            n, index, weights = rule.sparse(*rows, q, x, u, **params)
            return n, sample_sparse(index, weights, generator)
        n, out = rule.dense(self.warper(logits), q, x, u, **params)
        return n, out if out.dim() == 0 else sample(out, generator)

    def tree_shape(self, depth: int) -> list[int]:
        """Children per node at each of ``depth`` levels."""
        return list(self.args.k_config[:depth])

    def propose_trees(self, asks: list[TreeAsk]) -> list[TokenTree | None]:
        """Each ask's tree (the tree loop's step 1, for every live request at once): ``ask.shape`` (``tree_shape``)
        from its own drafter, its children drawn as the walk needs (``Drafter.propose_trees``); None: nothing to
        propose (a plain target step)."""
        return asks[0].drafter.propose_trees(asks, self.warper, self.walk_impl.children)

    def verify_tree(self, logits: torch.Tensor, tree: TokenTree, generator) -> tuple[list[int], int]:
        """The walk on the tree's target logits ``[1 + n, V]``: (accepted path, next token)."""
        if self.warper.greedy:
            return greedy_tree_walk(logits.argmax(-1), tree)
        path, out = self.walk_impl.walk(self.warper(logits), tree, generator, **self.walk_params)
        return path, int(out if out.dim() == 0 else sample(out, generator))

    def next_token(self, logits: torch.Tensor, generator: torch.Generator | None) -> int:
        """A plain step's token; ``recovery: argmax`` (typical, medusa) takes the warped row's argmax."""
        if not self.warper.greedy and self.config.get("recovery", "sample") == "argmax":
            return int(self.warper(logits).argmax(-1))
        return super().next_token(logits, generator)


class TreeVerifyDecoder(DraftVerifyDecoder):
    """A tree method: its drafter proposes a token tree of ``k_config`` (``tree_shape``), its ``walk`` verifies it."""

    loop = "tree"
    draft_shape = "tree"
