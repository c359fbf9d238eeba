"""``python -m pipeline.bench.profile``: where one decoding step's time goes, under ``torch.profiler``.

    python -m pipeline.bench.profile pair=random-llama3-8b-1b gamma=4 name=gpu-random-llama3-8b-1b

Takes the bench's configuration (``conf/bench.yaml``: pair, gamma, probe_reps, name, out_dir) and profiles, after
the first prompt, the steps behind the bench's costs: the target's one-token step (t_ar), its (gamma + 1)-token
verification forward (t_verify) and the draft's one-token step (t_draft), each through the engine's forward
(``CachedModel``: the lean forward where the model allows) and, for the target's step, through transformers' own
forward too, and on a GPU each engine step again replayed as a CUDA graph (``PIPELINE_CUDA_GRAPHS``). Per step it
reports the synchronised wall time (median), the device's kernel time and the host's time per step as the profiler
saw them (the kernels' own rows, as the profiler's table totals them), the kernel launches per step, and the device's
busy fraction (kernel time over wall time): a fraction well under 1 says the step is bound by the host's launches
(the levers: CUDA graphs, ``torch.compile``), not by the weights' bytes. The ten ops with the most device (else host)
time follow. On a CPU the device columns are empty and the host's time is the step.

Writes ``<out_dir>/<name>-profile.md`` and ``.json`` (name default: ``<pair>-<device>``).
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any, Callable

import hydra
import torch
from omegaconf import DictConfig
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from pipeline.bench.plan import REPO_ROOT
from pipeline.decoding.cuda_graphs import GraphedSteps
from pipeline.decoding.fast_forward import lean_forward_for
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.timing import median_times
from pipeline.device import machine_info, synchronize
from pipeline.models import PairSpec, load_pair
from pipeline.prompts import encode_prompt

LAUNCH_PREFIXES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "hipLaunchKernel")


def _device_us(evt: Any) -> float:
    """An averaged event's own device time in microseconds (the attribute's name changed across torch versions)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(evt, name, None)
        if value is not None:
            return float(value)
    return 0.0


def profile_step(
    step: Callable[[], object], after: Callable[[], object], device: torch.device, reps: int
) -> dict[str, Any]:
    """One step's wall time (median of ``reps``, synchronised) and, over ``reps`` profiled calls, its device
    kernel time, host time, kernel launches per call and the ops with the most time."""
    sync = lambda: synchronize(device)  # noqa: E731
    (wall,) = median_times(step, reps=reps, warmup=2, sync=sync, after=after)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(reps):
            step()
            sync()
            after()
    averages = prof.key_averages()
    # the kernels' own rows (as the profiler's table totals them): a host op's row repeats its kernels' device time
    kernels = [e for e in averages if e.device_type != DeviceType.CPU and not getattr(e, "is_user_annotation", False)]
    ops = [e for e in averages if e.device_type == DeviceType.CPU]
    device_us = sum(_device_us(e) for e in kernels)
    host_us = sum(float(e.self_cpu_time_total) for e in ops)
    launches = sum(int(e.count) for e in ops if e.key.startswith(LAUNCH_PREFIXES))
    by = _device_us if device_us > 0 else (lambda e: float(e.self_cpu_time_total))
    top = sorted(ops, key=by, reverse=True)[:10]
    return {
        "wall_ms": 1e3 * wall,
        "device_ms": device_us / 1e3 / reps if device_us > 0 else None,
        "host_ms": host_us / 1e3 / reps,
        "launches": launches / reps if device.type == "cuda" else None,
        "busy": (device_us / 1e3 / reps) / (1e3 * wall) if device_us > 0 else None,
        "top": [
            {
                "op": e.key[:80],
                "calls": int(e.count) / reps,
                "device_ms": _device_us(e) / 1e3 / reps,
                "host_ms": float(e.self_cpu_time_total) / 1e3 / reps,
            }
            for e in top
        ],
    }


def run(cfg: DictConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """The profiles of the pair's steps (step name -> profile_step's dict) and the machine's facts."""
    spec = PairSpec.from_config(cfg.pair)
    pair = load_pair(spec)
    device = next(pair.target.parameters()).device
    prompt = encode_prompt(pair.tokenizer, cfg.prompts[0], spec.chat)
    gamma = int(cfg.gamma or 4)
    reps = int(cfg.probe_reps)
    steps: dict[str, Any] = {}
    # (label, model, rows, forward): "lean" (the engine's), "transformers" (model(...)), "graph" (the engine's step
    # replayed as a CUDA graph, decoding/cuda_graphs.py)
    cases: list[tuple[str, Any, int, str]] = [
        ("target 1 token", pair.target, 1, "lean"),
        (f"target {gamma + 1} tokens", pair.target, gamma + 1, "lean"),
        ("target 1 token, transformers forward", pair.target, 1, "transformers"),
    ]
    if pair.draft is not None:
        cases.append(("draft 1 token", pair.draft, 1, "lean"))
    if device.type == "cuda":
        cases += [(label + ", CUDA graph", model, n, "graph") for label, model, n, how in cases if how == "lean"]
    with torch.inference_mode():
        for label, model, n, how in cases:
            forward = lean_forward_for(model)
            eager = forward.graphs if forward is not None else None
            if forward is not None:
                forward.graphs = GraphedSteps(forward) if how == "graph" else None
            cm = CachedModel(model, lean=how != "transformers")
            cm.prefill(prompt)
            length = cm.length
            tokens = prompt[-n:]

            def step(cm: CachedModel = cm, tokens: list[int] = tokens, n: int = n) -> object:
                return cm.forward(tokens, keep=n)

            def after(cm: CachedModel = cm, length: int = length) -> None:
                cm.rollback(length)

            steps[label] = profile_step(step, after, device, reps)
            steps[label]["path"] = "transformers" if cm.lean is None else "CUDA graph" if how == "graph" else "lean"
            if forward is not None:
                forward.graphs = eager
            del cm
    info = machine_info(device)
    info.update(pair.precision())
    return steps, info


def _fmt(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def to_markdown(name: str, steps: dict[str, Any], info: dict[str, Any], command: str) -> str:
    lines = [
        f"# Step profile: {name}",
        "",
        f"`{command}`",
        "",
        "Machine: " + ", ".join(f"{k}={v}" for k, v in info.items()),
        "",
        "| step | forward | wall ms | device ms | host ms | launches | device busy |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, s in steps.items():
        lines.append(
            f"| {label} | {s['path']} | {_fmt(s['wall_ms'])} | {_fmt(s['device_ms'])} | {_fmt(s['host_ms'])} "
            f"| {_fmt(s['launches'], 0)} | {_fmt(s['busy'], 2)} |"
        )
    for label, s in steps.items():
        lines += ["", f"## {label}: the ten ops with the most time", "", "| op | calls/step | device ms | host ms |"]
        lines.append("|---|---|---|---|")
        for t in s["top"]:
            lines.append(f"| `{t['op']}` | {_fmt(t['calls'], 1)} | {_fmt(t['device_ms'])} | {_fmt(t['host_ms'])} |")
    return "\n".join(lines) + "\n"


@hydra.main(version_base="1.3", config_path="../../conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    steps, info = run(cfg)
    name = cfg.name or f"{cfg.pair.name}-{torch.device(info.get('device', 'cpu')).type}"
    command = "python -m pipeline.bench.profile " + " ".join(sys.argv[1:])
    out = REPO_ROOT / cfg.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}-profile.json").write_text(
        json.dumps({"command": command, "machine": info, "steps": steps}, indent=1)
    )
    md = to_markdown(name, steps, info, command)
    (out / f"{name}-profile.md").write_text(md)
    print(md)
    walls = [s["wall_ms"] for s in steps.values()]
    print(f"median step wall ms over the profiled steps: {statistics.median(walls):.3f}")


if __name__ == "__main__":
    main()
