"""What a sweep's report says beyond its verdicts (issue 44): the machine it ran on, what its measurements predict
for a memory-bound accelerator, the batch crossover, and what the undecided claims would need (the frontier of
verification rules: ``analysis.frontier``).

    c = gpu_cost_ratio("smollm2-offline")           # the pair's bytes ratio: Leviathan's c on a memory-bound device
    provenance_markdown(runs, sweep, command)        # claims.md's header: command, commit, machine, costs, date
    method_paragraphs(runs, samples, c)              # one paragraph per method: ratio to ar, bound, efficiency, limit
    crossover_markdown(runs, samples, c)             # batch 1..B: throughput, latency, acceptance, crossover
    sizing_markdown(table, runs)                     # the prompts an undecided claim needs, and whether it fits 2 hours

The prediction is the arithmetic of ``pipeline.measure.bounds.predicted_speedup``: the iterations each cell recorded
(drafted positions g and emitted tokens per iteration) costed as g c + 1 target steps (v = 0: a verification pass
costs one step whatever its rows, as on a GPU at small batch), c = the draft's weights read per step over the
target's (``step_parameters``, from the models' configs). ar's prediction is 1 (one token per step).
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import yaml

from analysis import batching, schema
from analysis.claims import add_acceptance_columns, add_predicted_speedup
from analysis.claims_spec import INCONCLUSIVE, TOO_FEW
from analysis.runs import REPO_ROOT
from pipeline.measure.bounds import break_even_verify_cost, predicted_speedup, step_parameters, step_seconds

SWEEP_BUDGET_S = 2 * 3600.0  # "fits a 2-hour sweep here"
COPY_MB = 256


# ----------------------------------------------------------------------------------- the pair's bytes ratio


def _config_of(model: Mapping[str, Any], root: Path) -> dict | None:
    """A pair entry's ``config.json``: a folder in the repository, the GGUF conversion's cache, or the HF cache."""
    ident = str(model.get("id") or "")
    local = (root / ident) if ident else None
    if local is not None and (local / "config.json").exists():
        return json.loads((local / "config.json").read_text())
    gguf = model.get("gguf_file")
    if gguf:
        cache = Path(os.environ.get("PIPELINE_CACHE", Path.home() / ".cache" / "pipeline")) / "gguf"
        for folder in sorted(cache.glob(f"{Path(str(gguf)).stem}-*")):
            if (folder / "config.json").exists():
                return json.loads((folder / "config.json").read_text())
    try:
        from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415 - optional

        found = try_to_load_from_cache(ident, "config.json")
    except Exception:  # noqa: BLE001 - no hub client, no cache: the caller says so
        return None
    return json.loads(Path(found).read_text()) if isinstance(found, str) and Path(found).exists() else None


def gpu_cost_ratio(pair: str, root: Path = REPO_ROOT) -> tuple[float, str]:
    """(c, how): the draft's weights read per step over the target's (``step_parameters``; a restricted draft head
    counts its rows), from ``conf/pair/<pair>.yaml`` and the models' configs; (NaN, why) where one is missing."""
    path = root / "conf" / "pair" / f"{pair}.yaml"
    if not path.exists():
        return math.nan, f"no conf/pair/{pair}.yaml"
    spec = yaml.safe_load(path.read_text()) or {}
    if not spec.get("draft"):
        return math.nan, f"pair {pair} has no draft model"
    target, draft = _config_of(spec["target"], root), _config_of(spec["draft"], root)
    if target is None or draft is None:
        return math.nan, f"the {'target' if target is None else 'draft'} model's config.json was not found"
    rows = None
    if spec["draft"].get("restrict_head"):
        head_map = root / str(spec["draft"]["id"]) / "restricted_head_map.json"
        if head_map.exists():
            rows = len(json.loads(head_map.read_text()))
    c = step_parameters(draft, rows) / step_parameters(target)
    return c, (
        f"draft {step_parameters(draft, rows) / 1e6:.1f}M / target {step_parameters(target) / 1e6:.1f}M weights read "
        "per step (same dtype)"
    )


def gpu_step_seconds(pair: str, root: Path = REPO_ROOT) -> float:
    """A plain step of the pair's target on a memory-bound A100 (``bounds.step_seconds``: its bf16 weights read per
    step over the HBM bandwidth); NaN where ``conf/pair/<pair>.yaml`` or the target's config.json is not found."""
    path = root / "conf" / "pair" / f"{pair}.yaml"
    spec = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    target = _config_of(spec["target"], root) if spec.get("target") else None
    return step_seconds(step_parameters(target)) if target else math.nan


def gpu_cost_ratios(runs: pd.DataFrame, given: float | None = None) -> dict[str, float]:
    """c per pair of the sweep: ``given`` for every pair, else each pair's bytes ratio (NaN where unknown)."""
    return {str(p): (float(given) if given is not None else gpu_cost_ratio(str(p))[0]) for p in runs["pair"].unique()}


# ----------------------------------------------------------------------------------- the machine


def cpu_flags_summary() -> str:
    """avx512_bf16, avx2+fma, or neither (what the bf16 kernels run on), with the CPU model and core count."""
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    kind = (
        "AVX512-BF16"
        if "avx512_bf16" in flags
        else "AVX2 + FMA, no AVX512-BF16"
        if {"avx2", "fma"} <= flags
        else "neither AVX512-BF16 nor AVX2 (fp32 fallback)"
    )
    return f"{model}, {os.cpu_count()} cores, {kind}"


def copy_bandwidth_gbs(megabytes: int = COPY_MB, reps: int = 5) -> float:
    """Memory copy bandwidth: the fastest of ``reps`` torch copies of ``megabytes`` MB (read + write, GB/s)."""
    import torch  # noqa: PLC0415 - only when the report measures the machine

    src = torch.empty(megabytes * 2**20, dtype=torch.uint8)
    src.fill_(1)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() / best / 1e9


def num(frame: pd.DataFrame, column: str) -> pd.Series:
    """A column as numbers (NaN where it is missing or not a number)."""
    if column not in frame:
        return pd.Series(math.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[column], errors="coerce").astype(float)


def batch_one(runs: pd.DataFrame) -> pd.DataFrame:
    """The cells decoded one request at a time (no ``batch_size`` column: every cell)."""
    if "batch_size" not in runs or runs.empty:
        return runs
    return runs[pd.to_numeric(runs["batch_size"], errors="coerce").fillna(1) == 1]


def row_costs(runs: pd.DataFrame) -> dict[str, float]:
    """t_ar (median of the batch-1 cells' logged target step) and v (median over the drafting cells: their
    ``row_cost_v``, read off the loop's clock; older cells: (t_verify(g+1) / t_ar - 1) / g at their own gamma)."""
    one = batch_one(runs)
    t_ar = num(one, "t_target_step_ms").dropna()
    out = {"t_ar_ms": float(t_ar.median()) if len(t_ar) else math.nan, "v": math.nan, "v_cells": 0}
    clocked = num(one, "row_cost_v").dropna() if "row_cost_v" in one else pd.Series(dtype=float)
    if len(clocked):  # the loop's own clock: v read off the verify phase against rows
        out.update(v=float(clocked.median()), v_cells=int(len(clocked)))
    elif "t_verify_ms" in one and "gamma" in one:
        g = pd.to_numeric(one["gamma"], errors="coerce")
        v = (pd.to_numeric(one["t_verify_ms"], errors="coerce") / one["t_target_step_ms"] - 1.0) / g
        v = v[np.isfinite(v)]
        out.update(v=float(v.median()) if len(v) else math.nan, v_cells=int(len(v)))
    if "cost_ratio" in one:
        c = pd.to_numeric(one["cost_ratio"], errors="coerce").dropna()
        out["c"] = float(c.median()) if len(c) else math.nan
    return out


def provenance_markdown(
    runs: pd.DataFrame,
    sweep: str,
    command: str,
    *,
    gpu_c: Mapping[str, float] | None = None,
    bandwidth_gbs: float | None = None,
) -> str:
    """claims.md's header: the command, the engine's commit(s), the machine (CPU flags, t_ar, v, copy bandwidth),
    the cells' devices, the date."""
    commits = sorted({str(c)[:12] for c in runs.get("git_commit", pd.Series(dtype=str)).dropna() if c})
    devices = sorted({str(d) for d in runs.get("device", pd.Series(dtype=str)).dropna()})
    costs = row_costs(runs)
    bw = copy_bandwidth_gbs() if bandwidth_gbs is None else bandwidth_gbs
    f = lambda v, d=3: "–" if v is None or not math.isfinite(float(v)) else f"{float(v):.{d}g}"  # noqa: E731
    lines = [
        f"- **command**: `python -m pipeline.sweep sweep={sweep}` (with the store's tracking overrides), then "
        f"`{command}`",
        f"- **engine commit**: {', '.join(commits) or '– (not tagged)'} ({len(runs)} finished cells)",
        f"- **machine** (where this report ran): {cpu_flags_summary()}; copy bandwidth {bw:.1f} GB/s "
        f"(a {COPY_MB} MB torch copy, read + write); cells' device: {', '.join(devices) or '–'}",
        f"- **measured costs** (the decoding loop's own clock over each window, batch 1): t_ar {f(costs['t_ar_ms'])} "
        f"ms (a plain target step at the window's contexts); row cost v = {f(costs['v'], 2)} (what one more drafted "
        f"position adds to the verify phase, over a step; median of {costs['v_cells']} drafting cells; 0 = a "
        f"memory-bound pass); c = t_draft/t_ar {f(costs.get('c', math.nan), 2)} (the draft phase per position)",
    ]
    if gpu_c:
        lines.append(
            "- **predicted for a memory-bound accelerator**: c from the pair's bytes ratio ("
            + ", ".join(f"{p}: {f(c, 2)}" for p, c in gpu_c.items())
            + "), v = 0 with a compute roof (each verified row 1/153 of a step more, A100), the measured "
            "acceptance and draft lengths (pipeline.measure.bounds.predicted_speedup)"
        )
    lines.append(f"- **date**: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------- per method, in plain words


def method_summary(runs: pd.DataFrame, samples: pd.DataFrame, gpu_c: Mapping[str, float]) -> pd.DataFrame:
    """Per (pair, label) at batch 1: tokens/s ratio to ar (mean over seeds), tokens per iteration, drafts per
    iteration, the bound from the measured costs (tokens per iteration over the iteration's measured cost, g (c + v)
    + 1), the efficiency (ratio / bound), v* (the row cost at which it stops beating ar) and the predicted speedup on
    a memory-bound accelerator."""
    from analysis.stats import add_ratios  # noqa: PLC0415

    one = batch_one(runs)
    if one.empty:
        return pd.DataFrame()
    ratios = add_ratios(one)
    acc = add_acceptance_columns(samples[samples["run_id"].isin(set(one["run_id"]))], one)
    ratios = add_predicted_speedup(ratios, acc, gpu_c)
    rows = []
    for (pair, label), g in ratios.groupby(["pair", "label"], sort=False):
        if label == schema.BASELINE:
            continue
        s = acc[acc["run_id"].isin(set(g["run_id"]))]
        iters, drafted, tokens = s["iterations"].sum(), s["drafted_total"].sum(), s["new_tokens"].sum()
        if iters <= 0:
            continue
        t_ar = num(g, "t_target_step_ms")
        c = float((num(g, "t_draft_step_ms") / t_ar).median())
        its = [(drafted / iters, tokens / iters)]  # the pooled iteration: drafts and tokens per iteration
        clocked = num(g, "speedup_bound").notna().any()
        if clocked:  # the loop's own clock: v off the verify phase, the bound from the draft and verify phases
            v = float(num(g, "row_cost_v").median())
            bound = float(num(g, "speedup_bound").mean())
            ratio = float(num(g, "speedup_normalized").mean())
            if not math.isfinite(ratio):
                ratio = float(g["speedup"].mean())
        else:  # cells logged before the clock: the costs stage's t_verify at the cell's gamma
            gamma = num(g, "gamma")
            v = float(((num(g, "t_verify_ms") / t_ar - 1.0) / gamma).median())
            bound = predicted_speedup(its, c, v) if math.isfinite(c) and math.isfinite(v) else math.nan
            ratio = float(g["speedup"].mean())
        shares = {f"share_{p}": float(num(g, f"phase_share_{p}").mean()) for p in ("draft", "verify", "rule", "other")}
        rows.append(
            {
                "pair": pair,
                "label": label,
                "method": str(g["method"].iloc[0]) if "method" in g else label,
                "speedup": ratio,
                "speedup_raw": float(g["speedup"].mean()),
                "clocked": bool(clocked),
                **shares,
                "tokens_per_iteration": tokens / iters,
                "drafts_per_iteration": drafted / iters,
                "plain_share": _plain_share(s) if _adaptive(g) else 0.0,
                "c": c,
                "v": v,
                "bound": bound,
                "efficiency": ratio / bound if bound and math.isfinite(bound) else math.nan,
                "break_even_v": break_even_verify_cost(its, c) if math.isfinite(c) else math.nan,
                "predicted_gpu": float(g["predicted_speedup"].mean()),
                "alpha": float(s["accepted_drafts"].sum() / s["reached"].sum()) if s["reached"].sum() > 0 else math.nan,
            }
        )
    return pd.DataFrame(rows)


def _adaptive(cells: pd.DataFrame) -> bool:
    """Whether the cells chose their draft lengths by the acceptance rule (``draft_stop: acceptance``)."""
    return "draft_stop" in cells and (cells["draft_stop"].astype(str) == "acceptance").any()


def _plain_share(s: pd.DataFrame) -> float:
    """The share of iterations that drafted nothing (plain target steps), each generation's last one left out (it
    may have had no room to draft)."""
    from pipeline.measure.acceptance import as_list  # noqa: PLC0415

    plain = total = 0
    for x in s["drafted"] if "drafted" in s else []:
        d = [int(v) for v in as_list(x)][:-1]
        plain += sum(1 for v in d if v == 0)
        total += len(d)
    return plain / total if total else 0.0


def method_paragraphs(runs: pd.DataFrame, samples: pd.DataFrame, gpu_c: Mapping[str, float]) -> str:
    """One paragraph per method: its ratio to ar, its bound from the measured costs, the efficiency, and what limits
    it here (acceptance or row cost), in plain words; then what a memory-bound accelerator would give."""
    table = method_summary(runs, samples, gpu_c)
    if table.empty:
        return "No speculative method at batch 1 in this sweep.\n"
    f2 = lambda v: "–" if not math.isfinite(v) else f"{v:.2f}"  # noqa: E731
    out = []
    for r in table.to_dict("records"):
        ratio, bound, eff = r["speedup"], r["bound"], r["efficiency"]
        v, vstar, c = r["v"], r["break_even_v"], r["c"]
        free = (
            predicted_speedup([(r["drafts_per_iteration"], r["tokens_per_iteration"])], c)
            if math.isfinite(c)
            else math.nan
        )
        if not math.isfinite(bound):
            limit = (
                "no bound from measured costs: the cells time the draft and verification steps of chain drafts only "
                "(a tree's verification pass has another shape)"
            )
        elif (bound < 1.0 and math.isfinite(vstar) and v > vstar) or (free > 0 and (free - bound) / free > 0.25):
            limit = (
                f"**row cost**: each verified draft costs {f2(v)} of a target step here (it loses to ar above "
                f"{f2(vstar)}); with free rows the same acceptance would bound it at {f2(free)}x"
            )
        else:
            limit = (
                f"**acceptance**: alpha {f2(r['alpha'])} gives {f2(r['tokens_per_iteration'])} tokens per iteration "
                f"for {f2(r['drafts_per_iteration'])} drafts; even with free rows its bound would be {f2(free)}x"
            )
        if r["clocked"] and math.isfinite(r["share_other"]):
            limit += (
                f"; by the loop's clock its time went {100 * r['share_draft']:.0f}% to drafting, "
                f"{100 * r['share_verify']:.0f}% to verification, {100 * r['share_rule']:.0f}% to the rule and "
                f"{100 * r['share_other']:.0f}% to other work (admission, prefill, bookkeeping): the bound counts only "
                f"the first two, so rule and other are what it loses to the bound"
            )
        elif math.isfinite(eff) and eff < 0.9:
            limit += f"; it runs {100 * (1 - eff):.0f}% under its bound (cells logged before the loop's clock)"
        plain = (
            f" {100 * r['plain_share']:.0f}% of its iterations were plain target steps (its draft-length rule, from "
            "this cell's measured c and v, found no draft worth its cost there)."
            if r["plain_share"] > 0.005
            else ""
        )
        speeds = (
            f"{f2(ratio)}x ar here in units of each cell's own target step ({f2(r['speedup_raw'])}x in raw tokens/s)"
            if r["clocked"]
            else f"{f2(ratio)}x ar here"
        )
        out.append(
            f"**{r['label']}**: {speeds}; its bound from the measured costs (c = t_draft/t_ar {f2(c)}, v "
            f"{f2(v)}, {f2(r['drafts_per_iteration'])} drafts and {f2(r['tokens_per_iteration'])} tokens per "
            f"iteration) is {f2(bound)}x, so it runs at {f2(eff)} of it. What limits it here: {limit}.{plain} On a "
            f"memory-bound accelerator (c {f2(gpu_c.get(r['pair'], math.nan))} from the bytes ratio, v = 0) the same "
            f"acceptance predicts {f2(r['predicted_gpu'])}x."
        )
    return "\n\n".join(out) + "\n"


# ----------------------------------------------------------------------------------- batch crossover


def crossover_markdown(runs: pd.DataFrame, samples: pd.DataFrame, gpu_c: Mapping[str, float]) -> str:
    """ar, spd, block, mtad at every batch size: throughput, per-request latency (the window's time per batch of
    requests), acceptance, speedup over ar at the same batch size (measured; predicted for a memory-bound
    accelerator), and per method the batch size where it stops beating ar on each side."""
    data = batching.with_batch(runs)
    acc = add_acceptance_columns(samples[samples["run_id"].isin(set(data["run_id"]))], data)
    data = add_predicted_speedup(data, acc, gpu_c)
    data["latency_s"] = data["decode_s"] / (data["generations"] / data["batch_size"])
    if data["batch_size"].nunique() < 2:
        return "One batch size in this sweep: no crossover.\n"
    f = lambda v, d=2: "–" if v is None or not math.isfinite(float(v)) else f"{float(v):.{d}f}"  # noqa: E731
    lines = [
        "Per method and batch size (mean over seeds): tokens/s over all requests; per-request latency = the window's "
        "time per batch (each request waits for its whole batch); tokens per target step; speedup = tokens/s over ar's "
        "at the same batch size (95% t-interval over seeds); predicted = the same cells' acceptance and draft lengths "
        "on a memory-bound accelerator with a compute roof (c the bytes ratio; a pass streams the weights once, one "
        "step, and each of its rows adds 1/153 of a step, A100's bf16 roof: `bounds.pass_cost`), so a batch's extra "
        "verified rows cost more as the batch grows: the prediction's batch effect, which a memory-bound model "
        "without the roof (v = 0) cannot show.",
        "",
        "| pair | dataset | method | batch | tokens/s | latency/request (s) | tokens/step | speedup [95% CI] | "
        "predicted (memory-bound) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    several = data.groupby(["pair", "dataset", "method_label"])["batch_size"].transform("nunique") > 1
    data = data[several]
    table = batching.speedup_table(data)
    pred = data.groupby(["pair", "dataset", "method_label", "batch_size"])[["predicted_speedup", "latency_s"]].mean()
    for r in table.itertuples():
        p = (
            pred.loc[(r.pair, r.dataset, r.method, r.batch_size)]
            if (r.pair, r.dataset, r.method, r.batch_size) in pred.index
            else None
        )
        lines.append(
            f"| {r.pair} | {r.dataset} | {r.method} | {r.batch_size} | {f(r.tokens_per_s, 1)} | "
            f"{f(p['latency_s'] if p is not None else math.nan)} | {f(r.accepted_per_step)} | {f(r.speedup)} "
            f"[{f(r.low)}, {f(r.high)}] | {f(p['predicted_speedup'] if p is not None else math.nan)} |"
        )
    lines += [
        "",
        "**Crossover** (the smallest batch size where the method no longer beats ar; measured: its mean speedup below "
        "1; predicted: its memory-bound prediction below 1):",
        "",
        "| pair | dataset | method | measured crossover | predicted crossover (memory-bound) | batch sizes |",
        "|---|---|---|---|---|---|",
    ]
    for (pair, dataset, method), g in table[table["method"] != schema.BASELINE].groupby(
        ["pair", "dataset", "method"], sort=True
    ):
        sizes = sorted(g["batch_size"])
        below = g[g["speedup"] < 1.0]["batch_size"]
        pg = pred.loc[(pair, dataset, method)] if (pair, dataset, method) in pred.index.droplevel(3) else None
        pbelow = [] if pg is None else [b for b, v in pg["predicted_speedup"].items() if v < 1.0]
        shown = lambda b: str(int(min(b))) if len(b) else f"none (<= {max(sizes)})"  # noqa: E731
        lines.append(
            f"| {pair} | {dataset} | {method} | {shown(list(below))} | {shown(pbelow)} | {', '.join(map(str, sizes))} |"
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------- sizing


def seconds_per_prompt(runs: pd.DataFrame) -> dict[str, float]:
    """Per label: a cell's wall time over its prompts (generations), mean over its cells: what one more prompt costs
    per seed."""
    out = {}
    for label, g in runs.groupby("label"):
        wall = num(g, "cell_wall_s")
        gens = num(g, "generations")
        per = (wall / gens)[np.isfinite(wall / gens)]
        out[str(label)] = float(per.mean()) if len(per) else math.nan
    return out


def sizing_markdown(table: pd.DataFrame, runs: pd.DataFrame, budget_s: float = SWEEP_BUDGET_S) -> str:
    """For each undecided claim (inconclusive, too few prompts): the prompts it needs at 80% power (the claims'
    minimum-size machinery) and whether the method's and the reference's cells at that size, over the sweep's
    seeds, fit ``budget_s`` here (a cell's wall time per prompt, measured)."""
    undecided = table[table["verdict"].isin([INCONCLUSIVE, TOO_FEW])]
    if undecided.empty:
        return "Every tested claim has a verdict.\n"
    per = seconds_per_prompt(runs)
    seeds = max(1, int(runs["seed"].nunique())) if "seed" in runs else 1
    lines = [
        f"The prompts each undecided claim needs (80% power at its measured effect, the exact test's floor of 6), and "
        f"the time its two methods' cells would take at that size over {seeds} seed(s) here (each cell's measured wall "
        f"time per prompt): whether that fits a {budget_s / 3600:.0f}-hour sweep on this machine.",
        "",
        "| claim | dataset | verdict | n now | needed (prompts; seeds for per-cell claims) | estimated time | fits "
        "2 hours? |",
        "|---|---|---|---|---|---|---|",
    ]
    from analysis.claims_spec import STATISTICS  # noqa: PLC0415

    walls = {str(k): float(v.mean()) for k, v in num(runs, "cell_wall_s").groupby(runs["label"].astype(str))}
    for r in undecided.to_dict("records"):
        need = float(r["samples_needed"]) if pd.notna(r["samples_needed"]) else math.nan
        stat = STATISTICS.get(str(r["statistic"]))
        by_seed = stat is not None and stat.cell_level
        if "no spread" in str(r.get("note")):
            shown_need, secs = "undecidable: no spread (every value the same)", math.nan
        elif by_seed:  # cells paired by seed: a seed more is a cell more of each side
            cost = walls.get(str(r["method"]), math.nan) + walls.get(str(r["reference"]), 0.0)
            secs = need * cost if math.isfinite(need) else math.nan
            shown_need = f"{need:.0f} seeds" if math.isfinite(need) else "–"
        else:
            cost = per.get(str(r["method"]), math.nan) + (per.get(str(r["reference"]), 0.0) if r["reference"] else 0.0)
            secs = need * cost * seeds if math.isfinite(need) and math.isfinite(cost) else math.nan
            shown_need = (
                "∞ (no effect to detect)" if math.isinf(need) else ("–" if not math.isfinite(need) else f"{need:.0f}")
            )
        fits = "–" if not math.isfinite(secs) else ("yes" if secs <= budget_s else "no")
        lines.append(
            f"| {r['claim']} | {r['dataset']} | {r['verdict']} | {r['n']} | {shown_need} | "
            f"{'–' if not math.isfinite(secs) else f'{secs / 60:.0f} min'} | {fits} |"
        )
    return "\n".join(lines) + "\n"


def one_sided(table: pd.DataFrame) -> list[str]:
    """Speed claims whose measured and predicted verdicts differ (one supported, the other not)."""
    from analysis.claims_spec import SUPPORTED  # noqa: PLC0415

    out = []
    for r in table.to_dict("records"):
        measured, predicted = r.get("verdict"), r.get("predicted_verdict")
        if not isinstance(predicted, str) or predicted in ("untested", "nan"):
            continue
        if (measured == SUPPORTED) != (predicted == SUPPORTED):
            here = measured if r.get("status") in ("tested", TOO_FEW) else r.get("status")
            out.append(
                f"- **{r['claim']}** ({r['dataset']}): measured here: {here}; predicted for a memory-bound "
                f"accelerator: {predicted}"
            )
    return out
