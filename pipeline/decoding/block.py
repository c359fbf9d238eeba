"""block: block verification (Sun et al., ICLR 2025), over the same chain draft as ``spd`` (any ``drafter``).

Every prefix length i gets its own coin against h_i; the longest passing length is kept (no early
stop), then the next token comes from the block residual. Lossless, and never accepts fewer tokens
than token verification. Fresh coins every iteration (docs/ALGORITHMS.md 3.3). Temperature 0: block
verification adds nothing for one-hot targets (the argmax prefix).
"""

from __future__ import annotations

from .exact import block_cases
from .rules import ChainRule
from .speculative import CHAIN_GAMMA, DraftVerifyDecoder
from .verification import block_verify, block_verify_sparse

BLOCK_RULE = ChainRule(block_verify, sparse=block_verify_sparse, exact=block_cases, point_mass=True)


class BlockVerificationDecoder(DraftVerifyDecoder):
    name = "block"
    verification_method = "block"
    prefix_drafts = True
    lossless = True
    rule = BLOCK_RULE
    params = {**DraftVerifyDecoder.params, "gamma": CHAIN_GAMMA}  # the same draft as spd
