"""``python -m pipeline.bench ...``: the bench's command line (the package docstring describes the bench)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from pipeline.bench.batched import BatchBench
from pipeline.bench.plan import REPO_ROOT, bench_workload, check_settings
from pipeline.bench.report import batch_markdown, engine_info, to_markdown
from pipeline.bench.runners import Bench
from pipeline.bench.serving import ServingBench, serving_markdown
from pipeline.device import machine_info
from pipeline.models import ModelNotAvailableError

# the engine's switches, recorded in the command line of a result
ENV_SWITCHES = (
    "PIPELINE_LEAN_FORWARD",
    "PIPELINE_FAST_MATMUL",
    "PIPELINE_CPU_BF16",
    "PIPELINE_BF16_KERNELS",
    "PIPELINE_CUDA_GRAPHS",
)


def _command() -> str:
    """The command line of a result, with the engine's switches that were set."""
    env = " ".join(f"{k}={os.environ[k]}" for k in ENV_SWITCHES if k in os.environ)
    return (env + " " if env else "") + "python -m pipeline.bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])


@hydra.main(version_base="1.3", config_path="../../conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    try:
        check_settings(cfg)
        if cfg.threads:
            torch.set_num_threads(int(cfg.threads))
        bench = Bench(cfg)
    except (ValueError, ModelNotAvailableError) as err:  # bad input, or a model this machine cannot load: one line
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    name = cfg.name or f"{cfg.pair.name}-{bench.device.type}"
    if not bench_workload(cfg).offline:
        main_serving(cfg, bench, name)
        return
    if cfg.get("batch_sizes"):
        main_batched(cfg, bench, name)
        return
    rows, costs = bench.run()
    bench.meter.close()
    _refuse_if_nothing_ran(rows, REPO_ROOT / cfg.out_dir / f"{name}.md")
    info = machine_info(bench.device)
    info.update(bench.pair.precision())
    info["engine"] = engine_info(bench.pair)
    command = _command()
    out = REPO_ROOT / cfg.out_dir
    out.mkdir(parents=True, exist_ok=True)
    # the measurements first: a table that cannot be drawn must not lose what the passes measured
    payload = [asdict(r) for r in rows]
    (out / f"{name}.json").write_text(json.dumps(payload, indent=1))
    (out / f"{name}.meta.json").write_text(
        json.dumps(
            {"command": command, "costs": costs, "machine": info, "config": OmegaConf.to_container(cfg, resolve=True)},
            indent=1,
        )
    )
    md = to_markdown(name, rows, costs, info, command, cfg)
    (out / f"{name}.md").write_text(md)
    print(md)


def _refuse_if_nothing_ran(rows: list, out: Path) -> None:
    """A bench whose every row was refused measured nothing: exit 2 with the reasons, and leave an earlier table
    of the same name (``out``) as it was."""
    if any(getattr(r, "tokens_per_s", None) is not None for r in rows):
        return
    reasons = sorted({str(r.note) for r in rows if getattr(r, "note", None)})
    print(
        f"error: every row of the bench was refused, nothing was measured and {out} was left as it was: "
        + ("; ".join(reasons[:5]) if reasons else "no row ran")
        + " (choose methods, drafters and batch sizes that can run on this pair)",
        file=sys.stderr,
    )
    sys.exit(2)


def main_batched(cfg: DictConfig, bench: Bench, name: str) -> None:
    """``batch_sizes=[...]``: the batch-size table (``pipeline.bench.batched``) to
    benchmarks/<name>-batching.md|json."""
    rows = BatchBench(bench, cfg).run()
    bench.meter.close()
    _refuse_if_nothing_ran(rows, REPO_ROOT / cfg.out_dir / f"{name}-batching.md")
    info = machine_info(bench.device)
    info.update(bench.pair.precision())
    info["energy_meter"] = bench.meter.info().get("meter", "none") if bench.meter.available else "none"
    if bench.idle is not None and bench.idle.available and bench.idle.power_w is not None:
        info["idle_power_w"] = round(bench.idle.power_w, 1)
        if bench.idle.reference_power_w is not None:
            info["reference_idle_power_w"] = round(bench.idle.reference_power_w, 1)
    command = _command()
    md = batch_markdown(name, rows, cfg, command, info)
    out = REPO_ROOT / cfg.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}-batching.md").write_text(md)
    (out / f"{name}-batching.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(md)


def main_serving(cfg: DictConfig, bench: Bench, name: str) -> None:
    """``workload=poisson|closed``: the serving table (``pipeline.bench.serving``) to benchmarks/<name>.md|json."""
    rows = ServingBench(bench, cfg, bench_workload(cfg)).run()
    bench.meter.close()
    _refuse_if_nothing_ran(rows, REPO_ROOT / cfg.out_dir / f"{name}.md")
    info = machine_info(bench.device)
    info.update(bench.pair.precision())
    command = _command()
    out = REPO_ROOT / cfg.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    (out / f"{name}.meta.json").write_text(
        json.dumps({"command": command, "machine": info, "config": OmegaConf.to_container(cfg, resolve=True)}, indent=1)
    )
    md = serving_markdown(name, rows, cfg, command, info)
    (out / f"{name}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
