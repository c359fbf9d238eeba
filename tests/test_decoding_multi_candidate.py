"""Exact tests of the multi-candidate rules (SpecInfer MSS, MCSS, SpecTr K-SEQ, one-hot, typical) by enumeration."""

from __future__ import annotations

import itertools

import pytest
import torch

from pipeline.decoding.tree import TokenTree
from pipeline.decoding.tree_verify import kseq_chain_walk, mss_tree_walk, one_hot_tree_walk, typical_tree_walk
from pipeline.decoding.verification import (
    kseq_acceptance,
    kseq_rho,
    kseq_verify,
    multi_candidate_acceptance,
    multi_candidate_verify,
    one_hot_acceptance,
    typical_acceptance,
    typical_verify,
)

DT = torch.float64


def _t(*v):
    return torch.tensor(v, dtype=DT)


HAND_MADE = [
    (_t(1 / 3, 2 / 3), _t(2 / 3, 1 / 3)),
    (_t(0.5, 0.3, 0.2, 0.0), _t(0.1, 0.2, 0.3, 0.4)),
    (_t(0.05, 0.05, 0.9), _t(0.6, 0.3, 0.1)),
    (_t(0.0, 0.0, 1.0), _t(0.5, 0.5, 0.0)),  # disjoint supports: every candidate is rejected
    (_t(0.25, 0.25, 0.25, 0.25), _t(0.25, 0.25, 0.25, 0.25)),  # p == q: the first candidate is accepted
]


def _random_pairs(n: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        rows = []
        for _ in range(2):
            w = torch.distributions.Gamma(torch.full((vocab,), 0.7, dtype=DT), 1.0).sample()
            w = w * (torch.rand(vocab, generator=g, dtype=DT) > 0.25)
            if w.sum() == 0:
                w[0] = 1.0
            rows.append(w / w.sum())
        out.append(tuple(rows))
    return out


torch.manual_seed(0)
RANDOM = _random_pairs(60, 4, 0)


def _draws(q: torch.Tensor, m: int, replacement: bool):
    """Every ordered candidate tuple of length m drawn from q, with its probability."""
    V = q.shape[0]
    for cands in itertools.product(range(V), repeat=m):
        if not replacement and len(set(cands)) < m:
            continue
        pr, left = 1.0, q.clone()
        for c in cands:
            if left[c] <= 0:
                pr = 0.0
                break
            pr *= float(left[c] / left.sum())
            if not replacement:
                left[c] = 0.0
        if pr > 0:
            yield torch.tensor(cands), pr


def _law(acceptance, p: torch.Tensor, q: torch.Tensor, m: int, replacement: bool, draws=None) -> torch.Tensor:
    """Exact law of the emitted token of a multi-candidate rule."""
    law = torch.zeros_like(p)
    for cands, pr in draws if draws is not None else _draws(q, m, replacement):
        a, residual = acceptance(p, q, cands)
        reach = 1.0
        for j in range(len(cands)):
            law[cands[j]] += pr * reach * float(a[j])
            reach *= 1.0 - float(a[j])
        law += pr * reach * residual
    return law


RULES = {
    "mss": (lambda p, q, c: multi_candidate_acceptance(p, q, c, True), True),
    "mcss": (lambda p, q, c: multi_candidate_acceptance(p, q, c, False), False),
    "kseq": (kseq_acceptance, True),
}


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("m", [1, 2, 3])
def test_multi_candidate_rules_reproduce_the_target_exactly(rule, m):
    acceptance, replacement = RULES[rule]
    cases = HAND_MADE + (RANDOM[:20] if rule == "kseq" else RANDOM)  # K-SEQ's bisection per tuple is slower
    for p, q in cases:
        if not replacement and int((q > 0).sum()) < m:
            continue  # the decoder draws fewer children then (tested with m = support below)
        law = _law(acceptance, p, q, m, replacement)
        assert torch.allclose(law, p, atol=1e-12), (rule, m, p, q, law)


def test_mcss_with_fewer_children_than_asked_is_still_exact():
    """Without replacement and a support smaller than k, the decoder draws all support tokens: exact."""
    p, q = _t(0.2, 0.5, 0.3, 0.0), _t(0.0, 0.6, 0.0, 0.4)
    law = _law(RULES["mcss"][0], p, q, 2, False)
    assert torch.allclose(law, p, atol=1e-12)


def test_one_hot_rule_is_exact_for_any_fixed_candidates():
    for p, q in HAND_MADE + RANDOM[:20]:
        V = p.shape[0]
        for m in (1, 2, 3):
            for cands in itertools.permutations(range(V), min(m, V)):
                law = _law(
                    lambda p_, q_, c: one_hot_acceptance(p_, c), p, q, m, True, draws=[(torch.tensor(cands), 1.0)]
                )
                assert torch.allclose(law, p, atol=1e-12)


def test_negative_controls_are_caught_by_the_exact_law():
    """With-replacement MSS on draws made without replacement, and K-SEQ with rho = 1 for k > 1, are not exact."""
    p, q = HAND_MADE[1]
    wrong_draws = list(_draws(q, 2, False))
    law = _law(RULES["mss"][0], p, q, 2, False, draws=wrong_draws)
    assert not torch.allclose(law, p, atol=1e-3)

    def kseq_rho_one(p_, q_, cands):
        a = torch.clamp(p_[cands] / q_[cands], max=1.0)
        return a, (p_ - q_).clamp_min(0) / (p_ - q_).clamp_min(0).sum()

    law = _law(kseq_rho_one, p, q, 3, True)
    assert not torch.allclose(law, p, atol=1e-3)


def test_verify_draws_follow_the_acceptance_probabilities():
    p, q = HAND_MADE[1]
    cands = torch.tensor([3, 1, 2])
    for verify, acceptance in (
        (lambda u: multi_candidate_verify(p, q, cands, u, True), lambda: multi_candidate_acceptance(p, q, cands, True)),
        (
            lambda u: multi_candidate_verify(p, q, cands, u, False),
            lambda: multi_candidate_acceptance(p, q, cands, False),
        ),
        (lambda u: kseq_verify(p, q, cands, u), lambda: kseq_acceptance(p, q, cands)),
    ):
        a, residual = acceptance()
        for j in range(3):
            u = torch.ones(3, dtype=DT)  # u = 1 never passes (acceptance is u < a, a <= 1)
            u[j] = 0.0
            if float(a[j]) > 0:
                assert int(verify(u)[0]) == j
        got_j, got_res = verify(torch.ones(3, dtype=DT))
        assert int(got_j) == 3 and torch.allclose(got_res, residual)


def test_kseq_rho_is_the_smallest_feasible_division_factor():
    for p, q in HAND_MADE + RANDOM[:30]:
        for k in (1, 2, 4):
            rho = float(kseq_rho(p, q, k))

            def f(r):
                beta = float(torch.minimum(q, p / r).sum())
                return r * beta - (1 - (1 - beta) ** k)

            assert 1.0 <= rho <= k
            assert f(rho) >= -1e-9
            if rho > 1.0 + 1e-6:
                assert f(rho - 1e-6) < 0
            if k == 1:
                assert rho == 1.0


def test_mcss_accepts_at_least_as_often_as_mss_per_node():
    """P(some candidate accepted): without replacement >= with replacement, in every case (docs/ALGORITHMS.md 15)."""
    gains = []
    for p, q in HAND_MADE + RANDOM:
        for m in (2, 3):
            if int((q > 0).sum()) < m:
                continue
            acc = {}
            for name in ("mss", "mcss"):
                acceptance, replacement = RULES[name]
                law_rejected = 0.0
                for cands, pr in _draws(q, m, replacement):
                    a, _ = acceptance(p, q, cands)
                    law_rejected += pr * float(torch.prod(1 - a))
                acc[name] = 1 - law_rejected
            gains.append(acc["mcss"] - acc["mss"])
    assert min(gains) >= -1e-12
    assert sum(gains) / len(gains) > 0.01


def _toy_lm(vocab: int, seed: int):
    """A context-dependent toy LM: prefix (tuple) -> probability row (Dirichlet with exact zeros)."""
    cache = {}
    g = torch.Generator().manual_seed(seed)

    def row(prefix):
        if prefix not in cache:
            w = -torch.log(torch.rand(vocab, generator=g, dtype=DT))  # Dirichlet(1)
            w = w * (torch.rand(vocab, generator=g, dtype=DT) > 0.25)
            if w.sum() == 0:
                w[int(torch.randint(vocab, (1,), generator=g))] = 1.0
            cache[prefix] = w / w.sum()
        return cache[prefix]

    return row


def _expected_tree_acceptance(p_of, q_of, k_config, replacement, prefix=()) -> float:
    """Exact E[accepted tokens] of one tree iteration (children sampled per node, MSS / MCSS walk)."""
    if not k_config:
        return 0.0
    p, q = p_of(prefix), q_of(prefix)
    m = min(k_config[0], int((q > 0).sum())) if not replacement else k_config[0]
    total = 0.0
    for cands, pr in _draws(q, m, replacement):
        a, _ = multi_candidate_acceptance(p, q, cands, replacement)
        reach = 1.0
        for j in range(m):
            c = int(cands[j])
            total += (
                pr
                * reach
                * float(a[j])
                * (1 + _expected_tree_acceptance(p_of, q_of, k_config[1:], replacement, prefix + (c,)))
            )
            reach *= 1 - float(a[j])
    return total


def test_mcss_accepts_at_least_as_many_tokens_as_specinfer_on_the_same_tree_shape():
    """Exact expected accepted length of a (3, 2) tree under random toy LMs, paired per instance."""
    pairs = []
    for seed in range(25):
        p_of, q_of = _toy_lm(4, 2 * seed), _toy_lm(4, 2 * seed + 1)
        pairs.append(
            (
                _expected_tree_acceptance(p_of, q_of, [3, 2], True),
                _expected_tree_acceptance(p_of, q_of, [3, 2], False),
            )
        )
    specinfer = sum(a for a, _ in pairs) / len(pairs)
    mcss = sum(b for _, b in pairs) / len(pairs)
    assert mcss > specinfer
    assert all(b >= a - 1e-12 for a, b in pairs)  # on every instance, not on 90% of them


def _tree(tokens_parents):
    tree = TokenTree(0)
    for token, parent in tokens_parents:
        tree.add(token, parent)
    return tree


def test_tree_walks_match_the_node_rules():
    """Deterministic walks: rows that accept surely follow the right child; rejections return the residual."""
    V = 3
    tree = _tree([(0, -1), (1, -1), (2, 0), (1, 0)])  # root -> {0, 1}; node 0 -> {2, 1}
    P = torch.zeros(1 + 4, V, dtype=DT)
    P[0] = _t(0.0, 1.0, 0.0)  # the root accepts only token 1 (node 1, a leaf)
    P[2] = _t(0.2, 0.3, 0.5)  # node 1's row: the bonus row
    tree.q_rows[0] = _t(0.5, 0.5, 0.0)
    tree.q_rows[1] = _t(0.0, 0.5, 0.5)
    g = torch.Generator().manual_seed(0)
    for replacement in (True, False):
        path, dist = mss_tree_walk(P, tree, g, replacement)
        assert path == [1] and torch.equal(dist, P[2])
    path, dist = one_hot_tree_walk(P, tree, None, greedy=True)
    assert path == [1] and torch.equal(dist, P[2])
    # nothing acceptable at the root: the residual of both candidates
    P2 = P.clone()
    P2[0] = _t(0.0, 0.0, 1.0)
    path, dist = mss_tree_walk(P2, tree, g, True)
    assert path == [] and torch.allclose(dist, _t(0.0, 0.0, 1.0))


def test_kseq_chain_walk_keeps_every_chain_with_the_accepted_token():
    """Three chains a-b, a-c, d-e: accepting a keeps chains 0 and 1, whose second tokens are then the candidates."""
    tree = _tree([(0, -1), (0, -1), (2, -1), (1, 0), (3, 1), (1, 2)])  # depth-1 nodes 3, 4, 5 under 0, 1, 2
    V = 4
    P = torch.zeros(1 + 6, V, dtype=DT)
    P[0] = _t(1.0, 0.0, 0.0, 0.0)  # token 0 surely accepted (q(0) = 1 after all chains start with 0 or 2)
    P[1] = _t(0.0, 0.0, 0.0, 1.0)  # after token 0: only token 3 (node 4, chain 1)
    P[2] = P[1]
    P[5] = _t(0.1, 0.2, 0.3, 0.4)  # node 4's bonus row
    tree.q_rows[0] = _t(0.5, 0.0, 0.5, 0.0)
    tree.q_rows[1] = _t(0.0, 0.5, 0.0, 0.5)
    tree.q_rows[2] = tree.q_rows[1]
    tree.q_rows[3] = _t(0.0, 1.0, 0.0, 0.0)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        path, dist = kseq_chain_walk(P, tree, g)
        assert [tree.tokens[i] for i in path] == [0, 3] and path == [1, 4]
        assert torch.equal(dist, P[5])


def test_typical_acceptance_on_hand_made_rows():
    p = _t(0.5, 0.3, 0.2, 0.0)
    H = -(p[:3] * p[:3].log()).sum()
    x = torch.tensor([0, 1, 2, 3])
    P = p.expand(4, 4)
    for eps, delta in ((0.09, 0.3), (0.25, 0.6), (0.4, 10.0)):
        threshold = min(eps, delta * float(torch.exp(-H)))
        expected = [float(p[i]) > threshold for i in range(4)]
        assert typical_acceptance(P, x, eps, delta).tolist() == expected
    assert typical_acceptance(P, x, 0.0, 0.3).tolist() == [True, True, True, False]  # eps 0: the support
    assert typical_acceptance(P, x, 1.0, 100.0).tolist() == [False] * 4  # threshold 1: nothing
    one_hot = torch.eye(4, dtype=DT)[[2, 2, 2, 2]]
    assert typical_acceptance(one_hot, x, 0.09, 0.3).tolist() == [False, False, True, False]
    # chain: the longest passing prefix; the next row is the target's own
    Pc = torch.stack([p, p, _t(0.0, 0.0, 0.0, 1.0)])
    n, row = typical_verify(Pc, torch.tensor([1, 0]), 0.09, 0.3)
    assert int(n) == 2 and torch.equal(row, Pc[2])
    n, row = typical_verify(Pc, torch.tensor([3, 0]), 0.09, 0.3)
    assert int(n) == 0 and torch.equal(row, Pc[0])


def test_typical_tree_walk_takes_the_longest_path_then_the_likelier():
    tree = _tree([(0, -1), (1, -1), (2, 0), (2, 1)])  # two paths of length 2: 0-2 and 1-2
    P = torch.zeros(5, 3, dtype=DT)
    P[0] = _t(0.4, 0.6, 0.0)
    P[1] = _t(0.0, 0.3, 0.7)  # after 0: token 2 with 0.7
    P[2] = _t(0.0, 0.1, 0.9)  # after 1: token 2 with 0.9 -> the likelier path of length 2
    path, row = typical_tree_walk(P, tree, 0.09, 0.3)
    assert path == [1, 3] and row == 4
    P[2] = _t(1.0, 0.0, 0.0)  # after 1: token 2 fails; path 0-2 is the only one of length 2
    path, row = typical_tree_walk(P, tree, 0.09, 0.3)
    assert path == [0, 2] and row == 3
