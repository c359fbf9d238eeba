"""The graphed steps on a GPU, printed as it goes: step costs against the copy-bandwidth floor (eager, CUDA graphs,
CUDA graphs over compiled layers), where each decoded token's time goes, and the default decoders against
transformers' ``generate()`` (ar, spd, block at batch 1; specinfer's tree steps; ar and spd at batch 8), with the
graphed outputs checked against the eager engine's.

    python jobs/gpu_graphs.py [PAIR] [TOKENIZER_DIR] [model overrides, e.g. target.config.num_hidden_layers=2]

(the command line as jobs/gpu_common.py reads it; on the GPU machine: PYTHONPATH=$PWD HF_HUB_OFFLINE=1, the tokenizer
unpacked from .kit/tokenizer.tgz; QUICK=1 skips the eager tree and the uncompiled graphs, TOKENS=64 new tokens). On a
CPU it runs the eager rows only (a rehearsal of the script with a shrunk pair).
"""

import os
import sys
import time

import torch
from gpu_common import log, pair_from_argv
from gpu_common import timed as timed_on

from pipeline.decoding import build_decoder
from pipeline.decoding.batched import BatchedDecoder
from pipeline.decoding.cuda_graphs import GraphedSteps
from pipeline.decoding.fast_forward import lean_forward_for
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.timing import median_times
from pipeline.decoding.warping import make_generator
from pipeline.device import synchronize
from pipeline.models import load_pair

name, cfg = pair_from_argv(sys.argv)
N = int(os.environ.get("TOKENS", "64"))
log("loading", name)
pair = load_pair(cfg)
dev = next(pair.target.parameters()).device
cuda = dev.type == "cuda"
synchronize(dev)
sync = lambda: synchronize(dev)  # noqa: E731
log("loaded on", dev, torch.__version__, torch.cuda.get_device_name(dev) if cuda else "")
prompt = list(range(1, 40))


def floor_ms(model) -> float:
    """The weights' bytes over the device's copy bandwidth (a 2 GB device-to-device copy), in ms."""
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if not hasattr(floor_ms, "bw"):
        a = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
        b = torch.empty_like(a)
        b.copy_(a)
        sync()
        t = time.perf_counter()
        for _ in range(5):
            b.copy_(a)
        sync()
        floor_ms.bw = 2 * a.numel() * 5 / (time.perf_counter() - t)  # read + write bytes per second
        log(f"copy bandwidth {floor_ms.bw / 1e12:.2f} TB/s (read + write of a 2 GiB buffer)")
        del a, b
    return 1e3 * nbytes / floor_ms.bw


def set_graphs(on: bool, compiled: bool = True) -> None:
    for model in (pair.target, pair.draft):
        lean = lean_forward_for(model)
        if lean is not None:
            lean.graphs = GraphedSteps(lean, compile_layers=compiled) if (on and cuda) else None


def step_costs(label: str, model, rows=(1, 5)) -> dict:
    cm = CachedModel(model)
    with torch.inference_mode():
        cm.prefill(prompt)
        n0 = cm.length
        fns = [lambda n=n: cm.forward(prompt[-n:], keep=n) for n in rows]
        times = median_times(*fns, reps=20, warmup=3, sync=sync, after=lambda: cm.rollback(n0))
    out = {n: 1e3 * t for n, t in zip(rows, times)}
    fl = floor_ms(model) if cuda else float("nan")
    log(
        f"{label}: " + ", ".join(f"{n} row(s) {t:.2f} ms" for n, t in out.items()) + f"; floor {fl:.2f} ms, "
        f"1 row = {out[rows[0]] / fl:.2f}x floor"
    )
    return out


def timed(fn, reps=2):
    return timed_on(fn, sync, reps)


def decode(method, params, label, check=None):
    dec = build_decoder(
        method, pair.target, pair.draft if method != "ar" else None, assets=pair.assets, temperature=0.0, **params
    )
    gens = []
    lean = lean_forward_for(pair.target)
    s = timed(
        lambda: gens.append(dec.generate(prompt, max_new_tokens=N, eos_token_ids=[], generator=make_generator(0, dev)))
    )
    g = gens[-1]
    caps = lean.graphs.captures if lean is not None and lean.graphs is not None else 0
    log(
        f"{label} {method}: {len(g.tokens) / s:.1f} tokens/s ({1e3 * s / len(g.tokens):.2f} ms/token), "
        f"{g.steps} target steps, graph captures so far {caps}"
    )
    if check is not None:
        same = sum(a == b for a, b in zip(check, g.tokens))
        log(f"  tokens equal to the eager engine's: {same}/{len(g.tokens)} (random bf16 logits have near-ties)")
    return g.tokens, len(g.tokens) / s


def batched(method, params, label, b=8, requests=8):
    dec = build_decoder(
        method, pair.target, pair.draft if method != "ar" else None, assets=pair.assets, temperature=0.0, **params
    )
    prompts = [prompt[i:] + prompt[:i] for i in range(requests)]
    gens = [make_generator(i, dev) for i in range(requests)]
    out = []
    s = timed(
        lambda: out.append(
            BatchedDecoder(dec, b).generate(prompts, max_new_tokens=N, eos_token_ids=[], generators=gens)
        )
    )
    tokens = sum(len(g.tokens) for g in out[-1])
    log(f"{label} {method} batch {b}: {tokens / s:.1f} tokens/s over {requests} requests")
    return [g.tokens for g in out[-1]], tokens / s


ids = torch.tensor([prompt], device=dev)
kw = dict(max_new_tokens=N, min_new_tokens=N, do_sample=False, pad_token_id=0)
with torch.inference_mode():
    s = timed(lambda: pair.target.generate(ids, **kw))
hf = N / s
log(f"transformers generate greedy: {hf:.1f} tokens/s ({1e3 * s / N:.2f} ms/token)")

rows = {}
set_graphs(False)
rows["eager"] = (step_costs("target eager", pair.target), step_costs("draft eager", pair.draft, rows=(1,)))
QUICK = os.environ.get("QUICK") == "1"  # the eager and compiled rows only (no eager tree, no uncompiled graphs)
eager_ar, eager_tps = decode("ar", {}, "eager")
eager_tree = None if QUICK else decode("specinfer", {"k_config": [2, 2, 1]}, "eager")[0]
eager_b, eager_btps = batched("ar", {}, "eager")
if cuda:
    for compiled in (True,) if QUICK else (False, True):
        tag = "graphs+compile" if compiled else "graphs"
        set_graphs(True, compiled)
        t0 = time.time()
        rows[tag] = (step_costs(f"target {tag}", pair.target), step_costs(f"draft {tag}", pair.draft, rows=(1,)))
        lean = lean_forward_for(pair.target)
        log(f"  ({tag}: steps captured in {time.time() - t0:.1f} s; compile error: {lean.graphs.compile_error})")
        _, tps = decode("ar", {}, tag, check=eager_ar)
        one = rows[tag][0][1]
        log(
            f"  ar at {1e3 / tps:.2f} ms/token against a {one:.2f} ms graphed step: "
            f"{1e3 / tps - one:.2f} ms outside it; "
            f"{tps / hf:.2f}x transformers generate()"
        )
        decode("specinfer", {"k_config": [2, 2, 1]}, tag, check=eager_tree)
        got, btps = batched("ar", {}, tag)
        same = sum(a == b for a, b in zip(got, eager_b))
        log(f"  batch 8: {btps / eager_btps:.2f}x eager batch 8; requests equal to eager: {same}/{len(got)}")
    set_graphs(False)
    # the defaults, as a user gets them (graphs and compiled layers on)
    for model in (pair.target, pair.draft):
        lean = lean_forward_for(model)
        lean.graphs = GraphedSteps(lean)
    _, tps = decode("ar", {}, "default")
    for method in ("spd", "block"):
        decode(method, {"gamma": 4}, "default")
    batched("spd", {"gamma": 4}, "default")
    log(
        f"RESULT default ar {tps:.1f} tokens/s = {tps / hf:.2f}x transformers generate() {hf:.1f}; "
        f"eager ar {eager_tps:.1f}"
    )
log("done")
