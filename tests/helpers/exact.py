"""Exact laws of tiny models by enumeration, and the chi-square test of a decoder's samples against them."""

from __future__ import annotations

import itertools
from collections import Counter

import torch
from scipy.stats import chisquare

from pipeline.decoding.batched import BatchedDecoder
from pipeline.decoding.fast_forward import lean_forward_for
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.warping import make_generator

WARP = dict(temperature=0.9, top_k=6, top_p=0.95)
PROMPT = [0, 3, 5]


def exact_law(model, prompt, length, warper, engine: bool = False):
    """The target's exact warped law of the first ``length`` tokens, by enumeration (no KV cache reuse).
    ``engine``: rows as our engine computes them (``CachedModel``, its kernels and dtype) instead of ``model(...)``."""
    law = {}
    vocab = model.config.vocab_size
    with torch.no_grad():
        for seq in itertools.product(range(vocab), repeat=length):
            pr = 1.0
            for i in range(length):
                ids = prompt + list(seq[:i])
                logits = (
                    CachedModel(model).forward(ids, keep=1)[-1] if engine else model(torch.tensor([ids])).logits[0, -1]
                )
                pr *= float(warper(logits)[seq[i]])
                if pr == 0:
                    break
            if pr > 0:
                law[seq] = pr
    return law


def chi_square_pvalue(samples, law):
    counts = Counter(samples)
    n = len(samples)
    assert set(counts) <= set(law), f"outcomes outside the target's support: {set(counts) - set(law)}"
    keys = sorted(law, key=law.get, reverse=True)
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for k in keys:
        e = law[k] * n
        if e >= 5:
            obs.append(counts.get(k, 0))
            exp.append(e)
        else:
            pool_o += counts.get(k, 0)
            pool_e += e
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    scale = n / sum(exp)  # the enumerated law sums to 1 only up to fp32 rounding
    return chisquare(obs, [e * scale for e in exp]).pvalue


LAW_BATCH = 16  # requests decoded at once by first_tokens (3-6x fewer forwards' overhead than one at a time)


def first_tokens(decoder, n, length, seed=1234, max_new=None, batch_size=LAW_BATCH, prompt=PROMPT):
    """The first ``length`` tokens of ``n`` generations of ``prompt``, request i with its own generator (``seed +
    i``), decoded ``batch_size`` at a time through the engine's one loop (``BatchedDecoder``).

    These are the batch-1 samples of the same generators: a request's tokens at batch B equal its own at batch 1
    and ``Decoder.generate``'s, token for token, for every method and drafter (tests/test_decoding_batched*.py), so
    a law checked on them is the batch-1 law, drawn with the forwards shared (tiny models: 3-6x faster, CPU
    bound by Python per forward). ``batch_size=1`` draws them one ``generate`` at a time; a decoder the batched
    loop refuses (its own loop: beam; a setting with no batched form) is drawn that way too."""
    gens = [make_generator(seed + i) for i in range(n)]
    max_new = max_new or length
    if batch_size > 1 and decoder.capabilities.batchable:
        try:
            batched = BatchedDecoder(decoder, batch_size)
        except ValueError:
            batched = None
        if batched is not None:
            out = batched.generate([prompt] * n, max_new_tokens=max_new, generators=gens)
            return [tuple(g.tokens[:length]) for g in out]
    return [tuple(decoder.generate(prompt, max_new_tokens=max_new, generator=g).tokens[:length]) for g in gens]


def count_forwards(model):
    """Tokens fed by every forward of ``model``, through transformers' forward or the lean one."""
    calls = []

    def hook(module, args, kwargs):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        calls.append(ids.shape[1])

    handles = [
        m.register_forward_pre_hook(hook, with_kwargs=True) for m in (model, lean_forward_for(model)) if m is not None
    ]

    class _Handles:
        def remove(self):
            for h in handles:
                h.remove()

    return calls, _Handles()
