"""spd: speculative decoding with token verification (Leviathan et al. 2023; Chen et al. 2023).

A chain of gamma draft tokens; accept x_i with probability min(1, p/q) until the first
rejection, then draw from norm(relu(p - q)), or the bonus row when all pass. Lossless.
The chain comes from the ``drafter`` (a draft model, an EAGLE head, or n-gram lookup).
``lenience`` < 1 relaxes acceptance to min(1, p / (l q)) (lossy, Leviathan App. A.5).
"""

from __future__ import annotations

import torch

from .base import Param, in_half_open, int_at_least
from .speculative import DraftVerifyDecoder
from .verification import greedy_verify, lenient_greedy_verify, token_verify, token_verify_sparse
from .warping import sample, sample_sparse


class SpeculativeDecoder(DraftVerifyDecoder):
    name = "spd"
    lossless = True
    batchable = True
    params = {
        **DraftVerifyDecoder.params,
        # 3: measured on the default pair (docs/measurement.md, *Benchmark against transformers*); block uses the same
        "gamma": Param(3, int_at_least(1), "draft tokens per iteration"),
        "lenience": Param(1.0, in_half_open(0.0, 1.0), "1 = exact; < 1 accepts more (lossy)"),
    }

    def propose(self, context, gamma, generator):
        draft = self.draft_chain(context, gamma, generator)
        return None if draft is None else (draft.tokens, draft.probs)

    def verify(self, logits, tokens, probs, generator):
        if self.warper.greedy:
            if self.lenience < 1.0:
                n, y = lenient_greedy_verify(logits.softmax(-1), tokens, self.lenience)
            else:
                n, y = greedy_verify(logits.argmax(-1), tokens)
            return n, y
        u = torch.rand(tokens.shape[0], generator=generator, device=logits.device)
        rows = self.warper.sparse_rows(logits)
        if rows is not None:
            # top-k rows: verify on their k entries (no full-vocabulary temporaries; the same rule)
            n, index, weights = token_verify_sparse(*rows, probs, tokens, u, self.lenience)
            return n, sample_sparse(index, weights, generator)
        P = self.warper(logits)
        n, dist = token_verify(P, probs, tokens, u, self.lenience)
        return n, sample(dist, generator)
