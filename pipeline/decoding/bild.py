"""bild: Big Little Decoder (Kim et al., NeurIPS 2023), the sampling generalization (docs/ALGORITHMS.md 6, A.6).

The small (draft) model decodes alone, up to ``max_small_steps`` tokens, while it is confident:
when the largest probability of its row is below ``fallback`` the step is discarded and control
falls back to the large (target) model. The large model then runs once, non-autoregressively, over
the small model's pending tokens; the first pending token whose cross-entropy under the large
model's raw logits, ``-log p(x)``, exceeds ``rollback`` is rolled back with everything after it
and replaced by the large model's token at that position; otherwise the large model adds its own
next token. Both caches are rolled back to what was kept. Lossy by design. Limiting cases:
``rollback: 0`` or ``fallback: 1`` give the target's own sampling (every small token is rolled
back / the small model never decodes). Confidence is read from the warped small row (from the raw
softmax at temperature 0, as the greedy reference does).

This is the chain loop (``batched.py``, at every batch size) with a draft of variable length (``propose_chains``:
the small model's confident run, at most ``max_small_steps`` tokens, ending after EOS) and the rollback policy as
its ``verify`` (``verification.bild_verify``: the one rule that reads the target's raw logits). The run is the draft
model's chain (``ModelDrafter.propose_chains`` over ``drafting.draft_chain``: every request's run in one packed
draft forward per position at batch > 1) with BiLD's confidence read before each draw (``admit``: an unconfident
row ends the run without a draw, its forward still a draft forward) and EOS as its stop. When the small model is
unsure at once, the iteration is a plain large-model step.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .base import Param, in_closed, int_at_least, nonneg_number
from .capabilities import Capabilities
from .drafter_scope import drafter_param
from .speculative import DraftVerifyDecoder
from .verification import bild_verify
from .warping import sample


class BiLDDecoder(DraftVerifyDecoder):
    name = "bild"
    verification_method = "bild"
    prefix_drafts = True
    requires = ("draft",)
    params = {
        "drafter": drafter_param(help="the small model: the pair's draft model (model); BiLD has no other drafter"),
        "max_small_steps": Param(10, int_at_least(1), "N: small-model tokens before a forced large step"),
        "fallback": Param(0.9, in_closed(0.0, 1.0), "fall back to the large model when max q < fallback"),
        "rollback": Param(2.0, nonneg_number, "roll back a small token when -log p_large(x) > rollback"),
    }

    @classmethod
    def accepts(cls, drafter, values) -> str | None:
        if not drafter.admits:  # the drafter contract's ``admits``: its chain asks BiLD's confidence before each draw
            return "BiLD's small model decodes its own run until it is unsure: it needs the draft model"
        return None

    @classmethod
    def draft_needed(cls, values):
        return True  # the small model is the draft model (no other drafter)

    @classmethod
    def draft_alternative(cls, values) -> str:
        return ""

    @classmethod
    def capabilities_of(cls, values, drafter=None) -> Capabilities:
        """A chain of at most ``max_small_steps`` (the small model's longest run: the loop's draft budget)."""
        return replace(super().capabilities_of(values, drafter), draft_depth=values["max_small_steps"])

    def propose_chains(self, asks):
        """Each ask's small-model run (every ask's at once: the draft model's ``propose_chains`` with BiLD's
        confidence as ``admit`` and the run's EOS as ``stop``); None where the small model is unsure at once."""
        eos = asks[0].eos
        stop = (lambda q, t: int(t) in eos) if eos else None
        chains = asks[0].drafter.propose_chains(asks, self.warper, admit=self.confident, stop=stop)
        return [(c.tokens, None) if c.tokens.shape[0] else None for c in chains]

    def confident(self, q: torch.Tensor, logits: torch.Tensor | None) -> bool:
        """Whether the small model draws from this row: the largest probability of its warped row ``q`` (of the raw
        softmax of its ``logits`` at temperature 0) is at least ``fallback``."""
        row = logits.softmax(-1) if self.warper.greedy and logits is not None else q
        return float(row.max()) >= self.args.fallback

    def verify(self, logits, tokens, proposal, generator):
        n, row = bild_verify(logits, tokens, self.args.rollback)
        y = row.argmax(-1) if self.warper.greedy else sample(self.warper(row), generator)
        return n, y
