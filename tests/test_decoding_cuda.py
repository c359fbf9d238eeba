"""The decoding engine on a CUDA device: greedy identity, exact laws, seeded reproducibility (``pytest -m gpu``).

The CPU suite proves each method; this file runs the same properties with models, caches, samplers and
generators on ``cuda`` (fp32, and bf16 for identity and reproducibility), where device mismatches, host
syncs and half-precision paths would show. Skipped where no CUDA device is present; a GPU owner runs it
with one command: ``make test ARGS="-m gpu tests/test_decoding_cuda.py"``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from helpers.exact import PROMPT, WARP, chi_square_pvalue
from helpers.models import tiny_llama
from pipeline.decoding import METHODS, build_decoder
from pipeline.decoding.medusa_heads import MedusaHeads, place_medusa_heads
from pipeline.decoding.warping import Warper, make_generator

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _greedy_pair(dtype: torch.dtype):
    """Target (with random Medusa heads) and draft over a 64-token vocabulary, on cuda in ``dtype``."""
    target = tiny_llama(10, vocab=64, hidden=32, layers=2).to("cuda", dtype)
    heads = MedusaHeads(32, 3)
    torch.manual_seed(5)
    for p in heads.parameters():  # random heads, so the trees differ from the LM head's top-k
        torch.nn.init.normal_(p, std=0.3)
    place_medusa_heads(target, heads)  # after the move: heads take the target's device and dtype when placed
    # (target, draft, assets): the heads are passed beside the models, never set on the target
    return target, tiny_llama(11, vocab=64, hidden=32, layers=1).to("cuda", dtype), {"medusa": heads}


@pytest.fixture(scope="module", params=sorted(DTYPES))
def cuda_pair(request):
    return _greedy_pair(DTYPES[request.param])


GREEDY = [
    ("spd", {"gamma": 1}),
    ("spd", {"gamma": 3}),
    ("block", {"gamma": 3}),
    ("block", {"gamma": 5}),
    ("mtad", {"gamma": 3}),
    ("spectr", {}),
    ("spectr", {"num_drafts": 1, "gamma": 2}),
    ("specinfer", {}),
    ("specinfer", {"k_config": [2, 1, 3, 1, 1]}),
    ("mcss", {}),
    ("mcss", {"k_config": [3, 3]}),
    ("typical", {}),
    ("typical", {"drafter": "medusa"}),
    ("medusa", {}),
    ("medusa", {"acceptance": "exact", "k_config": [2, 2, 2]}),
    ("bild", {"rollback": 0.0}),
    ("spd", {"drafter": "ngram"}),
    ("block", {"drafter": "ngram"}),
]


@pytest.mark.parametrize("method,params", GREEDY)
def test_greedy_identity_on_cuda(cuda_pair, method, params):
    ar = build_decoder("ar", cuda_pair[0], temperature=0)
    other = build_decoder(method, *cuda_pair, temperature=0, **params)
    for prompt in ([0], [5, 9, 2], list(range(1, 20))):
        got = other.generate(prompt, max_new_tokens=40)
        assert got.tokens == ar.generate(prompt, max_new_tokens=40).tokens
        assert sum(got.accepted) == len(got.tokens) == 40


@pytest.mark.parametrize("method", sorted(METHODS))
def test_same_cuda_seed_same_output(cuda_pair, method):
    decoder = build_decoder(method, *cuda_pair, temperature=1.0, top_k=10, top_p=0.9)
    a = decoder.generate([1, 2, 3], max_new_tokens=24, generator=make_generator(7, "cuda"))
    b = decoder.generate([1, 2, 3], max_new_tokens=24, generator=make_generator(7, "cuda"))
    assert a.tokens == b.tokens and len(a.tokens) == 24


@pytest.fixture(scope="module")
def exact_pair():
    target = tiny_llama(0).to("cuda")
    heads = place_medusa_heads(target, MedusaHeads(target.config.hidden_size, 2))
    draft = tiny_llama(1).to("cuda")
    warper = Warper(**WARP)
    law = {}
    with torch.no_grad():  # the target's exact law of two tokens, by enumeration on the device
        for seq in itertools.product(range(target.config.vocab_size), repeat=2):
            pr = 1.0
            for i in range(2):
                logits = target(torch.tensor([PROMPT + list(seq[:i])], device="cuda")).logits[0, -1]
                pr *= float(warper(logits)[seq[i]])
            if pr > 0:
                law[seq] = pr
    return target, draft, law, {"medusa": heads}


@pytest.mark.parametrize(
    "method,params,n",
    [
        ("ar", {}, 2000),
        ("spd", {"gamma": 2}, 3000),
        ("block", {"gamma": 4}, 3000),
        ("specinfer", {"k_config": [2, 2]}, 2000),
        ("mcss", {"k_config": [2, 2]}, 2000),
        ("spectr", {"num_drafts": 2, "gamma": 2}, 2000),
        ("medusa", {"acceptance": "exact", "k_config": [2, 2]}, 2000),
    ],
)
def test_lossless_methods_match_the_target_distribution_on_cuda(exact_pair, method, params, n):
    target, draft, law, assets = exact_pair
    decoder = build_decoder(method, target, draft, assets, **WARP, **params)
    gen = make_generator(1234, "cuda")
    samples = [tuple(decoder.generate(PROMPT, max_new_tokens=2, generator=gen).tokens[:2]) for _ in range(n)]
    assert chi_square_pvalue(samples, law) > 1e-3
