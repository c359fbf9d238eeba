"""Verification rules as pure functions over probability tensors (fp32), testable without models.

Shapes (one draft chain of length g over a vocabulary of V):
``P [g+1, V]`` warped target rows (row g is the bonus row), ``Q [g, V]`` warped draft rows,
``x [g]`` draft tokens (``x[i] ~ Q[i]``). Each rule returns how many draft tokens are accepted (a
0-d tensor, read once by the caller) and the distribution the next token is drawn from.
No host synchronisation happens inside these functions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _normalize(row: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``row / row.sum()``, or ``fallback`` when the residual has no mass (reachable only by float error)."""
    total = row.sum(-1, keepdim=True)
    return torch.where(total > 0, row / total.clamp_min(torch.finfo(row.dtype).tiny), fallback)


def token_acceptance(P: torch.Tensor, Q: torch.Tensor, x: torch.Tensor, lenience: float = 1.0) -> torch.Tensor:
    """Per-position acceptance probabilities ``min(1, p(x_i) / (l * q(x_i)))`` of token verification."""
    g = x.shape[0]
    ar = torch.arange(g, device=P.device)
    px, qx = P[ar, x], Q[ar, x]
    return torch.clamp(px / (lenience * qx), max=1.0)


def token_verify(
    P: torch.Tensor, Q: torch.Tensor, x: torch.Tensor, u: torch.Tensor, lenience: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token verification (Leviathan et al.; Chen et al.): accept x_i while ``u_i * l * q(x_i) <= p(x_i)``.

    Returns ``(n, dist)``: n accepted drafts; the next token is drawn from ``dist`` =
    ``norm(relu(P[n] - Q[n]))`` after a rejection, or the bonus row ``P[g]`` when all passed.
    With ``lenience < 1`` the rule is lossy (App. A.5); the residual stays ``relu(p - q)``.
    """
    g = x.shape[0]
    ar = torch.arange(g, device=P.device)
    px, qx = P[ar, x], Q[ar, x]
    accepted = u * (lenience * qx) <= px
    n = accepted.long().cumprod(0).sum()
    residual = (P - F.pad(Q, (0, 0, 0, 1))).clamp_min(0.0)  # row g == P[g]
    return n, _normalize(residual[n], P[n])


def greedy_verify(target_argmax: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature 0: accept the longest prefix equal to the target's argmax; next token = argmax of row n.

    ``target_argmax [g+1]``; returns ``(n, next_token)``.
    """
    g = x.shape[0]
    n = (x == target_argmax[:g]).long().cumprod(0).sum()
    return n, target_argmax[n]


def lenient_greedy_verify(
    target_probs: torch.Tensor, x: torch.Tensor, lenience: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature 0 with lenience l: accept x_i while ``p(x_i) >= l * max p`` (unwarped p); then argmax."""
    g = x.shape[0]
    ar = torch.arange(g, device=target_probs.device)
    top, arg = target_probs.max(-1)
    ok = target_probs[ar, x] >= lenience * top[:g]
    n = ok.long().cumprod(0).sum()
    return n, arg[n]


def block_weights(P: torch.Tensor, Q: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's per-length pass probabilities ``h [g]`` (for lengths 1..g) and residual rows.

    Sun et al. (ICLR 2025), Algorithm 2, in log space (ALGORITHMS.md section 3.2):
    ``pi_i = min(1, pi_{i-1} p(x_i)/q(x_i))``, ``R_i = relu(pi_i P[i] - Q[i])`` (Q[g] := 0),
    ``h_i = Z_i / (Z_i + 1 - pi_i)``; returns ``(h, R)`` with ``R [g+1, V]`` unnormalized.
    """
    g = x.shape[0]
    ar = torch.arange(g, device=P.device)
    log_ratio = torch.log(P[ar, x]) - torch.log(Q[ar, x])
    S = F.pad(torch.cumsum(log_ratio, 0), (1, 0))
    log_pi = S - torch.cummax(S, 0).values
    pi = log_pi.exp()
    R = (pi[:, None] * P - F.pad(Q, (0, 0, 0, 1))).clamp_min(0.0)
    Z = R.sum(-1)
    den = Z + (1.0 - pi)  # parenthesized: (Z + 1) - pi loses Z when pi ~ 1
    h = torch.where(den > 0, Z / den.clamp_min(torch.finfo(den.dtype).tiny), torch.ones_like(Z))
    return h[1:], R


def block_verify(
    P: torch.Tensor, Q: torch.Tensor, x: torch.Tensor, eta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification: tau = the longest length i with ``eta_i <= h_i`` (no early stop).

    Returns ``(tau, dist)``: emit ``x[:tau]`` then a token from ``dist`` = ``norm(R[tau])``
    (the bonus row ``P[g]`` when tau = g). Needs fresh ``eta`` every iteration.
    """
    g = x.shape[0]
    h, R = block_weights(P, Q, x)
    passed = eta <= h
    tau = (passed.long() * torch.arange(1, g + 1, device=P.device)).max()
    return tau, _normalize(R[tau], P[tau])


def block_expected_accepted(h: torch.Tensor) -> torch.Tensor:
    """Exact E[tau] given the pass probabilities ``h`` of one draft (for tests and analysis)."""
    g = h.shape[0]
    total = h.new_zeros(())
    for t in range(1, g + 1):
        total = total + t * h[t - 1] * torch.prod(1 - h[t:])
    return total


def mtad_verify(
    P: torch.Tensor, log_q: torch.Tensor, x: torch.Tensor, tau: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """MTAD: the longest prefix j with ``min(1, p(x_{1:j}) / q(x_{1:j})) > tau`` (joint likelihoods).

    ``log_q [g]`` are the draft's per-token warped log-probabilities along the chosen beam.
    Returns ``(acc, P[acc])``: the next token comes from the target row, not a residual.
    ``tau = 0`` accepts every draft token (MJSD); ``tau = 1`` accepts none (plain sampling).
    """
    g = x.shape[0]
    if tau <= 0:
        acc = torch.tensor(g, device=P.device)
        return acc, P[acc]
    ar = torch.arange(g, device=P.device)
    log_ratio = torch.log(P[ar, x]).cumsum(0) - log_q.cumsum(0)
    ok = log_ratio.clamp(max=0.0) > math.log(tau)
    acc = (ok.long() * torch.arange(1, g + 1, device=P.device)).max()
    return acc, P[acc]
