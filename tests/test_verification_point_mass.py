"""A deterministic proposal (n-gram lookup) carries no draft rows (``ChainDraft.probs`` None): the rules that
declare ``point_mass`` take Q = None as the point mass at each draft. Their outputs equal the dense rules' on the
one-hot rows bit for bit, for every coin draw, so the laws of the dense rules (tests/test_decoding_exact.py,
test_decoding_verification.py) hold for the n-gram drafter unchanged (and are sampled end to end with it in
test_decoding_drafters.py's test_lossless_with_every_drafter); the engine passes None only to those rules."""

from __future__ import annotations

import pytest
import torch

from helpers.exact import PROMPT, WARP
from pipeline.decoding import METHODS, build_decoder, method_class
from pipeline.decoding.drafters import NgramDrafter
from pipeline.decoding.hsd_verify import hsd_dense, hsd_reference_dense
from pipeline.decoding.verification import (
    block_verify,
    block_verify_sparse,
    token_acceptance,
    token_verify,
    token_verify_sparse,
)
from pipeline.decoding.warping import Warper

DENSE = {"token": token_verify, "block": block_verify, "hsd": hsd_dense, "hsd_reference": hsd_reference_dense}
SPARSE = {"token": token_verify_sparse, "block": block_verify_sparse}


def _case(seed: int, g: int, V: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target rows P [g+1, V] with k non-zeros each (a top-k warping), drafts x [g] inside or outside P's
    support, their one-hot rows Q [g, V]."""
    gen = torch.Generator().manual_seed(seed)
    P = torch.zeros(g + 1, V)
    for i in range(g + 1):
        support = torch.randperm(V, generator=gen)[:k]
        P[i, support] = torch.rand(k, generator=gen) + 0.05
    P = P / P.sum(-1, keepdim=True)
    x = torch.randint(0, V, (g,), generator=gen)
    inside = torch.rand(g, generator=gen) < 0.7  # mostly drafts the target can accept, some it cannot
    x = torch.where(inside, P[:g].argmax(-1), x)
    Q = torch.zeros(g, V).scatter_(1, x[:, None], 1.0)
    return P, Q, x, gen


@pytest.mark.parametrize("rule", sorted(DENSE))
def test_dense_rules_take_the_point_mass_as_the_one_hot_rows(rule):
    for seed in range(40):
        P, Q, x, gen = _case(seed, g=1 + seed % 4, V=11, k=1 + seed % 6)
        u = torch.rand(x.shape[0], generator=gen)
        n_dense, out_dense = DENSE[rule](P, Q, x, u)
        n_point, out_point = DENSE[rule](P, None, x, u)
        assert int(n_point) == int(n_dense), (rule, seed)
        assert torch.equal(out_point, out_dense), (rule, seed)


@pytest.mark.parametrize("rule", sorted(SPARSE))
def test_sparse_rules_take_the_point_mass_as_the_one_hot_rows(rule):
    for seed in range(40):
        g, k = 1 + seed % 4, 1 + seed % 6
        P, Q, x, gen = _case(seed, g=g, V=11, k=k)
        u = torch.rand(g, generator=gen)
        probs, index = P.topk(k, -1)
        n_dense, i_dense, w_dense = SPARSE[rule](index, probs, Q, x, u)  # the C++ kernels where built
        n_point, i_point, w_point = SPARSE[rule](index, probs, None, x, u)  # the Python path: no rows to read
        assert int(n_point) == int(n_dense) and torch.equal(i_point, i_dense), (rule, seed)
        torch.testing.assert_close(w_point, w_dense, rtol=0, atol=1e-7)


def test_token_acceptance_of_a_point_mass_is_p_at_the_draft():
    P, Q, x, _ = _case(3, g=3, V=9, k=4)
    assert torch.equal(token_acceptance(P, None, x), token_acceptance(P, Q, x))


def test_the_lossless_rules_declare_the_point_mass_and_the_ngram_drafter_carries_no_rows():
    """Every registered chain rule that reads draft rows declares ``point_mass`` (a rule of one's own that does not
    is given one-hot rows); the n-gram proposal has no [g, V] tensor."""
    rows = {name: cls.rule.point_mass for name, cls in METHODS.items() if getattr(cls, "rule", None) is not None}
    rows = {n: pm for n, pm in rows.items() if method_class(n).rule.draft == "rows"}
    assert rows and all(rows.values()), rows
    draft = NgramDrafter("cpu").propose([1, 2, 3, 1, 2], 3, Warper(1.0, 0, 1.0), None)
    assert draft is not None and draft.probs is None


def test_a_rule_without_point_mass_gets_one_hot_rows(tiny_pair):
    """The engine gives a rule that does not declare ``point_mass`` the one-hot rows of a deterministic proposal."""
    decoder = build_decoder("spd", *tiny_pair, **WARP, drafter="ngram", gamma=2)
    decoder.rule = type(decoder.chain_rule)(token_verify)  # the same rule, without the declaration
    draft = decoder.drafter_impl.propose(PROMPT + PROMPT, 2, decoder.warper, None)
    assert draft is not None
    tokens, q = decoder.rule_input(draft)
    assert q.shape == (tokens.shape[0], decoder.target.vocab_size) and torch.equal(q.sum(-1), torch.ones(len(tokens)))
