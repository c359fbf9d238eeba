"""The bench's tables as Markdown: benchmarks/<name>.md (the rows, step costs, roofline, energy) and
benchmarks/<name>-batching.md (the batch-size table)."""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.bench.batched import BatchRow
from pipeline.bench.plan import Row
from pipeline.decoding.fast_forward import lean_forward_for, unsupported_reason


def engine_info(pair) -> str:
    """Which forward our decoders use for each model (lean or transformers'), its dtype and kernel path."""
    parts = []
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        if model is None:
            continue
        lean = lean_forward_for(model)
        dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        if lean is None:
            parts.append(
                f"{role} {dtype} through transformers' forward "
                f"({unsupported_reason(model) or 'PIPELINE_LEAN_FORWARD=0'})"
            )
        else:
            parts.append(f"{role} {dtype} through the lean forward, kernels {lean.kernel_path}")
    return "; ".join(parts)


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _gammas(rows: list[Row], cfg: DictConfig) -> str:
    """How the rows' draft lengths were chosen, for the header."""
    chosen: dict[str, int] = {}
    for r in rows:
        if r.impl == "ours" and r.gamma is not None and not r.note:
            chosen.setdefault(r.method, r.gamma)
    if cfg.get("gamma") is not None:
        return f"gamma {cfg.gamma} (every method)"
    if not chosen:
        return "no method with a draft length"
    return (
        "gamma per method (method_params.<method>.gamma, else conf/method/<method>.yaml; gamma=N sets every method's): "
        + ", ".join(f"{m} {g}" for m, g in chosen.items())
    )


def _energy_lines(rows: list[Row], costs: dict[str, Any]) -> list[str]:
    """The energy table (rows with a reading), or one line saying why there is none."""
    meter = costs.get("energy_meter") or {}
    if not meter.get("available"):
        return ["", f"Energy: not measured ({meter.get('reason') or 'energy_meter=none'})."]
    ref = meter.get("reference")
    idle = costs.get("idle_power_w")
    head = (
        f"Energy: meter {meter.get('meter')}; each row's pass over the prompts is one window, "
        "J/token the median over passes; "
        f"idle power {_fmt(idle, 1)} W"
        + (f" (reference {_fmt(costs.get('reference_idle_power_w'), 1)} W)" if ref else "")
        + "; dynamic = less idle power x window time"
        + ("; ours vs reference: ours / reference - 1 per pass, median." if ref else ".")
    )
    lines = [
        "",
        head,
        "",
        "| impl | method | drafter | mode | J/token | dynamic J/token |"
        + (" reference J/token | ours vs reference |" if ref else ""),
        "|---|---|---|---|---|---|" + ("---|---|" if ref else ""),
    ]
    for r in rows:
        if r.note or r.j_per_token is None and r.reference_j_per_token is None:
            continue
        vs_ref = None if r.energy_vs_reference is None else 100 * r.energy_vs_reference
        tail = f" {_fmt(r.reference_j_per_token, 4)} | {_fmt(vs_ref, 2)}% |" if ref else ""
        lines.append(
            f"| {r.impl} | {r.method} | {_fmt(r.drafter)} | {r.mode} | {_fmt(r.j_per_token, 4)} | "
            f"{_fmt(r.dynamic_j_per_token, 4)} |" + tail
        )
    return lines


ORACLE_TEXT = (
    "Draft lengths: each chain row at its fixed gamma (draft_stop none) beside the adaptive policies of "
    "draft_stops (docs/ALGORITHMS.md 21), and the hindsight oracle of the fixed row (docs/measurement.md): per "
    "request, from its recorded iterations (drafts put to the target g, drafts accepted n = emitted - 1), the fixed "
    "gamma' in 1..gamma with the highest mean(min(n, gamma') + 1) / (gamma' (c + v) + 1), c the row's measured cost "
    "ratio, v = (t_verify(gamma+1) / t_ar - 1) / gamma what each verified draft adds to the pass (measured, linear in "
    "the rows); "
    "oracle bound = its mean over requests, hindsight at gamma = the same arithmetic at the row's own gamma. "
    "Assumption: a shorter chain is a prefix of the recorded one whose drafts meet the same verdicts (token "
    "verification of prefix drafts; for block, hsd and mtad an approximation), and no gamma' above the recorded "
    "gamma is considered (nothing was observed past it)."
)


def _draft_length_lines(rows: list[Row]) -> list[str]:
    """Fixed gamma, the adaptive rows and the hindsight oracle (chain rows only; none when no chain row ran)."""
    chain = [r for r in rows if r.impl == "ours" and not r.note and (r.draft_stop or r.oracle_bound is not None)]
    if not chain:
        return []
    lines = [
        "",
        ORACLE_TEXT,
        "",
        "| method | drafter | mode | draft_stop | gamma (most) | tokens/s | tokens/step | drafts/iteration "
        "| speedup vs our ar | oracle gamma x requests | hindsight at gamma | oracle bound |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(chain, key=lambda r: (r.mode, r.method, str(r.drafter), r.draft_stop or "")):
        lines.append(
            f"| {r.method} | {_fmt(r.drafter)} | {r.mode} | {r.draft_stop or 'none'} | {_fmt(r.gamma)} | "
            f"{_fmt(r.tokens_per_s)} | {_fmt(r.tokens_per_step)} | {_fmt(r.mean_drafted)} | {_fmt(r.speedup)} | "
            f"{_fmt(r.oracle_gamma)} | {_fmt(r.hindsight_fixed)} | {_fmt(r.oracle_bound)} |"
        )
    return lines


def to_markdown(
    name: str, rows: list[Row], costs: dict[str, Any], info: dict[str, Any], command: str, cfg: DictConfig
) -> str:
    verify = sorted((int(k[len("t_verify_g") : -3]), v) for k, v in costs.items() if k.startswith("t_verify_g"))
    lines = [
        f"# Benchmark `{name}`",
        "",
        f"Command: `{command}`",
        "",
        f"Pair `{cfg.pair.name}`, {_gammas(rows, cfg)}; {len(cfg.prompts)} prompts x {cfg.max_new_tokens} new tokens"
        f"{' (EOS ignored)' if cfg.ignore_eos else ''}, {cfg.repeats} timed passes after {cfg.warmup} warm-up; "
        f"sampling T={cfg.sampling.temperature}, top-k {cfg.sampling.top_k}, top-p {cfg.sampling.top_p}. "
        "tokens/s: median over passes; ratio, speedup and efficiency: medians of per-pass values (every pass "
        "runs all rows back to back after measuring the step costs).",
        "",
        f"Step costs (medians over passes, batch 1, KV cache): t_ar {costs['t_ar_ms']:.2f} ms, "
        + ", ".join(f"t_verify({g}+1) {v:.2f} ms" for g, v in verify)
        + "; one draft token: "
        + ", ".join(
            f"{k[8:-3]} {v:.3f} ms (c {costs['c_' + k[8:-3]]:.3f})"
            for k, v in costs.items()
            if k.startswith("t_draft_") and k != "t_draft_ms"
        )
        + "; each method's own proposal per draft token (its row's t_draft and c): "
        + ", ".join(
            f"{k[10:-3].replace('_', ' with ', 1)} {v:.3f} ms" for k, v in costs.items() if k.startswith("t_propose_")
        )
        + ". "
        "bound (measured costs) = tokens/step x t_ar / (gamma t_draft + t_verify); bound (ideal) = "
        "(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)); "
        "efficiency = speedup vs our ar / bound (measured costs); "
        "overhead/step = share of our decode time spent outside the two models' forward passes.",
        "",
        f"Our engine: {info.get('engine', '')}.",
        "",
        f"Roofline: copy bandwidth {costs['bandwidth_gb_s']:.1f} GB/s (a {costs['target_mb']:.0f} MB copy, "
        f"read + write); a target step streams {costs['target_mb']:.0f} MB: floor {costs['floor_target_ms']:.2f} ms, "
        f"t_ar / floor {costs['ar_over_floor']:.2f}, "
        + ", ".join(f"t_verify({g}+1) / t_ar {v / costs['t_ar_ms']:.2f}" for g, v in verify)
        + (
            f"; the draft streams {costs['draft_mb']:.1f} MB: floor {costs['floor_draft_ms']:.3f} ms, "
            f"t_draft / floor {costs['draft_over_floor']:.1f}"
            if "draft_mb" in costs
            else ""
        )
        + ".",
        "",
        "| impl | method | drafter | gamma | mode | tokens/s | ratio to transformers "
        "| identical to transformers greedy | tokens/step | alpha | c | bound (measured costs) | bound (ideal) "
        "| speedup vs our ar | efficiency | overhead/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for r in rows:
        if r.note:
            notes.append(f"- {r.impl} {r.method} ({r.drafter}, {r.mode}) not run: {r.note}")
            continue
        if r.draft_stop is not None:
            continue  # the draft-length table below
        overhead = None if r.overhead_per_step is None else 100 * r.overhead_per_step
        lines.append(
            f"| {r.impl} | {r.method} | {_fmt(r.drafter)} | {_fmt(r.gamma)} | {r.mode} | {_fmt(r.tokens_per_s)} | "
            f"{_fmt(r.ratio_to_transformers)} | "
            f"{_fmt(r.identical_to_transformers)} | {_fmt(r.tokens_per_step)} | {_fmt(r.alpha, 3)} | {_fmt(r.c, 3)} | "
            f"{_fmt(r.bound)} | {_fmt(r.bound_ideal)} | {_fmt(r.speedup)} | {_fmt(r.efficiency)} | "
            f"{_fmt(overhead, 1)}{'%' if overhead is not None else ''} |"
        )
    lines += _draft_length_lines(rows)
    lines += _energy_lines(rows, costs)
    if notes:
        lines += ["", "Rows not run:", *sorted(set(notes))]
    lines += ["", "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items() if k != "engine"), ""]
    return "\n".join(lines)


def batch_markdown(name: str, rows: list[BatchRow], cfg: DictConfig, command: str, info: dict[str, Any]) -> str:
    """The batch-size table as benchmarks/<name>-batching.md."""
    n = int(cfg.get("batch_requests") or 2 * max(int(b) for b in cfg.batch_sizes))
    lines = [
        f"# Benchmark `{name}`: batch sizes",
        "",
        f"Command: `{command}`",
        "",
        f"Pair `{cfg.pair.name}`; {n} requests ({len(cfg.prompts)} prompts cycled) x {cfg.max_new_tokens} new tokens"
        f"{' (EOS ignored)' if cfg.ignore_eos else ''} per pass, {cfg.repeats} timed passes after {cfg.warmup} "
        f"warm-up; sampling {OmegaConf.to_container(cfg.sampling, resolve=True)}; "
        f"method parameters {OmegaConf.to_container(cfg.method_params, resolve=True)}. "
        "Ours: continuous batching (pipeline/decoding/batched.py; batch 1: Decoder.generate per request); "
        "transformers: batched generate() on left-padded static batches, the same dtype. "
        "tokens/s: output tokens over all requests / the pass's wall time, median over passes; "
        "speedup vs ar: over our ar at the same batch size.",
        "",
        "| impl | method | mode | batch | tokens/s | x batch 1 | speedup vs ar | x transformers | TPOT p50 / p90 ms | "
        "latency p50 / p90 / p99 s | tokens/step per request | J/token (dynamic) | reference J/token |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    f = lambda v, d=2: "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{d}f}"  # noqa: E731
    notes = []
    for r in rows:
        if r.note:
            notes.append(f"- {r.method} at batch {r.batch_size} ({r.mode}) not run: {r.note}")
            continue
        lines.append(
            f"| {r.impl} | {r.method} | {r.mode} | {r.batch_size} | {f(r.tokens_per_s)} | {f(r.x_batch1)} | "
            f"{f(r.speedup_vs_ar)} | {f(r.x_transformers)} | {f(r.tpot_ms_p50, 1)} / {f(r.tpot_ms_p90, 1)} | "
            f"{f(r.latency_s_p50)} / {f(r.latency_s_p90)} / {f(r.latency_s_p99)} | {f(r.accepted_per_step)} | "
            f"{f(r.j_per_token, 3)} ({f(r.dynamic_j_per_token, 3)}) | {f(r.reference_j_per_token, 3)} |"
        )
    if notes:
        lines += ["", "Rows not run:", *sorted(set(notes))]
    lines += ["", "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items() if k != "engine"), ""]
    return "\n".join(lines)
