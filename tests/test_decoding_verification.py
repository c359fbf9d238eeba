"""Exact tests of the verification rules on hand-made distributions (no models)."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
import torch

from pipeline.decoding.verification import (
    bild_verify,
    block_expected_accepted,
    block_verify,
    block_weights,
    greedy_verify,
    mtad_verify,
    token_acceptance,
    token_verify,
)
from pipeline.decoding.warping import warp


@pytest.fixture(autouse=True)
def _float64_by_default():
    """Exact checks in float64, without leaking the default dtype into other test modules."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _token_law(P, Q, x):
    """Exact law of (n, next-token distribution) of token verification for one draft x."""
    a = token_acceptance(P, Q, x)
    g = len(x)
    out, reach = [], 1.0
    for i in range(g):
        if reach * (1 - a[i]) > 0:
            u = torch.ones(g)  # any u above a[i] at i, below before: n = i
            u[:i] = 0.0
            n, dist = token_verify(
                P, Q, x, torch.where(torch.arange(g) < i, torch.zeros(g), torch.ones(g) * 1.0 + 1e-9)
            )
            assert int(n) == i
            out.append((reach * (1 - float(a[i])), i, dist))
        reach *= float(a[i])
    if reach > 0:
        n, dist = token_verify(P, Q, x, torch.zeros(g))
        assert int(n) == g
        out.append((reach, g, dist))
    return out


def _block_law(P, Q, x):
    """Exact law of (tau, next-token distribution) of block verification for one draft x."""
    g = len(x)
    h, _ = block_weights(P, Q, x)
    out = []
    for t in range(g + 1):
        pr = (float(h[t - 1]) if t >= 1 else 1.0) * float(torch.prod(1 - h[t:]))
        if pr <= 0:
            continue
        eta = torch.ones(g) * 1.5  # every coin fails ...
        if t >= 1:
            eta[t - 1] = 0.0  # ... but the one at length t passes
        tau, dist = block_verify(P, Q, x, eta)
        assert int(tau) == t
        out.append((pr, t, dist))
    return out


def _two_token_law(law_fn, p, q, gamma):
    """Exact law of the first two emitted tokens with a context-free target p and draft q.

    If the iteration emits one token only, the second comes from p (what the next iteration
    produces when the target is context free); the result must be p x p for a lossless verifier.
    """
    V = len(p)
    P = p.expand(gamma + 1, V).clone()
    Q = q.expand(gamma, V).clone()
    law = torch.zeros(V, V)
    for xs in itertools.product(range(V), repeat=gamma):
        x = torch.tensor(xs)
        px = float(torch.prod(q[x]))
        if px == 0:
            continue
        for pr, n, dist in law_fn(P, Q, x):
            emitted = list(xs[:n])
            for y in range(V):
                w = px * pr * float(dist[y])
                if w == 0:
                    continue
                seq = emitted + [y]
                if len(seq) >= 2:
                    law[seq[0], seq[1]] += w
                else:
                    law[seq[0]] += w * p
    return law


PAIRS = [
    (torch.tensor([1 / 3, 2 / 3], dtype=torch.float64), torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)),
    (torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64), torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)),
    (torch.tensor([0.05, 0.05, 0.9], dtype=torch.float64), torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)),
]


@pytest.mark.parametrize("p,q", PAIRS)
@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("rule", ["token", "block"])
def test_one_iteration_is_lossless(p, q, gamma, rule):
    law = _two_token_law(_token_law if rule == "token" else _block_law, p, q, gamma)
    assert torch.allclose(law, torch.outer(p, p), atol=1e-12)


def test_wrong_residual_is_caught_by_the_exact_law():
    """Negative control: sampling the correction from p instead of relu(p - q) is not lossless."""
    p, q = PAIRS[1]

    def wrong(P, Q, x):
        return [(pr, n, P[n]) for pr, n, _ in _token_law(P, Q, x)]

    law = _two_token_law(wrong, p, q, 2)
    assert not torch.allclose(law, torch.outer(p, p), atol=1e-3)


def test_block_paper_toy_example():
    """Sun et al.: p = (1/3, 2/3), q = (2/3, 1/3), gamma = 2: E[accepted] 10/9 (token), 11/9 (block)."""
    p, q = PAIRS[0]
    P, Q = p.expand(3, 2).clone(), q.expand(2, 2).clone()
    e_token = e_block = 0.0
    for xs in itertools.product(range(2), repeat=2):
        x = torch.tensor(xs)
        w = float(torch.prod(q[x]))
        a = token_acceptance(P, Q, x)
        e_token += w * float(a[0] + a[0] * a[1])
        e_block += w * float(block_expected_accepted(block_weights(P, Q, x)[0]))
    assert e_token == pytest.approx(float(Fraction(10, 9)), abs=1e-12)
    assert e_block == pytest.approx(float(Fraction(11, 9)), abs=1e-12)


def test_block_never_accepts_less_than_token_on_random_rows():
    """Theorem 2 of Sun et al.: in expectation over drafts x ~ q, block verification keeps at least as
    many tokens as token verification (per draft it may keep fewer)."""
    torch.manual_seed(0)  # the Dirichlet rows below come from the global generator
    V, g = 4, 3
    gains = []
    for _ in range(60):
        P = torch.distributions.Dirichlet(torch.full((V,), 0.7)).sample((g + 1,))
        Q = torch.distributions.Dirichlet(torch.full((V,), 0.7)).sample((g,))
        e_token = e_block = 0.0
        for xs in itertools.product(range(V), repeat=g):
            x = torch.tensor(xs)
            w = float(torch.prod(Q[torch.arange(g), x]))
            if w == 0:
                continue
            a = token_acceptance(P, Q, x)
            e_token += w * float(sum(torch.prod(a[: j + 1]) for j in range(g)))
            e_block += w * float(block_expected_accepted(block_weights(P, Q, x)[0]))
        assert e_block >= e_token - 1e-12
        gains.append(e_block - e_token)
    assert max(gains) > 1e-3  # and strictly better somewhere


def test_token_verify_stops_at_first_rejection_and_uses_residual():
    P = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    Q = torch.tensor([[0.25, 0.75, 0.0], [0.6, 0.2, 0.2]])
    x = torch.tensor([0, 0])  # a = [1, 1/3]
    n, dist = token_verify(P, Q, x, torch.tensor([0.99, 0.5]))
    assert int(n) == 1
    assert torch.allclose(dist, torch.tensor([0.0, 0.1, 0.3]) / 0.4)
    n, dist = token_verify(P, Q, x, torch.tensor([0.0, 0.2]))
    assert int(n) == 2 and torch.equal(dist, P[2])


def test_lenience_accepts_more():
    P = torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    Q = torch.tensor([[0.8, 0.2]])
    x = torch.tensor([0])
    assert float(token_acceptance(P, Q, x)[0]) == pytest.approx(0.25)
    assert float(token_acceptance(P, Q, x, lenience=0.5)[0]) == pytest.approx(0.5)


def test_greedy_verify():
    n, y = greedy_verify(torch.tensor([3, 1, 4, 1]), torch.tensor([3, 1, 5]))
    assert (int(n), int(y)) == (2, 4)
    n, y = greedy_verify(torch.tensor([3, 1, 4, 1]), torch.tensor([3, 1, 4]))
    assert (int(n), int(y)) == (3, 1)


def test_mtad_limits_and_longest_prefix():
    P = torch.tensor([[0.5, 0.5], [0.1, 0.9], [0.9, 0.1], [0.5, 0.5]])
    x = torch.tensor([0, 0, 0])
    log_q = torch.log(torch.tensor([0.5, 0.9, 0.9]))
    # joint ratios: 1.0, 0.111, 0.111: only the first prefix passes tau = 0.5
    acc, row = mtad_verify(P, log_q, x, 0.5)
    assert int(acc) == 1 and torch.equal(row, P[1])
    # non-monotone: the longest passing prefix wins even after a failing one
    P2 = P.clone()
    P2[1] = torch.tensor([0.1, 0.9])
    P2[2] = torch.tensor([0.9, 0.1])
    acc, _ = mtad_verify(P2, torch.log(torch.tensor([0.5, 0.9, 0.1])), x, 0.5)  # ratios 1, 0.111, 1.0
    assert int(acc) == 3
    acc, row = mtad_verify(P, log_q, x, 1.0)
    assert int(acc) == 0 and torch.equal(row, P[0])
    acc, row = mtad_verify(P, log_q, x, 0.0)
    assert int(acc) == 3 and torch.equal(row, P[3])


def test_bild_rolls_back_at_the_first_token_the_large_model_finds_unlikely():
    """Cross-entropy on the raw logits: -log p(x_i) > rollback rolls x_i back with everything after it."""
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.05, 0.9, 0.05], [0.3, 0.3, 0.4], [0.1, 0.1, 0.8]])) + 3.0
    x = torch.tensor([0, 1, 0])  # -log p: 0.36, 0.11, 1.20
    for rollback, n in ((2.0, 3), (1.0, 2), (0.2, 0), (0.0, 0)):
        got, row = bild_verify(logits, x, rollback)
        assert int(got) == n and torch.equal(row, logits[n])
    got, _ = bild_verify(logits, torch.tensor([2, 1, 2]), 1.0)  # a later token passing does not undo the rollback
    assert int(got) == 0


def test_warp_topk_then_topp_keeps_crossing_token():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    probs = warp(logits, temperature=1.0, top_k=3, top_p=0.6)
    # top-3 renormalized: 4/9, 3/9, 2/9; cumulative before: 0, 0.44, 0.78 -> keep the first two
    assert torch.allclose(probs.double(), torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]), atol=1e-6)
    assert torch.equal(warp(logits, 0.0), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert torch.allclose(warp(logits, 1.0, 0, 1.0).double(), torch.tensor([0.4, 0.3, 0.2, 0.1]), atol=1e-6)
    # temperature sharpens before filtering
    sharp = warp(logits, 0.5, 0, 1.0).double()
    assert torch.allclose(sharp, torch.tensor([0.16, 0.09, 0.04, 0.01]) / 0.30, atol=1e-6)
