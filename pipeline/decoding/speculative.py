"""The two speculative loops: draft a chain or a tree, verify it in one target forward, keep what passed.

``DraftVerifyDecoder`` (spd, block, mtad, typical, bild): the drafter (``drafters.py``: a draft
model, an EAGLE head or n-gram lookup) proposes g tokens; one target forward over ``[last token] +
draft`` gives g + 1 rows; the method's verifier says how many drafts to keep and what comes next;
both caches are rolled back to what was kept (docs/ALGORITHMS.md appendix A.1).

``TreeVerifyDecoder`` (spectr, specinfer, mcss, medusa): the method proposes a token tree
(``tree.TokenTree``); one target forward with tree attention scores every node
(``tree_verify.tree_verify_forward``); the method's walk returns the accepted path and the next
token; the path's KV is compacted into place in the target's cache (and the draft's).

A method file supplies only ``propose`` and ``verify``. Near ``max_new_tokens`` the draft is
shortened so no work is wasted; when the method has nothing to propose (n-gram lookup without a
match, Medusa before the first hidden state) the iteration is a plain target step.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import DRAFTER_KINDS, Decoder, Generation, Param, emit, int_at_least
from .drafters import Drafter, ModelDrafter, build_drafter, drafter_param, fold_drafter_short_forms, resolve_drafter
from .tree import TokenTree
from .tree_verify import commit_draft, greedy_tree_walk, tree_verify_forward


class DraftVerifyDecoder(Decoder):
    needs_draft = True  # with drafter: model (draft_needed)
    supported_drafters: tuple[str, ...] | None = None  # None: every registered drafter kind
    params = {
        "gamma": Param(4, int_at_least(1), "draft tokens per iteration"),
        "drafter": drafter_param(),
    }

    def __init__(self, target, draft=None, assets=None, **params) -> None:
        super().__init__(target, draft, assets, **params)
        self.drafter_impl: Drafter | None = build_drafter(self) if self.drafter["kind"] in DRAFTER_KINDS else None

    @classmethod
    def fold_params(cls, params):
        return fold_drafter_short_forms(params)

    @classmethod
    def resolve_drafter(cls, values, ctx) -> None:
        resolve_drafter(cls.name, values, cls.supported_drafters or tuple(DRAFTER_KINDS), ctx)

    @classmethod
    def draft_needed(cls, values):
        return "drafter: model" if values["drafter"]["kind"] == "model" else False

    @classmethod
    def draft_alternative(cls) -> str:
        return ", or set drafter: ngram (or eagle / eagle3, with an EAGLE head in the pair)"

    @classmethod
    def batch_refusal(cls, values):
        refusal = super().batch_refusal(values)
        kind = values["drafter"]["kind"] if isinstance(values.get("drafter"), dict) else values.get("drafter")
        if refusal is None and not getattr(DRAFTER_KINDS.get(kind), "batchable", False):
            batchable = sorted(k for k, c in DRAFTER_KINDS.items() if getattr(c, "batchable", False))
            return f"drafter {kind} drafts one sequence at a time (batchable drafters: {batchable})"
        return refusal

    def chain_proposal(self, tokens: torch.Tensor, probs: torch.Tensor) -> Any:
        """What ``verify`` takes beside a chain ``tokens [g]`` drawn from the warped draft rows ``probs [g, V]``
        (the batched engine drafts for many requests, then hands each chain to the method's rule)."""
        return probs

    def _start(self, prompt: list[int]) -> None:
        """Empty the caches; the target caches ``prompt[:-1]`` and the drafter starts (with the
        target's hidden states of those positions when it reads them)."""
        target, drafter = self.target, self.drafter_impl
        target.reset()
        hidden = None
        if drafter.uses_hidden:
            target.capture_hidden = True
            hidden = target.prefill_hidden(prompt[:-1])
        else:
            target.prefill(prompt[:-1])
        drafter.start(prompt, hidden)

    def propose(self, context: list[int], gamma: int, generator) -> tuple[torch.Tensor, Any] | None:
        """Draft up to ``gamma`` tokens after ``context``; return them and what ``verify`` needs
        (None: nothing drafted)."""
        raise NotImplementedError

    def verify(
        self, logits: torch.Tensor, tokens: torch.Tensor, proposal: Any, generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """From target logits ``[g+1, V]``: (number of drafts accepted, next token), as 0-d tensors.

        They stay on the device: the loop reads them with the draft in one transfer per iteration.
        """
        raise NotImplementedError

    def _generate(self, prompt, max_new_tokens, eos, generator) -> Generation:
        target, drafter = self.target, self.drafter_impl
        self._start(prompt)
        context = list(prompt)
        out: list[int] = []
        accepted: list[int] = []
        drafted: list[int] = []  # draft positions put to the target per iteration
        while len(out) < max_new_tokens:
            length = len(context)
            gamma = min(self.gamma, max_new_tokens - len(out) - 1)
            proposed = self.propose(context, gamma, generator) if gamma > 0 else None
            if proposed is None:  # one token left, or nothing drafted: a plain target step
                emitted = [self._next_token(target.forward(context[-1:], keep=1)[-1], generator)]
                drafted.append(0)
                if drafter.uses_hidden:
                    drafter.observe(target.hidden, length - 1)
            else:
                tokens, proposal = proposed
                gamma = tokens.shape[0]
                drafted.append(int(gamma))
                feed = torch.cat([torch.tensor(context[-1:], device=tokens.device), tokens])
                logits = target.forward(feed, keep=gamma + 1)
                n, y = self.verify(logits, tokens, proposal, generator)
                dev = tokens.device
                head = [torch.as_tensor(v, device=dev).reshape(1) for v in (n, y)]
                read = torch.cat([*head, tokens]).tolist()  # the one host read of the iteration
                n = read[0]
                emitted = read[2 : 2 + n] + [read[1]]
                target.rollback(length + n)
                drafter.rollback(length + n)
                if drafter.uses_hidden:
                    drafter.observe(target.hidden[: n + 1], length - 1)
            if emit(emitted, eos, max_new_tokens, out, context, accepted):
                break
        return Generation(out, target.forwards, drafter.forwards, accepted, drafted)

    def draft_chain(self, context: list[int], gamma: int, generator):
        """The drafter's chain (``ChainDraft``) or None when it has nothing to propose."""
        return self.drafter_impl.propose(context, gamma, self.warper, generator)


class TreeVerifyDecoder(Decoder):
    """Draft a token tree, verify it in one target forward, walk it, keep the path's KV, repeat.

    Subclasses set ``tree_depth`` (the most levels a tree may have) and supply ``propose`` and
    ``verify``; ``commit`` is where a proposer keeps its state in step with the accepted path (by
    default: the draft model keeps the accepted nodes it has cached). Temperature 0 uses
    ``greedy_tree_walk`` for every method (exactly ``ar`` greedy).
    """

    tree_depth: int

    def __init__(self, target, draft=None, assets=None, **params) -> None:
        super().__init__(target, draft, assets, **params)
        # the drafter whose cost the cell and the bench measure (t_draft)
        scope = getattr(self, "drafter", None)
        self.drafter_impl: Drafter | None = ModelDrafter(self.draft) if (isinstance(scope, dict) and scope["kind"] == "model" and self.draft is not None) else None

    def propose(self, context: list[int], depth: int, generator) -> TokenTree | None:
        """A tree of at most ``depth`` levels after ``context`` (None: nothing proposed, a plain target step)."""
        raise NotImplementedError

    def verify(self, P: torch.Tensor, tree: TokenTree, generator) -> tuple[list[int], int]:
        """From the warped target rows ``P [1 + n, V]`` (row 0: the root's): the accepted path (node
        indices, root down) and the next token."""
        raise NotImplementedError

    def commit(self, length: int, tree: TokenTree | None, path: list[int]) -> None:
        """The target kept ``path`` of ``tree`` after ``length`` context tokens (``tree`` None: a plain step)."""
        if tree is not None:
            commit_draft(self.draft, length, tree, path)

    def _generate(self, prompt, max_new_tokens, eos, generator) -> Generation:
        target, warper = self.target, self.warper
        self._start(prompt)
        context = list(prompt)
        out: list[int] = []
        accepted: list[int] = []
        drafted: list[int] = []  # tree depth put to the target per iteration
        while len(out) < max_new_tokens:
            length = len(context)
            depth = min(self.tree_depth, max_new_tokens - len(out) - 1)
            tree = self.propose(context, depth, generator) if depth > 0 else None
            if tree is None:  # one token left, or nothing proposed: a plain target step
                emitted = [self._next_token(target.forward(context[-1:], keep=1)[-1], generator)]
                self.commit(length, None, [])
                drafted.append(0)
            else:
                logits = tree_verify_forward(target, context, tree)
                if warper.greedy:
                    path, y = greedy_tree_walk(logits.argmax(-1), tree)
                else:
                    path, y = self.verify(warper(logits), tree, generator)
                target.compact(length, path)
                self.commit(length, tree, path)
                emitted = [tree.tokens[i] for i in path] + [y]
                drafted.append(max(tree.depths) + 1 if tree.depths else 0)
            if emit(emitted, eos, max_new_tokens, out, context, accepted):
                break
        return Generation(out, target.forwards, self.drafter_impl.forwards if self.drafter_impl is not None else 0, accepted, drafted)
