"""The sparse fast paths of drafting and sampling give the same draws as the dense rows they replace.

A top-k warped row has at most k non-zero entries: ``sample`` scans only those, ``sample_sparse`` never
builds the row, ``Warper.top_k_rows`` warps on a restricted draft head without the full-vocabulary row,
and ``draft_chain`` uses them (the draft cost c the bench reports). Same generator state, same tokens.
"""

from __future__ import annotations

import pytest
import torch

from helpers.marks import require_kernels
from helpers.models import tiny_llama
from pipeline.decoding import verification, warping
from pipeline.decoding.beam_sampling import beam_sample
from pipeline.decoding.drafters import ModelDrafter
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.verification import (
    block_verify,
    block_verify_sparse,
    mtad_verify,
    mtad_verify_sparse,
    token_verify,
    token_verify_sparse,
)
from pipeline.decoding.vocab import restrict_head
from pipeline.decoding.warping import Warper, make_generator, sample, sample_sparse, warp


def _dense_inverse_cdf(row: torch.Tensor, generator: torch.Generator) -> int:
    """The reference: the inverse CDF over the whole row (what ``sample`` did for every row)."""
    cdf = row.double().cumsum(-1)
    u = torch.rand(1, 1, generator=generator, dtype=torch.float64)
    return int(torch.searchsorted(cdf, u[0] * cdf[-1:], right=True).clamp_(max=row.numel() - 1))


def _sparse_row(seed: int, vocab: int = 4096, k: int = 12) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(vocab, generator=g)[:k]
    probs = torch.rand(k, generator=g) ** 3  # uneven weights, some tiny
    row = torch.zeros(vocab).scatter_(-1, ids, probs)
    return ids, probs, row


def test_sample_on_a_sparse_row_draws_what_the_dense_inverse_cdf_draws():
    for seed in range(300):
        _, _, row = _sparse_row(seed)
        assert int(sample(row, make_generator(seed))) == _dense_inverse_cdf(row, make_generator(seed))


def test_sample_sparse_draws_what_sample_of_the_dense_row_draws():
    for seed in range(300):
        ids, probs, row = _sparse_row(seed)
        assert int(sample_sparse(ids, probs, make_generator(seed))) == int(sample(row, make_generator(seed)))
    with pytest.raises(ValueError, match="no probability mass"):
        sample_sparse(torch.tensor([3, 1]), torch.zeros(2), make_generator(0))


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 10, 0.9), (0.7, 3, 1.0), (1.3, 50, 0.5), (1.0, 64, 0.95)])
def test_top_k_rows_are_the_non_zero_entries_of_warp(temperature, top_k, top_p):
    warper = Warper(temperature=temperature, top_k=top_k, top_p=top_p)
    for seed in range(20):
        logits = torch.randn(64, generator=torch.Generator().manual_seed(seed)) * 3
        index, probs = warper.top_k_rows(logits)
        assert torch.equal(torch.zeros(64).scatter_(-1, index, probs), warp(logits, temperature, top_k, top_p))


def _chains(draft: CachedModel, warper: Warper, monkeypatch, sparse: bool, seeds: int = 40):
    if not sparse:
        monkeypatch.setattr(Warper, "sparse", lambda self, vocab: False)
    out = []
    with torch.no_grad():
        for seed in range(seeds):
            draft.reset()
            context = [1, 2, 3, seed % 7]
            draft.prefill(context[:-1])
            chain = ModelDrafter(draft).propose(context, 3, warper, make_generator(seed))
            out.append((chain.tokens.tolist(), chain.probs))
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("restricted", [False, True])
def test_draft_chain_sparse_path_equals_the_dense_one(restricted, monkeypatch):
    """Tokens and q rows of a chain, with and without the sparse path; the restricted head (5 of the
    target's 12 ids, fewer than top-k 6) keeps q = 0 outside its map."""
    model = tiny_llama(3, vocab=12).eval()
    token_map = [0, 2, 5, 7, 11]
    if restricted:
        model = restrict_head(model, token_map)
    draft = CachedModel(model, vocab_size=12)
    warper = Warper(temperature=0.9, top_k=6, top_p=0.95)
    assert warper.sparse(draft.vocab_size)
    calls = []
    original = CachedModel.top_k_rows
    monkeypatch.setattr(CachedModel, "top_k_rows", lambda self, *a: calls.append(1) or original(self, *a))
    fast = _chains(draft, warper, monkeypatch, sparse=True)
    assert len(calls) == 40 * 3  # the chain really took the sparse path
    slow = _chains(draft, warper, monkeypatch, sparse=False)
    for (t1, q1), (t2, q2) in zip(fast, slow):
        assert t1 == t2
        assert torch.equal(q1, q2)
        if restricted:
            outside = torch.ones(12, dtype=torch.bool)
            outside[token_map] = False
            assert float(q1[:, outside].abs().sum()) == 0.0


@pytest.mark.parametrize(
    "dense, sparse, g, spread, seeds",
    [(token_verify, token_verify_sparse, 3, 2.0, 200), (block_verify, block_verify_sparse, 4, 1.5, 300)],
    ids=["token", "block"],
)
@pytest.mark.parametrize("cpp", [True, False], ids=["kernels", "tensor-ops"])
def test_sparse_verification_follows_the_dense_rule(dense, sparse, g, spread, seeds, cpp, monkeypatch):
    """Same accepted count and the same next-token law as the dense rule, for random top-k rows (drafts
    drawn from Q, some outside P's support, so rejections, residuals and bonus rows all occur); through
    the C++ kernels where they run here, and through the tensor ops every machine has."""
    if cpp:
        require_kernels()
    if not cpp:
        monkeypatch.setattr(verification, "kernels", lambda: None)
        monkeypatch.setattr(warping, "kernels", lambda: None)
    vocab, k = 300, 10
    warper = Warper(temperature=1.0, top_k=k, top_p=0.9)
    outcomes = set()
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(seed)
        logits = torch.randn(g + 1, vocab, generator=gen) * 3
        P = warp(logits, 1.0, k, 0.9)
        Q = warp(logits[:g] + torch.randn(g, vocab, generator=gen) * spread, 1.0, k, 0.9)
        x = torch.stack([sample(Q[i], make_generator(seed * 10 + i)) for i in range(g)])
        coins = torch.rand(g, generator=gen)
        n, dist = dense(P, Q, x, coins)
        n_s, index, weights = sparse(*warper.top_k_rows(logits), Q, x, coins)
        assert int(n) == int(n_s)
        assert torch.allclose(torch.zeros(vocab).scatter_(-1, index, weights / weights.sum()), dist, atol=1e-6)
        outcomes.add(int(n))
    assert outcomes == set(range(g + 1))  # every accepted count, bonus row included


@pytest.mark.parametrize("tau", [0.0, 0.3, 0.9])
def test_mtad_verify_sparse_follows_mtad_verify(tau):
    vocab, k, g = 300, 10, 3
    warper = Warper(temperature=1.0, top_k=k, top_p=0.9)
    for seed in range(100):
        gen = torch.Generator().manual_seed(seed)
        logits = torch.randn(g + 1, vocab, generator=gen) * 3
        P = warp(logits, 1.0, k, 0.9)
        x = torch.randint(0, vocab, (g,), generator=gen)
        x[0] = int(P[0].argmax())  # some drafts inside P's support
        log_q = torch.log(torch.rand(g, generator=gen))
        acc, row = mtad_verify(P, log_q, x, tau)
        acc_s, index, weights = mtad_verify_sparse(*warper.top_k_rows(logits), log_q, x, tau)
        assert int(acc) == int(acc_s)
        assert torch.equal(torch.zeros(vocab).scatter_(-1, index, weights), row)


@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("restricted", [False, True])
def test_beam_sample_sparse_path_draws_the_dense_paths_beams(replacement, restricted, monkeypatch):
    """MTAD's draft: the same beams, log q and draws with and without the top-k fast path."""
    model = tiny_llama(4, vocab=12, layers=2).eval()
    if restricted:
        model = restrict_head(model, [0, 2, 3, 5, 7, 8, 11])
    draft = CachedModel(model, vocab_size=12)
    warper = Warper(temperature=1.0, top_k=6, top_p=0.95)

    def run(sparse: bool):
        if not sparse:
            monkeypatch.setattr(Warper, "sparse", lambda self, vocab: False)
        out = []
        with torch.no_grad():
            for seed in range(30):
                draft.reset()
                context = [1, 2, seed % 5]
                draft.prefill(context[:-1])
                gen = make_generator(seed)
                beam = beam_sample(draft, context, 3, 3, warper, gen, "paper", replacement)
                out.append((beam.tokens, beam.log_q, draft.length, float(torch.rand(1, generator=gen))))
        monkeypatch.undo()
        return out

    for fast, slow in zip(run(True), run(False)):
        assert fast[0] == slow[0] and torch.equal(fast[1], slow[1]) and fast[2:] == slow[2:]
