"""Does a lossless method sample the target's law on the real pair? A check beside the exact tests on tiny models.

    python benchmarks/lossless_law.py N TOKENS ar,spd,block,hsd [PAIR]

Per method (``conf/method/<name>.yaml`` defaults), N generations of TOKENS tokens of one prompt with seeds
10000..10000+N-1; then, each method against the first: the distributions of the first 1, 2 and 3 tokens
(chi-square on a contingency table, prefixes seen fewer than 10 times pooled) and the mean per-token NLL under the
unwarped target (Welch's t). Lossless methods should show no difference beyond chance.
"""

from __future__ import annotations

import collections
import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from scipy import stats

from pipeline.decoding import build_decoder, make_generator
from pipeline.generate import method_params
from pipeline.models import PairSpec, load_pair
from pipeline.prompts import encode_prompt, eos_ids
from pipeline.scoring.perplexity import sequence_nll

PROMPT = "Write a Python function `is_prime(n)` that returns True when n is a prime number."


def prefix_test(ref: list[list[int]], other: list[list[int]], length: int) -> str:
    a = collections.Counter(tuple(o[:length]) for o in ref)
    b = collections.Counter(tuple(o[:length]) for o in other)
    keys = sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))
    big, rest = [k for k in keys if a[k] + b[k] >= 10], [k for k in keys if a[k] + b[k] < 10]
    rows = [[a[k] for k in big] + [sum(a[k] for k in rest)], [b[k] for k in big] + [sum(b[k] for k in rest)]]
    cols = [(x, y) for x, y in zip(*rows) if x + y > 0]
    if len(cols) < 2:
        return f"prefix{length}: one cell"
    p = stats.chi2_contingency([[x for x, _ in cols], [y for _, y in cols]]).pvalue
    return f"prefix{length}: chi2 p={p:.3f} ({len(cols)} cells)"


def main(argv: list[str]) -> None:
    n, tokens, methods = int(argv[0]), int(argv[1]), argv[2].split(",")
    pair_name = argv[3] if len(argv) > 3 else "smollm2-offline"
    torch.set_num_threads(1)
    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        cfgs = {m: compose(config_name="generate", overrides=[f"method={m}", f"pair={pair_name}"]) for m in methods}
    spec = PairSpec.from_config(OmegaConf.to_container(cfgs[methods[0]].pair, resolve=True))
    pair = load_pair(spec)
    ids = encode_prompt(pair.tokenizer, PROMPT, spec.chat)
    eos = eos_ids(pair.tokenizer, pair.target)
    results: dict[str, tuple[list[list[int]], list[float]]] = {}
    for m in methods:
        name, params = method_params(cfgs[m].method)
        dec = build_decoder(name, pair.target, pair.draft, assets=pair.assets, **params)
        start = time.time()
        outs = [
            list(
                dec.generate(ids, max_new_tokens=tokens, eos_token_ids=eos, generator=make_generator(10_000 + s)).tokens
            )
            for s in range(n)
        ]
        nll = [sequence_nll(pair.target, ids, o)[0] / max(1, len(o)) for o in outs]
        results[m] = (outs, nll)
        print(
            f"{m}: {time.time() - start:.0f}s mean nll/token {statistics.mean(nll):.4f} sd {statistics.stdev(nll):.4f}",
            flush=True,
        )
    ref_outs, ref_nll = results[methods[0]]
    for m in methods[1:]:
        outs, nll = results[m]
        t = stats.ttest_ind(nll, ref_nll, equal_var=False)
        diff = statistics.mean(nll) - statistics.mean(ref_nll)
        parts = [f"{m} vs {methods[0]}: nll diff {diff:+.4f} (Welch p={t.pvalue:.3f})"]
        parts += [prefix_test(ref_outs, outs, k) for k in (1, 2, 3)]
        print("; ".join(parts), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
