"""Verification rules as pure functions over probability tensors (fp32), testable without models.

Shapes (one draft chain of length g over a vocabulary of V):
``P [g+1, V]`` warped target rows (row g is the bonus row), ``Q [g, V]`` warped draft rows,
``x [g]`` draft tokens (``x[i] ~ Q[i]``). Each rule returns how many draft tokens are accepted (a
0-d tensor, read once by the caller) and the distribution the next token is drawn from.
No host synchronisation happens inside these functions.

A deterministic proposal (prompt lookup: nothing is drawn) is ``Q = None``: row i of Q is the point mass at
``x[i]``, so ``q(x_i) = 1`` and ``Q[i]`` is 0 elsewhere. The rules here take it as such without building a
vocabulary-sized one-hot (``draft_at``, ``minus_point_mass``): the same numbers as the dense one-hot rows, bit
for bit (``tests/test_verification_point_mass.py``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .cpu_kernels import kernels


def _normalize(row: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``row / row.sum()``, or ``fallback`` when the residual has no mass (reachable only by float error)."""
    total = row.sum(-1, keepdim=True)
    return torch.where(total > 0, row / total.clamp_min(torch.finfo(row.dtype).tiny), fallback)


def draft_at(Q: torch.Tensor | None, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``q(x_i)`` of each draft ``[g]``: Q's rows at the drafts, or 1 for a deterministic proposal (Q None), in
    ``like``'s dtype and device."""
    if Q is None:
        return torch.ones(x.shape[0], dtype=like.dtype, device=like.device)
    return Q[torch.arange(x.shape[0], device=Q.device), x]


def minus_point_mass(rows: torch.Tensor, x: torch.Tensor, mass: torch.Tensor | float = 1.0) -> torch.Tensor:
    """``rows - mass * onehot(x)`` row by row (``rows [..., V]``, ``x`` of ``rows``' leading shape; a new tensor): a
    deterministic proposal's Q subtracted without building it."""
    src = torch.as_tensor(mass, dtype=rows.dtype, device=rows.device).expand(x.shape).unsqueeze(-1)
    return rows.scatter_add(-1, x.unsqueeze(-1), -src)


def token_acceptance(P: torch.Tensor, Q: torch.Tensor | None, x: torch.Tensor, lenience: float = 1.0) -> torch.Tensor:
    """Per-position acceptance probabilities ``min(1, p(x_i) / (l * q(x_i)))`` of token verification."""
    g = x.shape[0]
    ar = torch.arange(g, device=P.device)
    px, qx = P[ar, x], draft_at(Q, x, P)
    return torch.clamp(px / (lenience * qx), max=1.0)


def token_verify(
    P: torch.Tensor, Q: torch.Tensor | None, x: torch.Tensor, u: torch.Tensor, lenience: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token verification (Leviathan et al.; Chen et al.): accept x_i while ``u_i * l * q(x_i) <= p(x_i)``.

    Returns ``(n, dist)``: n accepted drafts; the next token is drawn from ``dist`` =
    ``norm(relu(P[n] - Q[n]))`` after a rejection, or the bonus row ``P[g]`` when all passed.
    With ``lenience < 1`` the rule is lossy (App. A.5); the residual stays ``relu(p - q)``.
    """
    g = x.shape[0]
    ar = torch.arange(g, device=P.device)
    px, qx = P[ar, x], draft_at(Q, x, P)
    accepted = u * (lenience * qx) <= px
    n = accepted.long().cumprod(0).sum()
    p_n = P[n]
    last = n.clamp(max=g - 1)
    if Q is None:  # the point mass at x_n (none after the last draft: the bonus row P[g])
        return n, _normalize(minus_point_mass(p_n, x[last], (n < g).to(p_n.dtype)).clamp_min(0.0), p_n)
    q_n = Q[last] * (n < g)  # no draft row after the last draft: the bonus row P[g]
    return n, _normalize((p_n - q_n).clamp_min(0.0), p_n)


def _chain_kernels(*tensors: torch.Tensor | None):
    """The engine's C++ kernels for a sparse chain verification of these float32 CPU tensors, else None (also
    for a deterministic proposal, Q None: the kernels read dense draft rows)."""
    if all(t is not None and t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors):
        return kernels()
    return None


def _sparse_at(P_index: torch.Tensor, P_probs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``P[i, x_i]`` for the first ``len(x)`` rows of a P given by its non-zero entries (0 off the support)."""
    g = x.shape[0]
    return (P_probs[:g] * (P_index[:g] == x[:, None])).sum(-1)


def token_verify_sparse(
    P_index: torch.Tensor,
    P_probs: torch.Tensor,
    Q: torch.Tensor | None,
    x: torch.Tensor,
    u: torch.Tensor,
    lenience: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``token_verify`` with the target rows given by their non-zero entries (top-k warping):
    ``P_index``, ``P_probs [g+1, k]`` (row i of P is ``P_probs[i]`` at ``P_index[i]``, 0 elsewhere).

    Returns ``(n, index, weights)``: the next token is drawn from ``weights`` (unnormalised) over ``index``
    [k], the support of the residual ``relu(P[n] - Q[n])`` (it lies inside P[n]'s) or of the bonus row.
    The same rule and the same laws as ``token_verify``, without a full-vocabulary temporary (one C++ call
    on CPUs with the engine's kernels).
    """
    ext = _chain_kernels(P_probs, Q, u)
    if ext is not None:
        return tuple(ext.token_verify_sparse(P_index, P_probs, Q, x, u, float(lenience)))
    g = x.shape[0]
    px = _sparse_at(P_index, P_probs, x)
    qx = draft_at(Q, x, P_probs)
    accepted = u * (lenience * qx) <= px
    n = accepted.long().cumprod(0).sum()
    index, p_n = P_index[n], P_probs[n]
    last = n.clamp(max=g - 1)
    q_row = (index == x[last]).to(p_n.dtype) if Q is None else Q[last].gather(-1, index)  # Q[n] on P[n]'s support
    q_n = q_row * (n < g)
    residual = (p_n - q_n).clamp_min(0.0)
    return n, index, torch.where(residual.sum() > 0, residual, p_n)


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


def block_weights(P: torch.Tensor, Q: torch.Tensor | None, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's per-length pass probabilities ``h [g]`` (for lengths 1..g) and residual rows.

    Sun et al. (ICLR 2025), Algorithm 2, in log space (docs/ALGORITHMS.md section 3.2):
    ``pi_i = min(1, pi_{i-1} p(x_i)/q(x_i))``, ``R_i = relu(pi_i P[i] - Q[i])`` (Q[g] := 0),
    ``h_i = Z_i / (Z_i + 1 - pi_i)``; returns ``(h, R)`` with ``R [g+1, V]`` unnormalized.
    """
    g = x.shape[0]
    ar = torch.arange(g, device=P.device)
    log_ratio = torch.log(P[ar, x]) - torch.log(draft_at(Q, x, P))
    S = F.pad(torch.cumsum(log_ratio, 0), (1, 0))
    log_pi = S - torch.cummax(S, 0).values
    pi = log_pi.exp()
    if Q is None:  # Q[i]: the point mass at x_i (i < g), Q[g] := 0
        scaled = pi[:, None] * P
        R = torch.cat([minus_point_mass(scaled[:g], x), scaled[g:]]).clamp_min(0.0)
    else:
        R = (pi[:, None] * P - F.pad(Q, (0, 0, 0, 1))).clamp_min(0.0)
    Z = R.sum(-1)
    den = Z + (1.0 - pi)  # parenthesized: (Z + 1) - pi loses Z when pi ~ 1
    h = torch.where(den > 0, Z / den.clamp_min(torch.finfo(den.dtype).tiny), torch.ones_like(Z))
    return h[1:], R


def block_verify(
    P: torch.Tensor, Q: torch.Tensor | None, x: torch.Tensor, eta: torch.Tensor
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


def block_verify_sparse(
    P_index: torch.Tensor, P_probs: torch.Tensor, Q: torch.Tensor | None, x: torch.Tensor, eta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``block_verify`` with the target rows given by their non-zero entries (``P_index``, ``P_probs
    [g+1, k]``, as ``token_verify_sparse``). The residuals ``relu(pi_i P[i] - Q[i])`` vanish outside P[i]'s
    support, so they are computed there. Returns ``(tau, index, weights)``: the next token is drawn from
    ``weights`` (unnormalised) over ``index`` [k]. The same rule as ``block_verify`` (one C++ call on CPUs
    with the engine's kernels)."""
    ext = _chain_kernels(P_probs, Q, eta)
    if ext is not None:
        return tuple(ext.block_verify_sparse(P_index, P_probs, Q, x, eta))
    g = x.shape[0]
    px = _sparse_at(P_index, P_probs, x)
    qx = draft_at(Q, x, P_probs)
    S = F.pad(torch.cumsum(torch.log(px) - torch.log(qx), 0), (1, 0))
    log_pi = S - torch.cummax(S, 0).values
    pi = log_pi.exp()
    q_rows = (P_index[:g] == x[:, None]).to(P_probs.dtype) if Q is None else Q.gather(-1, P_index[:g])
    q_on_p = F.pad(q_rows, (0, 0, 0, 1))  # Q[g] := 0
    R = (pi[:, None] * P_probs - q_on_p).clamp_min(0.0)
    Z = R.sum(-1)
    den = Z + (1.0 - pi)
    h = torch.where(den > 0, Z / den.clamp_min(torch.finfo(den.dtype).tiny), torch.ones_like(Z))[1:]
    tau = ((eta <= h).long() * torch.arange(1, g + 1, device=P_probs.device)).max()
    weights = R[tau]
    return tau, P_index[tau], torch.where(weights.sum() > 0, weights, P_probs[tau])


def block_expected_accepted(h: torch.Tensor) -> torch.Tensor:
    """Exact E[tau] given the pass probabilities ``h`` of one draft (for tests and analysis)."""
    g = h.shape[0]
    total = h.new_zeros(())
    for t in range(1, g + 1):
        total = total + t * h[t - 1] * torch.prod(1 - h[t:])
    return total


def mtad_verify(P: torch.Tensor, log_q: torch.Tensor, x: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
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


def mtad_verify_sparse(
    P_index: torch.Tensor, P_probs: torch.Tensor, log_q: torch.Tensor, x: torch.Tensor, tau: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``mtad_verify`` with the target rows given by their non-zero entries (``P_index``, ``P_probs
    [g+1, k]``): ``(acc, index, weights)``, the next token drawn from row ``acc``'s entries."""
    g = x.shape[0]
    if tau <= 0:
        acc = torch.tensor(g, device=P_probs.device)
    else:
        px = _sparse_at(P_index, P_probs, x)
        ok = (torch.log(px).cumsum(0) - log_q.cumsum(0)).clamp(max=0.0) > math.log(tau)
        acc = (ok.long() * torch.arange(1, g + 1, device=P_probs.device)).max()
    return acc, P_index[acc], P_probs[acc]


def bild_verify(logits: torch.Tensor, x: torch.Tensor, rollback: float) -> tuple[torch.Tensor, torch.Tensor]:
    """BiLD's rollback policy: the longest prefix whose tokens all have cross-entropy
    ``-log p(x_i) <= rollback`` under the large model's RAW logits ``[g+1, V]`` (not warped).

    Returns ``(n, logits[n])``: the large model's row at the first rolled-back token (or the bonus
    row), from which the caller draws the next token. Lossy by design.
    """
    g = x.shape[0]
    ce = -torch.log_softmax(logits[:g], -1).gather(-1, x.reshape(-1, 1)).squeeze(-1)
    n = (~(ce > rollback)).long().cumprod(0).sum()
    return n, logits[n]


# --------------------------------------------------------------------------------------------------
# Multi-candidate rules at one position / tree node (SpecInfer, MCSS, SpecTr, one-hot trees, typical)
#
# ``p [V]`` is the warped target row at the node, ``q [V]`` the warped draft row its candidates
# were drawn from, ``cands [m]`` the candidates in the order they were drawn. The *acceptance*
# functions return the conditional probability ``a [m]`` that candidate j is accepted given that
# candidates 0..j-1 were rejected, and the distribution the next token is drawn from when all m are
# rejected; the *verify* functions draw with uniforms ``u [m]`` and return ``(j, residual)`` with
# j = index of the first accepted candidate (m when none). No host synchronisation inside.
# --------------------------------------------------------------------------------------------------


def _first_true(flags: torch.Tensor) -> torch.Tensor:
    """Index of the first True in ``flags [m]`` (m when none), as a 0-d tensor."""
    m = flags.shape[0]
    idx = torch.arange(m, device=flags.device)
    return torch.where(flags, idx, torch.full_like(idx, m)).min() if m else torch.tensor(0)


def multi_candidate_acceptance(
    p: torch.Tensor, q: torch.Tensor, cands: torch.Tensor, replacement: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-step speculative sampling at one node (SpecInfer: ``replacement=True``; MCSS: ``False``).

    Candidate j is accepted with probability ``min(1, p_j(c_j) / q_j(c_j))`` where p_j is the residual
    after j rejections (``p_{j+1} = norm(relu(p_j - q_j))``, w.r.t. the current q) and, without
    replacement, ``q_{j+1}`` is q_j with c_j removed and renormalised (docs/ALGORITHMS.md 8.1, 9).
    Returns ``(a [m], p_m)``.
    """
    res, qq = p, q
    acc = []
    for j in range(cands.shape[0]):
        c = cands[j]
        qc = qq[c]
        acc.append(
            torch.where(
                qc > 0, torch.clamp(res[c] / qc.clamp_min(torch.finfo(qc.dtype).tiny), max=1.0), torch.ones_like(qc)
            )
        )
        res = _normalize((res - qq).clamp_min(0.0), res)
        if not replacement:
            qq = qq.clone()
            qq[c] = 0.0
            qq = _normalize(qq, qq)
    a = torch.stack(acc) if acc else p.new_zeros(0)
    return a, res


def multi_candidate_verify(
    p: torch.Tensor, q: torch.Tensor, cands: torch.Tensor, u: torch.Tensor, replacement: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw MSS (``replacement``) / MCSS (without) at one node: ``(j, residual)``, j = m when all rejected."""
    a, res = multi_candidate_acceptance(p, q, cands, replacement)
    return _first_true(u < a), res


def one_hot_acceptance(p: torch.Tensor, cands: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic candidates (e.g. Medusa's top-k): accept c_j with probability ``p_j(c_j)``, where
    p_{j+1} is p_j with c_j zeroed and renormalised (the one-hot recursive rule, docs/ALGORITHMS.md A.3).
    Lossless for any fixed candidate list. Returns ``(a [m], p_m)``.
    """
    res = p
    acc = []
    for j in range(cands.shape[0]):
        c = cands[j]
        acc.append(res[c])
        nxt = res.clone()
        nxt[c] = 0.0
        res = _normalize(nxt, res)
    a = torch.stack(acc) if acc else p.new_zeros(0)
    return a, res


def kseq_rho(p: torch.Tensor, q: torch.Tensor, k: int, iters: int = 60) -> torch.Tensor:
    """SpecTr's rho*: the smallest rho in [1, k] with ``rho beta(rho) >= 1 - (1 - beta(rho))^k``,
    ``beta(rho) = sum_v min(q(v), p(v) / rho)`` (bisection; the left side minus the right increases)."""
    one = p.new_tensor(1.0)
    if k <= 1:
        return one

    def f(r: torch.Tensor) -> torch.Tensor:
        beta = torch.minimum(q, p / r).sum()
        return r * beta - (1.0 - (1.0 - beta) ** k)

    lo, hi = one, p.new_tensor(float(k))
    for _ in range(iters):
        mid = (lo + hi) / 2
        good = f(mid) >= 0
        hi = torch.where(good, mid, hi)
        lo = torch.where(good, lo, mid)
    return torch.where(f(one) >= 0, one, hi)


def kseq_acceptance(p: torch.Tensor, q: torch.Tensor, cands: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K-SEQ (SpecTr) with k = m i.i.d. candidates from q: candidate j is accepted with probability
    ``min(1, p(c_j) / (rho* q(c_j)))``; when all are rejected the next token comes from
    ``norm(relu(p - min(q, p/rho*) (1 - (1 - beta)^k) / beta))`` (docs/ALGORITHMS.md 7.1). ``(a [m], residual)``.
    """
    k = cands.shape[0]
    rho = kseq_rho(p, q, k)
    accept_mass = torch.minimum(q, p / rho)
    beta = accept_mass.sum()
    qc = q[cands]
    a = torch.where(
        qc > 0, torch.clamp(p[cands] / (rho * qc.clamp_min(torch.finfo(qc.dtype).tiny)), max=1.0), torch.ones_like(qc)
    )
    p_any = 1.0 - (1.0 - beta) ** k
    scale = torch.where(beta > 0, p_any / beta.clamp_min(torch.finfo(beta.dtype).tiny), torch.zeros_like(beta))
    residual = _normalize((p - accept_mass * scale).clamp_min(0.0), p)
    return a, residual


def kseq_verify(
    p: torch.Tensor, q: torch.Tensor, cands: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw K-SEQ at one position: ``(j, residual)``, j = m when every candidate is rejected."""
    a, res = kseq_acceptance(p, q, cands)
    return _first_true(u < a), res


def typical_acceptance(P: torch.Tensor, x: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:
    """Typical acceptance (Medusa-2): ``p(x_i) > min(epsilon, delta * exp(-H(p_i)))`` per row, bool ``[g]``.

    ``P [g, V]`` are the target rows the candidates ``x [g]`` are scored under. Medusa applies it to
    ``softmax(logits / T)``; the engine passes the warped rows, so with top-k 0 and top-p 1 it is
    Medusa's rule, and at temperature 0 (one-hot rows) it accepts exactly the argmax.
    """
    entropy = -torch.special.xlogy(P, P).sum(-1)
    threshold = torch.clamp(delta * torch.exp(-entropy), max=epsilon)
    return P.gather(-1, x.reshape(-1, 1)).squeeze(-1) > threshold


def typical_verify(P: torch.Tensor, x: torch.Tensor, epsilon: float, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Typical acceptance over a chain: ``(n, P[n])``, n = longest passing prefix (``P [g+1, V]``).

    Lossy: the next token comes from the target row after the prefix, not from a residual.
    """
    g = x.shape[0]
    ok = typical_acceptance(P[:g], x, epsilon, delta)
    n = ok.long().cumprod(0).sum()
    return n, P[n]
