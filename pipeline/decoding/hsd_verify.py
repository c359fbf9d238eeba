"""Hierarchical Speculative Decoding's verification rule (Zhou et al., ICLR 2026) as pure functions over
probability tensors, in the shapes of ``verification.py``: ``P [g+1, V]`` warped target rows (row g is the
bonus row), ``Q [g, V]`` warped draft rows, ``x [g]`` draft tokens drawn from Q.

HSD verifies the whole draft with the joint ratio ``P(x_{1:g}) / Q(x_{1:g})`` and, when the draft is
rejected, steps back through a hierarchy of residuals: at position k the joint residual over
``x_{<k} v`` is ``[P~(x_{<k}) p_k(v) - Q(x_{<k}) q_k(v)]_+`` with the capped prefix mass
``P~(x_{<k}) = P(x_{<k}) / max(1, max_{j<=k} P(x_{<j}) / Q(x_{<j}))``; position k is kept (not stepped
back from) with probability ``sum p_plus / max(sum p_plus, sum p_minus)``, the last kept position is where
the rejected draft stops, and the next token is drawn from that position's normalised residual
(docs/ALGORITHMS.md section 18). Divided by ``Q(x_{<k})`` these are exactly block verification's
``pi_k``, ``R_k`` and ``h_k``, so the step-back walk draws block verification's stopping length.

Two forms differ only in the probability of accepting the whole draft:

- ``capped=True`` (method ``hsd``): ``pi_g``, the capped ratio the hierarchy uses everywhere else.
  Lossless, and draft by draft the same law as ``block_verify``.
- ``capped=False`` (method ``hsd_ref``): ``min(1, P(x_{1:g}) / Q(x_{1:g}))``, the uncapped joint ratio, as
  the authors' code accepts it (``transformers/generation/utils.py`` ``_speculative_sampling(backward=True)``,
  ``simulation.py``, ``algorithm_clean.py``). Not lossless for g >= 2 (``pipeline.decoding.exact`` computes
  by how much).

No host synchronisation happens inside these functions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .verification import _normalize, draft_at, minus_point_mass
from .warping import sample


def hsd_weights(
    P: torch.Tensor, Q: torch.Tensor | None, x: torch.Tensor, capped: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """HSD's keep probabilities ``h [g]`` (position k = 0..g-1), the whole-draft acceptance probability (0-d)
    and the residual rows ``R [g, V]`` (unnormalised, divided by ``Q(x_{<k})``).

    In log space: ``S_k = log P(x_{<k}) / Q(x_{<k})``, the cap is ``max(0, max_{j<=k} S_j)`` (the reference's
    ``cummax(max(ratio, 1))``), ``pi_k = exp(S_k - cap_k)``. Position 0 has ``pi_0 = 1``: its keep probability
    is 1 unless target and draft rows agree there (then there is nothing to resample and it is 1 too).
    """
    g = x.shape[0]
    ar = torch.arange(g, device=P.device)
    S = F.pad(torch.cumsum(torch.log(P[ar, x]) - torch.log(draft_at(Q, x, P)), 0), (1, 0))  # [g+1]
    pi = torch.exp(S - torch.cummax(S, 0).values)  # S_0 = 0: the cap is never below 1
    scaled = pi[:g, None] * P[:g]
    # p_plus / Q(x_{<k}); a deterministic proposal (Q None): Q[k] is the point mass at x_k
    R = (minus_point_mass(scaled, x) if Q is None else scaled - Q).clamp_min(0.0)
    Z = R.sum(-1)
    den = Z + (1.0 - pi[:g])  # max(sum p_plus, sum p_minus) / Q(x_{<k}): sum(q - pi p) = 1 - pi >= 0
    h = torch.where(den > 0, Z / den.clamp_min(torch.finfo(den.dtype).tiny), torch.ones_like(Z))
    full = pi[g] if capped else torch.exp(S[g]).clamp(max=1.0)
    return h, full, R


def hsd_verify(
    P: torch.Tensor,
    Q: torch.Tensor | None,
    x: torch.Tensor,
    u_full: torch.Tensor,
    u_keep: torch.Tensor,
    capped: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One HSD verification with explicit uniforms: the whole draft is accepted when ``u_full <= full``;
    otherwise position k is kept when ``u_keep[k] < h_k`` (position 0 always), and the draft stops at the
    last kept position n. Returns ``(n, dist)``: emit ``x[:n]`` then a token from ``dist`` (``norm(R[n])``,
    or the bonus row ``P[g]`` when the whole draft passed).

    The reference draws ``step_back = u < 1 - h`` (the same law) and stops at 0 when every position steps back.
    """
    g = x.shape[0]
    h, full, R = hsd_weights(P, Q, x, capped)
    positions = torch.arange(g, device=P.device)
    kept = (u_keep < h) | (positions == 0)
    stop = (kept.long() * positions).max()
    n = torch.where(u_full <= full, torch.full_like(stop, g), stop)
    rows = torch.cat([R, P[g:]])  # row g: the bonus row
    return n, _normalize(rows[n], P[n])


def hsd_dense(
    P: torch.Tensor, Q: torch.Tensor | None, x: torch.Tensor, u: torch.Tensor, capped: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """HSD as a chain rule of the engine's loop (``rules.ChainRule``): g uniforms ``u`` suffice, since position 0 is
    always kept and its keep coin is never read: ``u[0]`` decides the whole draft, ``u[1:]`` the keep coins of
    positions 1..g-1 (independent uniforms, so the same law as ``hsd_verify`` with g + 1 of them).
    Returns ``(n, dist)``."""
    return hsd_verify(P, Q, x, u[0], u, capped)


def hsd_reference_dense(
    P: torch.Tensor, Q: torch.Tensor | None, x: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The published form (uncapped whole-draft acceptance) as a chain rule; see ``hsd_dense``."""
    return hsd_dense(P, Q, x, u, capped=False)


def _rule(
    P: torch.Tensor, Q: torch.Tensor, x: torch.Tensor, generator, capped: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    u = torch.rand(x.shape[0] + 1, generator=generator, device=P.device, dtype=P.dtype)
    n, dist = hsd_verify(P, Q, x, u[0], u[1:], capped)
    return n, sample(dist, generator)


def hsd_rule(P: torch.Tensor, Q: torch.Tensor, x: torch.Tensor, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless HSD (the cap applied to the whole draft too): ``(accepted drafts, next token)``, 0-d tensors."""
    return _rule(P, Q, x, generator, capped=True)


def hsd_reference_rule(
    P: torch.Tensor, Q: torch.Tensor, x: torch.Tensor, generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """HSD as the authors' code runs it (the whole draft accepted with the uncapped joint ratio; lossy for
    g >= 2): ``(accepted drafts, next token)``, 0-d tensors."""
    return _rule(P, Q, x, generator, capped=False)
