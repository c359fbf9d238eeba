"""mtad: multi-token approximate decoding (Qin et al., ICLR 2025).

The draft proposes gamma tokens by beam sampling (W beams, best beam by weight); the target
accepts the longest prefix whose joint-likelihood ratio min(1, p(x_1..j) / q(x_1..j)) exceeds
tau, then draws the next token from its own row (no residual). Lossy by design: tau = 1 is plain
sampling, tau = 0 accepts every draft token. Temperature 0: beam-search drafts, greedy acceptance. With
``drafter: eagle | ngram`` the draft is the drafter's chain (one beam: ``num_beams`` applies to the draft
model's beam sampling only) and log q is the chain's per-token warped log-probabilities (0 for n-gram's
one-hot rows).
"""

from __future__ import annotations

import torch

from .base import Param, boolean, in_closed, int_at_least, one_of
from .beam_sampling import BEAM_WEIGHTS
from .exact import mtad_cases
from .rules import ChainRule
from .speculative import DraftVerifyDecoder
from .verification import mtad_verify, mtad_verify_sparse


def mtad_rule(P, log_q, x, u, *, tau: float):
    """MTAD's rule over the chain's draft log-probabilities ``log_q [g]`` (no coins: a threshold on the joint ratio)."""
    return mtad_verify(P, log_q, x, tau)


def mtad_rule_sparse(P_index, P_probs, log_q, x, u, *, tau: float):
    """``mtad_rule`` on the top-k entries of P (the same rule, no full-vocabulary rows)."""
    return mtad_verify_sparse(P_index, P_probs, log_q, x, tau)


MTAD_RULE = ChainRule(mtad_rule, params=("tau",), coins=False, sparse=mtad_rule_sparse, draft="log_q", exact=mtad_cases)


class MTADDecoder(DraftVerifyDecoder):
    name = "mtad"
    verification_method = "mtad_joint"
    prefix_drafts = False
    rule = MTAD_RULE
    params = {
        **DraftVerifyDecoder.params,
        "gamma": Param(
            2,
            int_at_least(1),
            "draft tokens per iteration (2: measured on the default pair, benchmarks/notes-cpu-bench-history.md)",
        ),
        "num_beams": Param(4, int_at_least(1), "beams W of the draft's beam sampling"),
        "tau": Param(0.5, in_closed(0.0, 1.0), "acceptance threshold on the joint likelihood ratio"),
        "beam_weights": Param("paper", one_of(*BEAM_WEIGHTS), "paper eq. 2, or the released code's softmax"),
        "replacement": Param(False, boolean, "sample (beam, token) pairs with replacement"),
    }

    def propose_chains(self, asks):
        """With a drafter that declares ``beams`` (the draft model): each ask's best beam of beam sampling
        (``Drafter.propose_beams``: every request's beams in one draft forward per depth) and its log q along the
        beam, cut by ``draft_stop: confidence`` on the beam's own q(x_i); another drafter's chains as every chain
        method proposes them (log q: the chain's rows at its tokens, 0 for n-gram's one-hot rows)."""
        drafter = asks[0].drafter
        if not drafter.beams:  # a drafter that drafts no beams (the drafter contract's ``beams``)
            return super().propose_chains(asks)
        a = self.args
        beams = drafter.propose_beams(asks, self.warper, a.num_beams, a.beam_weights, a.replacement)
        out = []
        for beam in beams:
            tokens = torch.tensor(beam.tokens, device=self.draft_model.device)
            k = self.length_policy.cut(beam.log_q.exp())
            out.append((tokens[:k], beam.log_q[:k]))
        return out
