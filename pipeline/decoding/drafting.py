"""The draft model's chain drafting (``ModelDrafter``'s, for every method over ``drafter: model``, BiLD's small-model
run included), at every batch size, and what the loop asks a drafter for: a chain (``ChainAsk``) or a tree
(``TreeAsk``).

``draft_chain`` drafts the chains of one or several requests: one draft forward per draft position over every
request still drafting (their rows packed into one step by a ``PackedCache``; a ``SoloCache`` at batch 1), each
request's row warped and sampled with its own generator, so a request draws what it draws alone. The draft model's
trees are drawn the same way, one packed forward per level (``tree_verify.draft_trees``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .kv import CachedModel
from .packed import Lanes, PackedRows
from .warping import Warper, sample, sample_sparse


@dataclass
class ChainDraft:
    tokens: torch.Tensor  # [g] draft tokens
    # [g, V] warped draft rows the tokens were drawn from; None: a deterministic proposal (prompt lookup), each row
    # the point mass at its token (q(x_i) = 1), which the rules take without a one-hot (``ChainRule.point_mass``)
    probs: torch.Tensor | None
    # the draft model's forwards spent on it (``draft_chain``: one per token, and one more where ``admit`` refused the
    # next draw); None: a drafter that counts its forwards itself
    forwards: int | None = None

    def q_at_tokens(self) -> torch.Tensor:
        """``q(x_i)`` of each draft token ``[g]`` (1 for a deterministic proposal)."""
        if self.probs is None:
            return torch.ones(self.tokens.shape[0], device=self.tokens.device)
        return self.probs[torch.arange(self.tokens.shape[0], device=self.probs.device), self.tokens]

    def one_hot(self, vocab_size: int) -> torch.Tensor:
        """The rows ``[g, V]``, a deterministic proposal's as one-hot rows (for a rule that does not declare
        ``point_mass``)."""
        if self.probs is not None:
            return self.probs
        rows = torch.zeros(self.tokens.shape[0], vocab_size, device=self.tokens.device)
        return rows.scatter_(1, self.tokens[:, None], 1.0)


@dataclass
class ChainAsk:
    """One request's proposal to make: up to ``gamma`` drafts after ``context``, drawn with ``generator``; ``slot``:
    its place in the loop (its sequence in a packed cache); ``drafter``: its own drafter (``Drafter.slots``);
    ``eos``: the run's end-of-sequence tokens (a method whose run ends after one reads them: BiLD's small model)."""

    slot: int
    context: list[int]
    gamma: int
    generator: torch.Generator | None
    drafter: Any = None
    eos: frozenset[int] = frozenset()


@dataclass
class TreeAsk:
    """One request's tree to draw: ``shape[d]`` children under each depth-d node after ``context`` (the tree loop's
    ``tree_shape``), drawn with ``generator``; ``slot`` and ``drafter`` as in ``ChainAsk``."""

    slot: int
    context: list[int]
    shape: list[int]
    generator: torch.Generator | None
    drafter: Any = None


def draft_chain(
    model: CachedModel,
    cache: Lanes,
    asks: list[ChainAsk],
    warper: Warper,
    stop: Callable[[torch.Tensor, torch.Tensor], bool] | None = None,
    admit: Callable[[torch.Tensor, torch.Tensor | None], bool] | None = None,
) -> list[ChainDraft]:
    """Sample up to ``ask.gamma`` tokens from the warped draft ``model`` after each ask's context (fewer when
    ``stop(q_row, token)``, called after each draft, says to end there: ``draft_stop: confidence``, or BiLD's EOS;
    or when ``admit(q_row, logits_row)``, called before each draw, refuses it: the chain ends there without a draw
    from the generator, BiLD's fallback; ``logits_row``: the row's fp32 logits over the target vocabulary, None on
    the top-k path, whose ``q_row`` is the warped row all the same).

    ``cache``: the draft model's sequences (``model``'s own cache at batch 1). A sequence's cache may hold any
    prefix of its context; its first forward feeds the rest (usually one token, two after a fully accepted block,
    a new request's whole prompt in a packed cache). Afterwards it holds ``context + x[:-1]`` (``context + x`` after
    a refused draw). A top-k warper warps and samples on the draft's own (restricted) head; at batch 1 without a
    stop or an admit the bf16 kernels draw the whole chain in one call (``CachedModel.fused_chain``: the same draws
    as the steps). Each chain counts its draft forwards (``ChainDraft.forwards``).
    """
    sparse = warper.sparse(model.vocab_size)
    if sparse and stop is None and admit is None and cache.solo and len(asks) == 1:
        a = asks[0]
        fused = model.fused_chain(a.context[cache.length(a.slot) :], a.gamma, warper, a.generator)
        if fused is not None:
            chain, ids, probs = fused
            dense = torch.zeros(a.gamma, model.vocab_size, device=model.device)
            return [ChainDraft(chain, dense.scatter_(-1, ids, probs), a.gamma)]
    tokens: list[list[torch.Tensor]] = [[] for _ in asks]
    rows: list[list[torch.Tensor]] = [[] for _ in asks]
    fed = [0] * len(asks)
    drafting = [i for i, a in enumerate(asks) if a.gamma > 0]
    j = 0
    while drafting:
        groups = []
        for i in drafting:
            a = asks[i]
            feed = torch.tensor(a.context[cache.length(a.slot) :], dtype=torch.long) if j == 0 else tokens[i][-1]
            groups.append(PackedRows(a.slot, feed.reshape(-1), [feed.numel() - 1]))
        raws = cache.step(groups)
        going = []
        for i, raw in zip(drafting, raws):
            a = asks[i]
            fed[i] += 1
            if sparse:
                ids, probs = model.top_k_rows(raw[-1], warper)
                q = torch.zeros(model.vocab_size, device=model.device).scatter_(-1, ids, probs)
                if admit is not None and not admit(q, None):
                    continue
                t = sample_sparse(ids, probs, a.generator)
            else:
                logits = model.logits(raw[-1:])[0]
                q = warper(logits)
                if admit is not None and not admit(q, logits):
                    continue
                t = q.argmax(-1) if warper.greedy else sample(q, a.generator)
            tokens[i].append(t)
            rows[i].append(q)
            if j + 1 < a.gamma and not (stop is not None and stop(q, t)):
                going.append(i)
        drafting, j = going, j + 1
    return [
        ChainDraft(torch.stack(t), torch.stack(q), n)
        if t
        else ChainDraft(torch.zeros(0, dtype=torch.long), torch.zeros(0), n)
        for t, q, n in zip(tokens, rows, fed)
    ]
