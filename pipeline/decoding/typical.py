"""typical: typical acceptance (Medusa-2, Cai et al. 2024) over a draft model's chain, or over Medusa heads.

``drafter: model`` (the MTAD paper's baseline; ``draft`` is an alias), ``eagle`` or ``ngram``: the
drafter proposes a chain of up to gamma tokens as for ``spd``; one
target pass scores them; the longest prefix whose tokens all satisfy
``p(x_i) > min(epsilon, delta * exp(-H(p_i)))`` is kept (p = the warped target row), and the next
token is drawn from the target row after it (``recovery: argmax`` takes its argmax, as Medusa's
"fast" mode does). ``drafter: eagle | eagle3`` with ``tree: true``: the head drafts EAGLE-2's dynamic
tree (``k_config``, top-k children, ``top_nodes``/``max_nodes`` of its scope) and the longest typical
path is kept. ``drafter: medusa``: the pair's Medusa heads propose a token tree that is
verified in one pass and the longest typical path is kept (the same as ``medusa`` with
``acceptance: typical``). Lossy by design; epsilon = 1 accepts nothing (plain sampling), epsilon =
0 accepts every token in the target's warped support. Temperature 0: exactly ``ar`` greedy.
"""

from __future__ import annotations

from .base import DRAFTER_KINDS, EAGLE_KINDS, Generation, Param, boolean, in_closed, int_list_at_least, nonneg_number, one_of
from .drafters import drafter_param, drafter_scope, resolve_drafter
from .medusa import MedusaDecoder
from .medusa_heads import medusa_heads_of
from .specinfer import SpecInferDecoder
from .speculative import DraftVerifyDecoder
from .tree_verify import typical_tree_walk
from .verification import greedy_verify, typical_verify
from .warping import sample


class EagleTypicalTree(SpecInferDecoder):
    """``typical`` with ``drafter: eagle | eagle3`` and ``tree: true``: an EAGLE-2 dynamic tree (top-k distinct
    children per expanded node, as EAGLE-2 drafts) verified in one target pass by the typical tree walk."""

    name = "typical"
    replacement = False
    deterministic_children = True

    def configure(self, epsilon: float, delta: float, recovery: str) -> "EagleTypicalTree":
        self.epsilon, self.delta, self.recovery = epsilon, delta, recovery
        return self

    def verify(self, P, tree, generator):
        path, row = typical_tree_walk(P, tree, self.epsilon, self.delta)
        p = P[row]
        return path, int(p.argmax(-1) if self.recovery == "argmax" else sample(p, generator))


class TypicalDecoder(DraftVerifyDecoder):
    name = "typical"
    batchable = True  # over a chain (tree: true and drafter: medusa decode one sequence at a time)
    needs_draft = False  # only with drafter: model (draft_needed)
    params = {
        **DraftVerifyDecoder.params,
        "epsilon": Param(0.09, in_closed(0.0, 1.0), "posterior threshold"),
        "delta": Param(0.3, nonneg_number, "posterior alpha: the entropy-scaled threshold factor"),
        "drafter": drafter_param(extra=("draft", "medusa"), help="a chain drafter (model | eagle | eagle3 | ngram, or {kind: ..., <its parameters>}; draft = model), the pair's drafter (pair), or the pair's Medusa heads (medusa)"),
        "recovery": Param("sample", one_of("sample", "argmax"), "next token after the kept prefix"),
        "k_config": Param([4, 2, 2], int_list_at_least(1), "Medusa tree (drafter: medusa) or EAGLE tree (tree: true): top-k per depth"),
        "tree": Param(False, boolean, "drafter eagle | eagle3: an EAGLE-2 tree of k_config instead of a chain of gamma"),
    }

    @classmethod
    def check_combination(cls, values) -> None:
        if values["tree"] and values["drafter"]["kind"] not in EAGLE_KINDS:
            raise ValueError(
                f"method 'typical': tree: true needs drafter: eagle | eagle3 (drafter: medusa always drafts a tree; a draft "
                f"model's trees are specinfer / mcss), got drafter: {values['drafter']['kind']}"
            )

    @classmethod
    def resolve_drafter(cls, values, ctx) -> None:
        scope = drafter_scope(values["drafter"])
        if scope["kind"] == "draft":
            scope["kind"] = "model"
        if scope["kind"] == "medusa":
            if len(scope) > 1:
                raise ValueError(f"method 'typical': drafter medusa takes no parameters (the tree is k_config), got {sorted(set(scope) - {'kind'})}")
            values["drafter"] = {"kind": "medusa"}
            return
        values["drafter"] = scope
        resolve_drafter(cls.name, values, tuple(DRAFTER_KINDS), ctx)

    @classmethod
    def batch_refusal(cls, values):
        if values.get("tree"):
            return "tree: true verifies a token tree, and trees decode one sequence at a time"
        if values["drafter"]["kind"] == "medusa":
            return "drafter: medusa drafts a token tree, and trees decode one sequence at a time"
        return super().batch_refusal(values)

    def chain_proposal(self, tokens, probs):
        return None

    @classmethod
    def draft_alternative(cls) -> str:
        return ", or set drafter: ngram | medusa (or eagle / eagle3, with an EAGLE head in the pair)"

    def __init__(self, target, draft=None, assets=None, **params) -> None:
        super().__init__(target, draft, assets, **params)
        self.medusa: MedusaDecoder | None = None
        self.eagle_tree: EagleTypicalTree | None = None
        if self.tree:  # EAGLE-2's tree of the head, typical acceptance over it
            shared = {k: getattr(self, k) for k in ("temperature", "top_k", "top_p", "k_config", "drafter")}
            self.eagle_tree = EagleTypicalTree(target, None, assets, **shared).configure(self.epsilon, self.delta, self.recovery)
        if self.drafter["kind"] == "medusa":  # a tree, not a chain: the medusa method with typical acceptance
            medusa_heads_of(target, "typical (drafter: medusa)")
            shared = {k: getattr(self, k) for k in MedusaDecoder.all_params() if k != "acceptance"}
            self.medusa = MedusaDecoder(target, acceptance="typical", **shared)
        inner = self.medusa or self.eagle_tree
        if inner is not None:  # one KV cache over the target: the decoder that generates, the inner one's
            self.target = inner.target

    def _generate(self, prompt, max_new_tokens, eos, generator) -> Generation:
        if self.medusa is not None:
            return self.medusa._generate(prompt, max_new_tokens, eos, generator)
        if self.eagle_tree is not None:
            return self.eagle_tree._generate(prompt, max_new_tokens, eos, generator)
        return super()._generate(prompt, max_new_tokens, eos, generator)

    def propose(self, context, gamma, generator):
        draft = self.draft_chain(context, gamma, generator)
        return None if draft is None else (draft.tokens, None)

    def verify(self, logits, tokens, proposal, generator):
        if self.warper.greedy:
            return greedy_verify(logits.argmax(-1), tokens)
        P = self.warper(logits)
        n, row = typical_verify(P, tokens, self.epsilon, self.delta)
        y = row.argmax(-1) if self.recovery == "argmax" else sample(row, generator)
        return n, y
