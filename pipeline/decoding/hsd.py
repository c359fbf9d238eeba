"""hsd / hsd_ref: Hierarchical Speculative Decoding (Zhou et al., ICLR 2026) over the same chain draft as ``spd``.

The drafter proposes gamma tokens; one target pass scores them; the rule (``hsd_verify.py``) accepts the
whole draft by its joint ratio or steps back through HSD's hierarchy of capped residuals and resamples
there (docs/ALGORITHMS.md section 18).

- ``hsd`` applies the cap to the whole draft too: lossless, and draft by draft the same law as block
  verification (which it then equals in tokens per step).
- ``hsd_ref`` accepts the whole draft with the uncapped ``min(1, P(x)/Q(x))``, as the authors' code does:
  lossy for gamma >= 2 (its exact distance from the target law: ``python -m pipeline.exact``).

Temperature 0: greedy acceptance (exactly ``ar`` greedy). Any chain drafter (model, eagle, eagle3, ngram).
"""

from __future__ import annotations

from .base import Param, int_at_least
from .hsd_verify import hsd_reference_rule, hsd_rule
from .speculative import DraftVerifyDecoder
from .verification import greedy_verify


class HSDDecoder(DraftVerifyDecoder):
    name = "hsd"
    lossless = True
    rule = staticmethod(hsd_rule)
    # the same draft as spd and block, gamma included
    params = {**DraftVerifyDecoder.params, "gamma": Param(3, int_at_least(1), "draft tokens per iteration")}

    def propose(self, context, gamma, generator):
        draft = self.draft_chain(context, gamma, generator)
        return None if draft is None else (draft.tokens, draft.probs)

    def verify(self, logits, tokens, probs, generator):
        if self.warper.greedy:  # one-hot rows: every joint ratio is 0 or 1
            return greedy_verify(logits.argmax(-1), tokens)
        return self.rule(self.warper(logits), probs, tokens, generator)


class HSDReferenceDecoder(HSDDecoder):
    """HSD as published: the whole draft accepted with the uncapped joint ratio (lossy for gamma >= 2)."""

    name = "hsd_ref"
    lossless = False
    rule = staticmethod(hsd_reference_rule)
