"""spd: speculative decoding with token verification (Leviathan et al. 2023; Chen et al. 2023).

A chain of gamma draft tokens; accept x_i with probability min(1, p/q) until the first
rejection, then draw from norm(relu(p - q)), or the bonus row when all pass. Lossless.
The chain comes from the ``drafter`` (a draft model, an EAGLE head, or n-gram lookup).
``lenience`` < 1 relaxes acceptance to min(1, p / (l q)) (lossy, Leviathan App. A.5).
"""

from __future__ import annotations

from .base import Param, in_half_open
from .exact import token_cases
from .rules import ChainRule
from .speculative import CHAIN_GAMMA, DraftVerifyDecoder
from .verification import greedy_verify, lenient_greedy_verify, token_verify, token_verify_sparse


def token_greedy(logits, x, *, lenience: float = 1.0):
    """Temperature 0: the argmax prefix, or with lenience l < 1 every draft with p(x) >= l max p (unwarped)."""
    if lenience < 1.0:
        return lenient_greedy_verify(logits.softmax(-1), x, lenience)
    return greedy_verify(logits.argmax(-1), x)


TOKEN_RULE = ChainRule(
    token_verify,
    params=("lenience",),
    sparse=token_verify_sparse,
    greedy=token_greedy,
    exact=token_cases,
    point_mass=True,
)


class SpeculativeDecoder(DraftVerifyDecoder):
    name = "spd"
    verification_method = "longest_prefix"
    prefix_drafts = True
    lossless = True
    rule = TOKEN_RULE
    params = {
        **DraftVerifyDecoder.params,
        "gamma": CHAIN_GAMMA,
        "lenience": Param(1.0, in_half_open(0.0, 1.0), "1 = exact; < 1 accepts more (lossy)"),
    }
