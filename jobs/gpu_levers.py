"""The graphed step's levers A/B in one call (pipeline/decoding/cuda_graphs.py: ``window``, ``mask_copy``,
``qkv_epilogue``), printed as it goes: for each lever set, the target's one-token and five-token steps after a short
and a long context (39 and 400 positions: the window lever's gain grows with the buffer's empty part), an
eight-node tree step (the masked path), then ours ar and specinfer at batch 1 and ar at batch 8, each decode's tokens
checked against the first set's (levers off).

    python jobs/gpu_levers.py [PAIR] [TOKENIZER_DIR] [overrides...]    (the command line as jobs/gpu_common.py reads it)

``LEVER_SETS`` (default ``none;window;mask_copy;qkv_epilogue;window,mask_copy,qkv_epilogue``: ``;`` between sets,
``none`` the levers off), ``COMPILE`` (1: the compiled layer, the default path; 0: uncompiled graphs, where the
qkv_epilogue lever's fewer kernels show), ``TOKENS`` (new tokens, default 64). On a CPU the steps run through the
graphs' launch path uncaptured (``GraphedSteps(capture=False)``): a rehearsal of the script, no figure.
"""

import os
import sys

import torch
import torch._dynamo
from gpu_common import log, pair_from_argv, timed

from pipeline.decoding import build_decoder
from pipeline.decoding.batched import BatchedDecoder
from pipeline.decoding.cuda_graphs import GraphedSteps, parse_levers
from pipeline.decoding.fast_forward import lean_forward_for
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.timing import median_times
from pipeline.decoding.warping import make_generator
from pipeline.device import synchronize
from pipeline.models import load_pair

# every lever set and window compiles its own step shapes: more than compiled_layer()'s 64 entries (past the limit
# dynamo would run new shapes uncompiled and bias the A/B)
for knob in ("cache_size_limit", "recompile_limit"):
    if hasattr(torch._dynamo.config, knob):
        setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 1024))
SETS = os.environ.get("LEVER_SETS", "none;window;mask_copy;qkv_epilogue;window,mask_copy,qkv_epilogue")
lever_sets = [frozenset() if s.strip() == "none" else parse_levers(s) for s in SETS.split(";") if s.strip()]
COMPILE = os.environ.get("COMPILE", "1") == "1"
N = int(os.environ.get("TOKENS", "64"))
name, cfg = pair_from_argv(sys.argv)
log("loading", name, "lever sets:", [",".join(sorted(s)) or "none" for s in lever_sets], "compile:", COMPILE)
pair = load_pair(cfg)
dev = next(pair.target.parameters()).device
cuda = dev.type == "cuda"
synchronize(dev)
sync = lambda: synchronize(dev)  # noqa: E731
log("loaded on", dev, torch.__version__, torch.cuda.get_device_name(dev) if cuda else "(no capture: a rehearsal)")
vocab = min(pair.target.config.vocab_size, pair.draft.config.vocab_size)
short = list(range(1, 40))
long = [1 + (7 * i) % (vocab - 1) for i in range(400)]


def use(levers: frozenset) -> None:
    for model in (pair.target, pair.draft):
        lean = lean_forward_for(model)
        lean.graphs = GraphedSteps(lean, compile_layers=COMPILE and cuda, levers=levers, capture=cuda)


def steps(prompt: list[int]) -> dict:
    """Median ms of the target's 1-token, 5-token and 8-node tree step after ``prompt``."""
    cm = CachedModel(pair.target)
    n = len(prompt)
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 3, 4])
    depth = torch.tensor([0, 1, 1, 2, 2, 2, 3, 3])
    node = torch.eye(8, dtype=torch.bool)
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            node[i] |= node[p]
    with torch.inference_mode():
        cm.prefill(prompt)
        n0 = cm.length
        tree = torch.tensor(prompt[-8:])
        times = median_times(
            lambda: cm.forward(prompt[-1:], keep=1),
            lambda: cm.forward(prompt[-5:], keep=5),
            lambda: cm.forward_tree(tree, (n0 + depth).to(dev), node, n0),
            reps=10,
            warmup=2,
            sync=sync,
            after=lambda: cm.rollback(n0),
        )
    return {f"{label}@{n}": 1e3 * t for label, t in zip(("1 tok", "5 tok", "tree 8"), times)}


def decode(method: str, params: dict, batch: int = 0) -> tuple[list, float]:
    dec = build_decoder(
        method, pair.target, pair.draft if method != "ar" else None, assets=pair.assets, temperature=0.0, **params
    )
    out: list = []
    if batch:
        prompts = [short[i:] + short[:i] for i in range(batch)]

        def run() -> None:
            gens = [make_generator(i, dev) for i in range(batch)]
            got = BatchedDecoder(dec, batch).generate(prompts, max_new_tokens=N, eos_token_ids=[], generators=gens)
            out.append([g.tokens for g in got])

        s = timed(run, sync)
        return out[-1], batch * N / s

    s = timed(lambda: out.append(dec.generate(short, max_new_tokens=N, eos_token_ids=[]).tokens), sync)
    return out[-1], N / s


base: dict = {}
for levers in lever_sets:
    tag = ",".join(sorted(levers)) or "none"
    use(levers)
    row = {**steps(short), **steps(long)}
    log(f"[{tag}] steps (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()))
    for label, method, params, batch in (
        ("ar", "ar", {}, 0),
        ("specinfer", "specinfer", {"k_config": [2, 2, 1]}, 0),
        ("ar batch 8", "ar", {}, 8),
    ):
        tokens, tps = decode(method, params, batch)
        same = "" if label not in base else f"; tokens equal to levers off: {tokens == base[label]}"
        base.setdefault(label, tokens)
        row[label] = tps
        log(f"[{tag}] {label}: {tps:.1f} tokens/s{same}")
    graphs = lean_forward_for(pair.target).graphs
    log(
        f"RESULT [{tag}] " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()) + f"; target graphs {len(graphs.graphs)}"
    )
for model in (pair.target, pair.draft):
    lean_forward_for(model).graphs = None
log("done")
