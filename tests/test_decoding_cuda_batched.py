"""The engine's one batched loop on a CUDA device at batch 3 (``pytest -m gpu``), with CUDA graphs on (the default):
chains, trees (specinfer, mcss, traversal, spectr, medusa), BiLD and MTJD.

On the CPU a request's tokens at batch 3 equal its own at batch 1 bit for bit (tests/test_decoding_batched*.py); on
CUDA that is not promised (a packed step's kernels, its graph bucket and its reductions differ from a lone request's),
so each method is checked by what holds whatever the rounding: greedy decoding gives greedy ar's tokens (float32
models whose logits have no near-ties), and each request's first two tokens, drawn with its own CUDA generator while
two other requests share its forwards, follow the warped target's exact law (chi-square against the law enumerated on
a CPU copy of the target). MTJD is not lossless: with one beam its beam sampler is the target's own ancestral
sampling, which is what its law check draws. Skipped where no CUDA device is present.
"""

from __future__ import annotations

import pytest
import torch

from helpers.exact import PROMPT, WARP, chi_square_pvalue, exact_law
from helpers.models import tiny_llama
from pipeline.decoding import build_decoder
from pipeline.decoding.batched import BatchedDecoder
from pipeline.decoding.fast_forward import lean_forward_for
from pipeline.decoding.medusa_heads import MedusaHeads, place_medusa_heads
from pipeline.decoding.warping import Warper, make_generator

DEVICE = "cuda"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BATCH = 3
# prompts of different lengths, a one-token prompt among them (Medusa: no hidden row yet), more than the slots
PROMPTS = [[0], [5, 2, 6], [1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [7, 7, 7, 7, 7, 7], [3, 1]]


def _heads(target, hidden: int, depth: int, seed: int = 5):
    heads = MedusaHeads(hidden, depth)
    torch.manual_seed(seed)
    for p in heads.parameters():  # random heads: the trees differ from the LM head's top-k
        torch.nn.init.normal_(p, std=0.3)
    return {"medusa": place_medusa_heads(target, heads)}  # after the move: the heads take the target's device


@pytest.fixture(scope="module")
def greedy_pair():
    target = tiny_llama(10, vocab=64, hidden=32, layers=2).to(DEVICE)
    draft = tiny_llama(11, vocab=64, hidden=32, layers=1).to(DEVICE)
    return target, draft, _heads(target, 32, 3)


GREEDY = [
    ("spd", {"gamma": 3}),
    ("block", {"gamma": 4}),
    ("mtad", {"gamma": 3}),
    ("specinfer", {"k_config": [3, 2, 2]}),
    ("mcss", {"k_config": [3, 2]}),
    ("traversal", {"k_config": [2, 2, 2]}),
    ("spectr", {"num_drafts": 3, "gamma": 3}),
    ("medusa", {}),
    ("bild", {"rollback": 0.0}),
]


@pytest.mark.parametrize("method,params", GREEDY, ids=[m for m, _ in GREEDY])
def test_greedy_at_batch_three_equals_greedy_ar_on_cuda(greedy_pair, method, params):
    """Five requests through three slots: each request's tokens are greedy ar's at batch 1, every step emitting."""
    ar = build_decoder("ar", greedy_pair[0], temperature=0)
    decoder = build_decoder(method, *greedy_pair, temperature=0, **params)
    got = BatchedDecoder(decoder, BATCH).generate(PROMPTS, max_new_tokens=24)
    for prompt, gen in zip(PROMPTS, got):
        assert gen.tokens == ar.generate(prompt, max_new_tokens=24).tokens
        assert sum(gen.accepted) == len(gen.tokens) == 24
    graphs = lean_forward_for(greedy_pair[0]).graphs  # the default path: the steps replayed as graphs
    assert graphs is not None and graphs.replays > 0


@pytest.fixture(scope="module")
def law_pair():
    """The law's target (tiny, vocabulary 8) and draft on the device, Medusa heads, and the target's exact warped law
    of two tokens (enumerated on a CPU copy: the same weights, seeded)."""
    law = exact_law(tiny_llama(0), PROMPT, 2, Warper(**WARP))
    target, draft = tiny_llama(0).to(DEVICE), tiny_llama(1).to(DEVICE)
    return target, draft, _heads(target, target.config.hidden_size, 2), law


LAWS = [
    ("spd", {"gamma": 2}, 600),
    ("block", {"gamma": 3}, 600),
    ("specinfer", {"k_config": [3, 2]}, 600),
    ("mcss", {"k_config": [3, 2]}, 600),
    ("traversal", {"k_config": [2, 2]}, 600),
    ("spectr", {"num_drafts": 2, "gamma": 2}, 600),
    ("medusa", {"acceptance": "exact", "k_config": [2, 2]}, 600),
    ("bild", {"rollback": 0.0}, 600),
    ("bild", {"fallback": 1.0}, 600),
    ("mtjd", {"num_beams": 1, "num_tokens": 2}, 600),
]


def first_two(decoder, n: int, seed: int) -> list[tuple[int, ...]]:
    """Each of ``n`` requests' first two tokens at batch 3, request i drawn with its own CUDA generator."""
    gens = [make_generator(seed + i, DEVICE) for i in range(n)]
    out = BatchedDecoder(decoder, BATCH).generate([PROMPT] * n, max_new_tokens=3, generators=gens)
    return [tuple(g.tokens[:2]) for g in out]


@pytest.mark.parametrize("method,params,n", LAWS, ids=[f"{m}-{'-'.join(map(str, p.values()))}" for m, p, _ in LAWS])
def test_every_request_of_a_batch_of_three_samples_the_target_law_on_cuda(law_pair, method, params, n):
    target, draft, assets, law = law_pair
    decoder = build_decoder(method, target, draft, assets, **WARP, **params)
    assert chi_square_pvalue(first_two(decoder, n, 5000), law) > 1e-3


def test_the_cuda_law_check_catches_shared_randomness(law_pair):
    """Negative control: requests sharing one seed give one outcome, and the check fails them."""
    target, draft, assets, law = law_pair
    decoder = build_decoder("specinfer", target, draft, assets, **WARP, k_config=[3, 2])
    out = BatchedDecoder(decoder, BATCH).generate(
        [PROMPT] * 300, max_new_tokens=3, generators=[make_generator(7, DEVICE) for _ in range(300)]
    )
    samples = [tuple(g.tokens[:2]) for g in out]
    assert len(set(samples)) == 1 and chi_square_pvalue(samples, law) < 1e-3
