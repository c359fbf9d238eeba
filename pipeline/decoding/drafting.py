"""Chain drafting: the draft model proposes gamma tokens autoregressively (shared by spd and block)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .kv import CachedModel
from .warping import Warper, sample, sample_sparse


@dataclass
class ChainDraft:
    tokens: torch.Tensor  # [g] draft tokens
    probs: torch.Tensor  # [g, V] warped draft rows the tokens were drawn from


def draft_chain(
    draft: CachedModel,
    context: list[int],
    gamma: int,
    warper: Warper,
    generator: torch.Generator | None,
    stop: Callable[[torch.Tensor, torch.Tensor], bool] | None = None,
) -> ChainDraft:
    """Sample ``gamma`` tokens from the warped draft after ``context`` (fewer when ``stop(q_row, token)``, called
    after each draft, says to end there: ``draft_stop: confidence``; one host read per draft then).

    The draft cache may hold any prefix of ``context``; the first forward feeds the rest (usually
    one token, two after a fully accepted block). Afterwards the cache holds ``context + x[:-1]``.
    """
    pending: list[int] | torch.Tensor = context[draft.length :]
    tokens: list[torch.Tensor] = []
    rows: list[torch.Tensor] = []
    if warper.sparse(draft.vocab_size):  # top-k sampling: warp and sample on the draft's own (restricted) head
        dense = torch.zeros(gamma, draft.vocab_size, device=draft.device)
        fused = draft.fused_chain(pending, gamma, warper, generator)  # the same draws in one kernel call
        if fused is not None:
            chain, ids, probs = fused
            return ChainDraft(chain, dense.scatter_(-1, ids, probs))
        for i in range(gamma):
            ids, probs = draft.forward_sparse(pending, warper)
            dense[i].scatter_(-1, ids, probs)
            t = sample_sparse(ids, probs, generator)
            tokens.append(t)
            pending = t.reshape(1)
            if stop is not None and i + 1 < gamma and stop(dense[i], t):
                break
        return ChainDraft(torch.stack(tokens), dense[: len(tokens)])
    for i in range(gamma):
        q = warper(draft.forward(pending, keep=1)[-1])
        t = sample(q, generator) if not warper.greedy else q.argmax(-1)
        rows.append(q)
        tokens.append(t)
        pending = t.reshape(1)
        if stop is not None and i + 1 < gamma and stop(q, t):
            break
    return ChainDraft(torch.stack(tokens), torch.stack(rows))
