"""mtad: multi-token approximate decoding (Qin et al., ICLR 2025).

The draft proposes gamma tokens by beam sampling (W beams, best beam by weight); the target
accepts the longest prefix whose joint-likelihood ratio min(1, p(x_1..j) / q(x_1..j)) exceeds
tau, then draws the next token from its own row (no residual). Lossy by design: tau = 1 is plain
sampling, tau = 0 accepts every draft token. Temperature 0: beam-search drafts, greedy acceptance. With ``drafter: eagle | ngram`` the draft is
the drafter's chain (one beam: ``num_beams`` applies to the draft model's beam sampling only) and
log q is the chain's per-token warped log-probabilities (0 for n-gram's one-hot rows).
"""

from __future__ import annotations

import torch

from .base import Param, boolean, in_closed, int_at_least, one_of
from .beam_sampling import BEAM_WEIGHTS, beam_sample
from .speculative import DraftVerifyDecoder
from .verification import greedy_verify, mtad_verify, mtad_verify_sparse
from .warping import sample, sample_sparse


class MTADDecoder(DraftVerifyDecoder):
    name = "mtad"
    batchable = True
    beam_drafts = True  # with drafter: model the chain is the best of num_beams beams (decoding/batched.py drafts them too)
    params = {
        **DraftVerifyDecoder.params,
        "gamma": Param(2, int_at_least(1), "draft tokens per iteration (2: measured on the default pair, docs/measurement.md)"),
        "num_beams": Param(4, int_at_least(1), "beams W of the draft's beam sampling"),
        "tau": Param(0.5, in_closed(0.0, 1.0), "acceptance threshold on the joint likelihood ratio"),
        "beam_weights": Param("paper", one_of(*BEAM_WEIGHTS), "paper eq. 2, or the released code's softmax"),
        "replacement": Param(False, boolean, "sample (beam, token) pairs with replacement"),
    }

    def propose(self, context, gamma, generator):
        if self.drafter["kind"] != "model":
            draft = self.draft_chain(context, gamma, generator)
            if draft is None:
                return None
            rows = torch.arange(draft.tokens.shape[0], device=draft.probs.device)
            return draft.tokens, torch.log(draft.probs[rows, draft.tokens])
        beam = beam_sample(
            self.draft, context, gamma, self.num_beams, self.warper, generator, self.beam_weights, self.replacement
        )
        return torch.tensor(beam.tokens, device=self.draft.device), beam.log_q

    def chain_proposal(self, tokens, probs):
        return torch.log(probs[torch.arange(tokens.shape[0], device=probs.device), tokens])

    def verify(self, logits, tokens, log_q, generator):
        if self.warper.greedy:
            n, y = greedy_verify(logits.argmax(-1), tokens)
            return n, y
        rows = self.warper.sparse_rows(logits)
        if rows is not None:
            # top-k rows: verify on their k entries (the same rule, no full-vocabulary rows)
            acc, index, weights = mtad_verify_sparse(*rows, log_q, tokens, self.tau)
            return acc, sample_sparse(index, weights, generator)
        P = self.warper(logits)
        acc, row = mtad_verify(P, log_q, tokens, self.tau)
        return acc, sample(row, generator)
