"""block: block verification (Sun et al., ICLR 2025), over the same chain draft as ``spd`` (any ``drafter``).

Every prefix length i gets its own coin against h_i; the longest passing length is kept (no early
stop), then the next token comes from the block residual. Lossless, and never accepts fewer tokens
than token verification. Fresh coins every iteration (docs/ALGORITHMS.md 3.3).
"""

from __future__ import annotations

import torch

from .base import Param, int_at_least
from .speculative import DraftVerifyDecoder
from .verification import block_verify, block_verify_sparse, greedy_verify
from .warping import sample, sample_sparse


class BlockVerificationDecoder(DraftVerifyDecoder):
    name = "block"
    lossless = True
    batchable = True
    # the same draft as spd, gamma included (3: measured on the default pair, docs/measurement.md *Benchmark against transformers*)
    params = {**DraftVerifyDecoder.params, "gamma": Param(3, int_at_least(1), "draft tokens per iteration")}

    def propose(self, context, gamma, generator):
        draft = self.draft_chain(context, gamma, generator)
        return None if draft is None else (draft.tokens, draft.probs)

    def verify(self, logits, tokens, probs, generator):
        if self.warper.greedy:  # block verification adds nothing for one-hot targets
            n, y = greedy_verify(logits.argmax(-1), tokens)
            return n, y
        eta = torch.rand(tokens.shape[0], generator=generator, device=logits.device)
        rows = self.warper.sparse_rows(logits)
        if rows is not None:
            # top-k rows: verify on their k entries (no full-vocabulary temporaries; the same rule)
            tau, index, weights = block_verify_sparse(*rows, probs, tokens, eta)
            return tau, sample_sparse(index, weights, generator)
        P = self.warper(logits)
        tau, dist = block_verify(P, probs, tokens, eta)
        return tau, sample(dist, generator)
