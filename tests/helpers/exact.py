"""Exact laws of tiny models by enumeration, and the chi-square test of a decoder's samples against them."""

from __future__ import annotations

import itertools
from collections import Counter

import torch
from scipy.stats import chisquare

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


def first_tokens(decoder, n, length, seed=1234, max_new=None):
    gen = make_generator(seed)
    return [
        tuple(decoder.generate(PROMPT, max_new_tokens=max_new or length, generator=gen).tokens[:length])
        for _ in range(n)
    ]


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
