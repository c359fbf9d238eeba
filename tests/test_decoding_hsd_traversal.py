"""hsd, hsd_ref and traversal on tiny random models: chi-square exactness against the enumerated target law
(lossless forms), greedy identity with ``ar``, EAGLE trees under traversal, and the engine's randomised
rules (generator-driven) against the exact enumeration of ``pipeline.decoding.exact``."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from helpers.exact import PROMPT, WARP, chi_square_pvalue, count_forwards, exact_law, first_tokens
from helpers.heads import with_eagle
from helpers.models import tiny_llama
from pipeline.decoding import build_decoder, make_generator
from pipeline.decoding.exact import Pair, draft_trees, walk_cases
from pipeline.decoding.hsd_verify import hsd_reference_rule, hsd_rule
from pipeline.decoding.traversal_verify import generator_coin, traversal_walk
from pipeline.decoding.warping import Warper


@pytest.fixture(scope="module")
def law2(tiny_pair):
    return exact_law(tiny_pair[0], PROMPT, 2, Warper(**WARP))


@pytest.mark.parametrize(
    "method,params,n",
    [
        ("hsd", {"gamma": 2}, 2500),  # gamma 3 and deeper: exactly, by enumeration (test_decoding_exact.py)
        ("traversal", {"k_config": [3, 2]}, 1500),  # top-k 6 / top-p 0.95: some nodes have fewer children
    ],
)
def test_lossless_forms_match_the_target_distribution(tiny_pair, law2, method, params, n):
    decoder = build_decoder(method, *tiny_pair, **WARP, **params)
    samples = first_tokens(decoder, n, 2, max_new=3)  # a depth-2 draft in the first iteration
    assert chi_square_pvalue(samples, law2) > 1e-3


@pytest.fixture(scope="module")
def greedy_pair():
    return with_eagle(tiny_llama(10, vocab=64, hidden=32, layers=2)), tiny_llama(11, vocab=64, hidden=32, layers=1)


@pytest.mark.parametrize(
    "method,params",
    [
        ("hsd", {"gamma": 1}),
        ("hsd", {"gamma": 4}),
        ("hsd", {"gamma": 4, "drafter": "eagle"}),
        ("hsd", {"gamma": 3, "drafter": "ngram"}),
        ("hsd_ref", {"gamma": 4}),
        ("traversal", {}),
        ("traversal", {"k_config": [1]}),
        ("traversal", {"k_config": [2, 1, 3]}),
        ("traversal", {"k_config": [3, 2, 2], "drafter": "eagle"}),
    ],
)
def test_greedy_identity_on_tiny_models(greedy_pair, method, params):
    ar = build_decoder("ar", greedy_pair[0], temperature=0)
    other = build_decoder(method, *greedy_pair, temperature=0, **params)
    for prompt in ([0], [5, 9, 2, 5, 9], list(range(1, 20))):
        ref = ar.generate(prompt, max_new_tokens=40).tokens
        got = other.generate(prompt, max_new_tokens=40)
        assert got.tokens == ref
        assert sum(got.accepted) == len(got.tokens) == 40 and len(got.accepted) == got.steps


def test_traversal_with_eagle_trees_keeps_the_target_law():
    """An EAGLE-2 dynamic tree (2 of the 3 root children expanded) drawn without replacement from the head's rows."""
    target = with_eagle(tiny_llama(0))
    law = exact_law(target, PROMPT, 2, Warper(**WARP))
    decoder = build_decoder(
        "traversal", target, None, drafter={"kind": "eagle", "top_nodes": 2}, k_config=[3, 2], **WARP
    )
    assert decoder.draft is None
    assert chi_square_pvalue(first_tokens(decoder, 1200, 2, max_new=3), law) > 1e-3


@pytest.mark.parametrize(
    "method,params,max_fed", [("hsd", {"gamma": 3}, 4), ("traversal", {"k_config": [2, 2]}, 1 + 2 + 4)]
)
def test_target_forwards_are_steps_plus_prefill(tiny_pair, method, params, max_fed):
    target, draft = tiny_pair
    calls, handle = count_forwards(target)
    try:
        out = build_decoder(method, target, draft, **WARP, **params).generate(
            list(range(8)) * 4, max_new_tokens=60, generator=make_generator(3)
        )
    finally:
        handle.remove()
    assert len(calls) == out.steps + 1 == len(out.accepted) + 1
    assert max(calls[1:]) <= max_fed and sum(out.accepted) == len(out.tokens) == 60


def test_self_drafted_traversal_accepts_whole_paths(tiny_pair):
    """Draft == target: every leaf's sequence-level ratio is 1, so the first leaf is always accepted."""
    target = tiny_pair[0]
    out = build_decoder("traversal", target, target, **WARP, k_config=[2, 2, 2]).generate(
        PROMPT, max_new_tokens=16, generator=make_generator(0)
    )
    assert out.accepted == [4, 4, 4, 4]


def test_the_engines_hsd_rules_draw_the_enumerated_laws():
    """The generator-driven rules the decoders call, sampled 10,000 times on the toy p = (1/3, 2/3), q = (2/3, 1/3)
    at gamma 2 for the draft x = (B, A): the accepted count's frequencies match the exact law of the calculator
    (block's law for hsd; the uncapped whole-draft acceptance for hsd_ref)."""
    p, q = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64), torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)
    P, Q, x = torch.stack([p, p, p]), torch.stack([q, q]), torch.tensor([1, 0])
    gen = make_generator(0)
    n = 10000
    for rule, expected in ((hsd_rule, {2: 1 / 2, 1: 1 / 2}), (hsd_reference_rule, {2: 1.0})):
        counts = Counter(int(rule(P, Q, x, gen)[0]) for _ in range(n))
        # x = BA: pi_1 = 1, pi_2 = 1/2; h_1 = 1 (residual at position 1 has mass 1/3, 1 - pi_1 = 0); P(x)/Q(x) = 1
        for k, pr in expected.items():
            assert abs(counts[k] / n - pr) < 4 * (pr * (1 - pr) / n) ** 0.5 + 1e-9, (rule.__name__, counts)


def test_the_engines_traversal_walk_draws_the_enumerated_law():
    """traversal_walk with the engine's generator coin, 20,000 times on one random tree: the accepted paths'
    frequencies match the exact case split the calculator runs through the same walk."""
    pair = Pair.random(3, 5)
    tree, P, _ = max(draft_trees(pair, [2, 1], replacement=False), key=lambda t: len(t[0]))
    exact = Counter()
    for pr, path, _ in walk_cases("traversal", P, tree):
        exact[tuple(path)] += pr
    gen = make_generator(1)
    n = 20000
    got = Counter(tuple(traversal_walk(P, tree, generator_coin(gen))[0]) for _ in range(n))
    assert set(got) <= set(exact)
    for path, pr in exact.items():
        assert abs(got[path] / n - pr) < 4 * (pr * (1 - pr) / n) ** 0.5 + 1e-9, (path, got, exact)
