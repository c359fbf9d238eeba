"""Per-iteration roofline of the chain loop at batch 1 on the offline pair (issue 44 item 5): wall time per
iteration split into the bf16 kernels' target/draft forwards (decoder_forward, by rows), the LM head (linear, by
rows), the fused draft chain (draft_chain) and the remainder (everything outside them: sampling, verification rule,
KV bookkeeping, the loop's Python). Methods are run interleaved in one process, ROUNDS rounds, medians.

    HF_HUB_OFFLINE=1 PYTHONPATH=. ROUNDS=3 taskset -c 1 python benchmarks/chain_roofline.py ar spd block mtad

(needs the bf16 kernels, i.e. an AVX512-BF16 CPU; prefill forwards, > 8 rows, are left out of the iteration.)
"""

import collections
import os
import statistics
import sys
import time

import torch

from pipeline.decoding import build_decoder, cpu_kernels
from pipeline.models import load_pair_by_name
from pipeline.prompts import encode_prompt

torch.set_num_threads(1)

K = cpu_kernels.kernels()
rec = collections.defaultdict(list)


def wrap(name, rows_of):
    f = getattr(K, name)

    def w(*a, **k):
        t0 = time.perf_counter()
        out = f(*a, **k)
        rec[(name, rows_of(a))].append(time.perf_counter() - t0)
        return out

    setattr(K, name, w)


wrap("decoder_forward", lambda a: a[0].shape[0])
wrap("linear", lambda a: a[0].shape[-2])
wrap("draft_chain", lambda a: a[-7])
pair = load_pair_by_name("smollm2-offline")
tok = pair.tokenizer
P = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain the difference between a list and a tuple in Python.",
    "Compose a short travel blog post about a trip to Hawaii.",
]
prompts = [encode_prompt(tok, p, True) for p in P]
eos = [tok.eos_token_id]
decs = {}
for m in sys.argv[1:]:
    gamma = 3 if m == "mtad" else 4
    params = (
        dict(gamma=gamma, draft_stop="acceptance", draft_cost="auto", verify_cost="auto", draft_min=0)
        if m != "ar"
        else {}
    )
    d = build_decoder(m, pair.target, pair.draft if m != "ar" else None, **params)
    decs[m] = d  # draft_cost / verify_cost: auto are read live off the loop's clock (the first requests calibrate)


def run(d):
    res = []
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        res.append(d.generate(p, max_new_tokens=128, eos_token_ids=eos, generator=torch.Generator().manual_seed(i)))
    return time.perf_counter() - t0, res


for d in decs.values():
    run(d)
agg = {m: collections.defaultdict(list) for m in decs}
for rnd in range(int(os.environ.get("ROUNDS", "3"))):
    for m, d in decs.items():
        rec.clear()
        wall, res = run(d)
        steps = sum(r.steps for r in res)
        toks = sum(len(r.tokens) for r in res)
        dr = sum(r.drafted.count(0) for r in res) if m != "ar" else steps
        pre = sum(v for (n, r), ts in rec.items() for v in ts if n == "decoder_forward" and r > 8)
        fwd = sum(v for (n, r), ts in rec.items() for v in ts if n == "decoder_forward" and r <= 8)
        head = sum(v for (n, r), ts in rec.items() for v in ts if n == "linear")
        dc = sum(v for (n, r), ts in rec.items() for v in ts if n == "draft_chain")
        loop = wall - pre
        a = agg[m]
        a["ms_iter"].append(1e3 * loop / steps)
        a["fwd"].append(1e3 * fwd / steps)
        a["head"].append(1e3 * head / steps)
        a["draft"].append(1e3 * dc / steps)
        a["rest"].append(1e3 * (loop - fwd - head - dc) / steps)
        a["tok_per_iter"].append(toks / steps)
        a["plain_frac"].append(dr / steps)
        a["ms_tok"].append(1e3 * loop / toks)
        for (n, r), ts in sorted(rec.items()):
            if r <= 8:
                a[f"{n}[{r}] ms"].append(1e3 * statistics.median(ts))
for m, a in agg.items():
    print(m, " ".join(f"{k}={statistics.median(v):.2f}" for k, v in a.items()))
