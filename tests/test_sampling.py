"""The samplers behind every method (warping.sample, sample_k): exact laws, zero weights never drawn."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from pipeline.decoding.warping import make_generator, sample, sample_k

WEIGHTS = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.25, 0.05, 0.0])


def _pvalue(counts: dict, law: dict) -> float:
    keys = sorted(law)
    n = sum(counts.values())
    assert set(counts) <= set(keys), f"drawn outside the support: {set(counts) - set(keys)}"
    return chisquare([counts.get(k, 0) for k in keys], [law[k] * n for k in keys]).pvalue


def test_sample_follows_each_row_and_never_draws_zero_weights():
    gen = make_generator(0)
    rows = torch.stack([WEIGHTS, WEIGHTS.flip(0) * 3.0])  # unnormalised rows are fine
    draws = torch.stack([sample(rows, gen) for _ in range(8000)])  # [n, 2]
    for r in range(2):
        w = rows[r] / rows[r].sum()
        law = {i: float(w[i]) for i in range(len(w)) if w[i] > 0}
        counts = {int(k): int(v) for k, v in zip(*draws[:, r].unique(return_counts=True))}
        assert _pvalue(counts, law) > 1e-3


def test_sample_is_reproducible_and_rejects_empty_rows():
    a = [int(sample(WEIGHTS, make_generator(5))) for _ in range(3)]
    b = [int(sample(WEIGHTS, make_generator(5))) for _ in range(3)]
    assert a == b
    with pytest.raises(ValueError, match="no probability mass"):
        sample(torch.zeros(5), make_generator(0))


def test_sample_k_with_replacement_is_iid():
    gen = make_generator(1)
    w = WEIGHTS / WEIGHTS.sum()
    pairs = [tuple(sample_k(WEIGHTS, 2, True, gen).tolist()) for _ in range(8000)]
    support = [i for i in range(len(w)) if w[i] > 0]
    law = {(i, j): float(w[i] * w[j]) for i, j in itertools.product(support, support)}
    counts = {}
    for p in pairs:
        counts[p] = counts.get(p, 0) + 1
    assert _pvalue(counts, law) > 1e-3


def test_sample_k_without_replacement_has_the_law_of_sequential_draws():
    gen = make_generator(2)
    w = WEIGHTS / WEIGHTS.sum()
    support = [i for i in range(len(w)) if w[i] > 0]
    law = {(i, j): float(w[i] * w[j] / (1 - w[i])) for i, j in itertools.product(support, support) if i != j}
    counts = {}
    for _ in range(8000):
        p = tuple(sample_k(WEIGHTS, 2, False, gen).tolist())
        counts[p] = counts.get(p, 0) + 1
    assert _pvalue(counts, law) > 1e-3


def test_sample_k_without_replacement_stops_at_the_support():
    out = sample_k(WEIGHTS, 10, False, make_generator(3))
    assert sorted(out.tolist()) == [1, 3, 4, 5]
    with pytest.raises(ValueError, match="no probability mass"):
        sample_k(torch.zeros(4), 2, False, make_generator(0))
