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

from .exact import hsd_cases, hsd_reference_cases
from .hsd_verify import hsd_dense, hsd_reference_dense
from .rules import ChainRule
from .speculative import CHAIN_GAMMA, DraftVerifyDecoder

HSD_RULE = ChainRule(hsd_dense, exact=hsd_cases, point_mass=True)
HSD_REFERENCE_RULE = ChainRule(hsd_reference_dense, exact=hsd_reference_cases, point_mass=True)


class HSDDecoder(DraftVerifyDecoder):
    name = "hsd"
    verification_method = "hsd"
    prefix_drafts = True
    lossless = True
    rule = HSD_RULE
    params = {**DraftVerifyDecoder.params, "gamma": CHAIN_GAMMA}  # the same draft as spd


class HSDReferenceDecoder(HSDDecoder):
    """HSD as published: the whole draft accepted with the uncapped joint ratio (lossy for gamma >= 2)."""

    name = "hsd_ref"
    verification_method = "hsd_ref"
    lossless = False
    rule = HSD_REFERENCE_RULE
