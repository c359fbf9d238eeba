"""A short, printed-as-it-goes check of the engine's step costs and decode speed on one pair (the first thing to run
on a device whose bench steps ran out of time): load times, t_ar / t_verify of the lean and transformers forwards,
the draft's step, our ar / spd against transformers generate(), and NVML against Zeus over one decode window.
    python jobs/gpu_quick.py [PAIR] [TOKENIZER_DIR] [model overrides, e.g. target.config.num_hidden_layers=2]
(the command line as jobs/gpu_common.py reads it; on the GPU machine: PYTHONPATH=$PWD HF_HUB_OFFLINE=1, the tokenizer
unpacked from .kit/tokenizer.tgz; the kit's wheels installed for the Zeus reading, see jobs/gpu_session.sh)
"""

import sys

import torch
from gpu_common import log, pair_from_argv, timed

from pipeline.decoding import build_decoder
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.timing import median_times
from pipeline.decoding.warping import make_generator
from pipeline.device import synchronize
from pipeline.models import load_pair

name, cfg = pair_from_argv(sys.argv)
log("loading", name)
pair = load_pair(cfg)
dev = next(pair.target.parameters()).device
synchronize(dev)
log("loaded on", dev, f"{torch.cuda.memory_allocated() / 1e9:.1f} GB" if dev.type == "cuda" else "")
sync = lambda: synchronize(dev)  # noqa: E731
prompt = list(range(1, 40))


def step_costs(label: str, model, lean: bool = True) -> None:
    """The median one-token and five-token forward after the prompt, printed."""
    cm = CachedModel(model, lean=lean)
    with torch.inference_mode():
        cm.prefill(prompt)
        n0 = cm.length
        one, five = median_times(
            lambda: cm.forward(prompt[-1:], keep=1),
            lambda: cm.forward(prompt[-5:], keep=5),
            reps=10,
            warmup=2,
            sync=sync,
            after=lambda: cm.rollback(n0),
        )
    log(f"{label}: 1 token {one * 1e3:.2f} ms, 5 tokens {five * 1e3:.2f} ms")


step_costs("target lean", pair.target)
step_costs("target transformers", pair.target, lean=False)
step_costs("draft lean", pair.draft)
N = 32


def timed_(fn, reps=2):
    return timed(fn, sync, reps)


ids = torch.tensor([prompt], device=dev)
kw = dict(max_new_tokens=N, min_new_tokens=N, do_sample=False, pad_token_id=0)
with torch.inference_mode():
    s = timed_(lambda: pair.target.generate(ids, **kw))
log(f"transformers generate greedy: {N / s:.1f} tokens/s ({1e3 * s / N:.2f} ms/token)")
with torch.inference_mode():
    s = timed_(lambda: pair.target.generate(ids, assistant_model=pair.draft, **kw))
log(f"transformers assisted greedy: {N / s:.1f} tokens/s")
for method, params in (("ar", {}), ("spd", {"gamma": 4}), ("block", {"gamma": 4})):
    dec = build_decoder(
        method, pair.target, pair.draft if method != "ar" else None, assets=pair.assets, temperature=0.0, **params
    )
    gens = []
    s = timed_(
        lambda: gens.append(dec.generate(prompt, max_new_tokens=N, eos_token_ids=[], generator=make_generator(0, dev)))
    )
    g = gens[-1]
    log(f"ours {method} greedy: {N / s:.1f} tokens/s, {len(g.tokens)} tokens in {g.steps} target steps")
if dev.type == "cuda":  # the same steps and decoders with the short steps replayed as CUDA graphs
    from pipeline.decoding.cuda_graphs import GraphedSteps
    from pipeline.decoding.fast_forward import lean_forward_for

    for model in (pair.target, pair.draft):
        lean_forward_for(model).graphs = GraphedSteps(lean_forward_for(model))
    step_costs("target graphed", pair.target)
    step_costs("draft graphed", pair.draft)
    for method, params in (("ar", {}), ("spd", {"gamma": 4})):
        dec = build_decoder(
            method, pair.target, pair.draft if method != "ar" else None, assets=pair.assets, temperature=0.0, **params
        )
        gens = []
        s = timed_(
            lambda: gens.append(
                dec.generate(prompt, max_new_tokens=N, eos_token_ids=[], generator=make_generator(0, dev))
            )
        )
        log(f"ours {method} greedy, CUDA graphs: {N / s:.1f} tokens/s, {len(gens[-1].tokens)} tokens")
    for model in (pair.target, pair.draft):
        lean_forward_for(model).graphs = None

if dev.type == "cuda":
    from pipeline.measure.energy import energy_summary, make_energy_meter

    meter = make_energy_meter(dev, "nvml+zeus")
    log("meter", meter.info())
    idle = meter.measure_idle(3.0)
    log("idle", idle.to_dict())
    dec = build_decoder("ar", pair.target, None, temperature=0.0)
    for rep in range(2):
        sync()
        meter.start()
        g = dec.generate(prompt, max_new_tokens=4 * N, eos_token_ids=[], generator=make_generator(0, dev))
        sync()
        log("ar window", energy_summary(meter.stop(), idle, len(g.tokens)))
    from torch.profiler import ProfilerActivity, profile

    cm = CachedModel(pair.target)
    with torch.inference_mode():
        cm.prefill(prompt)
        n0 = cm.length
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                cm.forward(prompt[-1:], keep=1)
                sync()
                cm.rollback(n0)
    av = prof.key_averages()
    from torch.autograd import DeviceType

    # the kernels' own rows, as the profiler's table totals them (a host op's row repeats its kernels' time)
    dev_us = sum(getattr(e, "self_device_time_total", 0) or 0 for e in av if e.device_type != DeviceType.CPU) / 5
    launches = sum(e.count for e in av if e.key.startswith(("cudaLaunchKernel", "cuLaunchKernel"))) / 5
    log(f"profiled target step: kernels {dev_us / 1e3:.2f} ms/step, {launches:.0f} launches/step")
    print(av.table(sort_by="self_cpu_time_total", row_limit=15), flush=True)
log("done")
