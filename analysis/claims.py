"""Claims as data (``analysis/claims.yaml``), tested on a sweep's generations with an exact test over prompts.

    claims = load_claims()                                   # or load_claims("my_claims.yaml")
    table = evaluate_claims(claims, runs, samples)           # one row per claim x (pair, dataset)

Each claim names a method, a reference, a statistic, a scale (relative or absolute effect), a direction
and a margin. Generations of one prompt are not independent, so the unit is the prompt: per prompt, the
statistic of the method's generations (every seed and turn) against the reference's generations of the
same (seed, prompt, turn), as a log ratio (relative) or a difference (absolute); the effect is their mean
(a relative one shown as ratio - 1) and its 95% interval the exact sign-flip interval over prompts
(``analysis.stats.sign_flip_interval``: valid at any size when the prompt-level effects are symmetric under
the null, as they are for a lossless method against ``ar``). Below ``stats.MIN_PROMPTS`` (6) prompts no
interval can exclude anything: the verdict is "too few prompts", with the prompts needed. Otherwise the
verdict is supported / contradicted / inconclusive at this size (``verdict``); for an inconclusive claim, the
prompts a decisive answer would need at 80% power if the measured effect is the true one (``samples_needed``),
and the minimum detectable effect at this size. Timing claims use only cells not flagged ``disturbed``
(their probes around the window against the sweep's calibration, docs/sweeps.md), or say that none were
left; a speedup measured above its own bound is a "measurement problem", not a verdict on the method. Claims
needing a GPU (absolute speed, energy) or a cost ratio are listed as untested off those, with the command
that tests them; claims on methods without cells in the sweep say "no data".

The claims' schema, statistics and verdict rules are in ``analysis.claims_spec``; this module evaluates them.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence, cast

import numpy as np
import pandas as pd

from analysis.claims_spec import (
    CONTRADICTED,
    DISTURBED,
    INCONCLUSIVE,
    MEASUREMENT_PROBLEM,
    NO_DATA,
    PREDICTED,
    STATISTICS,
    TIMING_STATISTICS,
    TOO_FEW,
    Z_95,
    Z_POWER,
    Claim,
    from_d,
    ratio_of_sums,
    samples_needed,
    verdict,
)
from analysis.predicted import add_predicted_speedup  # noqa: F401 - re-exported (the claims evaluate it)
from analysis.stats import MIN_PROMPTS, add_ratios, mark_disturbed, sign_flip_interval
from pipeline.measure.acceptance import as_list, reconstruct_drafted
from pipeline.measure.bounds import expected_tokens

# ----------------------------------------------------------------------------------- units and the bootstrap


def add_acceptance_columns(samples: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per generation: ``iterations`` (len accepted), ``accepted_drafts`` and ``reached`` (draft positions
    reached, pipeline.measure.acceptance), ``accepted_pos1`` and ``reached_pos1`` (position 1 only), ``drafted_total``
    (draft positions put to the target, summed over iterations: what a memory-bound prediction costs), from ``accepted``
    and ``drafted`` (reconstructed from the cell's gamma and max_new_tokens for records logged without it)."""
    out = samples.copy()
    params = (
        runs.set_index("run_id")[["gamma", "max_new_tokens"]]
        if {"gamma", "max_new_tokens"} <= set(runs.columns)
        else None
    )
    iters, acc, reached, acc1, reached1, drafted_total = [], [], [], [], [], []
    for row in out.itertuples(index=False):
        accepted = as_list(getattr(row, "accepted", None))
        drafted = as_list(getattr(row, "drafted", None))
        if (
            not drafted
            and accepted
            and (getattr(row, "draft_steps", 0) or 0) > 0
            and params is not None
            and row.run_id in params.index
        ):
            gamma, mnt = params.loc[row.run_id, "gamma"], params.loc[row.run_id, "max_new_tokens"]
            if isinstance(gamma, (int, float)) and not pd.isna(gamma):
                drafted = reconstruct_drafted(
                    accepted, int(gamma), int(mnt) if isinstance(mnt, (int, float)) and not pd.isna(mnt) else None
                )
        drafted = list(drafted or [0] * len(accepted))
        a = [min(max(int(e) - 1, 0), int(d)) for e, d in zip(accepted, drafted)]
        iters.append(len(accepted))
        drafted_total.append(sum(int(d) for d in drafted[: len(accepted)]))
        acc.append(sum(a))
        reached.append(sum(min(x + 1, int(d)) for x, d in zip(a, drafted)))
        reached1.append(sum(1 for d in drafted if int(d) >= 1))
        acc1.append(sum(1 for x, d in zip(a, drafted) if int(d) >= 1 and x >= 1))
    for name, values in (
        ("iterations", iters),
        ("accepted_drafts", acc),
        ("reached", reached),
        ("accepted_pos1", acc1),
        ("reached_pos1", reached1),
        ("drafted_total", drafted_total),
    ):
        out[name] = np.asarray(values, dtype=float)
    return out


def select(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """Rows of a label, else of a method name held by exactly one label."""
    rows = frame[frame["label"] == name]
    if len(rows) or "method" not in frame:
        return rows
    labels = frame.loc[frame["method"] == name, "label"].unique()
    if len(labels) > 1:
        raise ValueError(
            f"method {name!r} has several labels in this sweep ({', '.join(map(str, labels))}); name one in the claim"
        )
    return frame[frame["label"] == labels[0]] if len(labels) else rows


def cluster_effects(
    ref: np.ndarray | None,
    new: np.ndarray,
    clusters: np.ndarray,
    value: Callable[[np.ndarray, dict], float],
    ctx: dict,
    scale: str = "relative",
) -> np.ndarray:
    """One effect per cluster (prompt): ``value`` of the method's units of that cluster (every seed and turn)
    against the reference's (paired rows; None: one-sample, against 1 on the relative scale, 0 on the absolute),
    as a log ratio (relative) or a difference (absolute). A cluster whose effect is undefined (a zero or
    negative value on the relative scale) is NaN."""
    out = []
    for c in pd.unique(clusters):
        idx = np.flatnonzero(clusters == c)
        b = value(new[idx], ctx)
        a = (1.0 if scale == "relative" else 0.0) if ref is None else value(ref[idx], ctx)
        with np.errstate(divide="ignore", invalid="ignore"):
            if scale == "relative":
                out.append(math.log(b / a) if a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b) else math.nan)
            else:
                out.append(b - a)
    return np.asarray(out, dtype=float)


def pooled_effect(
    ref: np.ndarray | None, new: np.ndarray, value: Callable[[np.ndarray, dict], float], ctx: dict, scale: str
) -> float:
    """The effect of every unit pooled (one statistic per side): shown beside the prompt-level mean."""
    b = value(new, ctx)
    a = (1.0 if scale == "relative" else 0.0) if ref is None else value(ref, ctx)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(b / a - 1.0) if scale == "relative" else float(b - a)


def _speedup_bound_value(ctx: dict) -> Callable[[np.ndarray, dict], float]:
    """The reference side is tokens/s; the method side is tokens/s divided by Leviathan's bound at its alpha."""

    def value(u: np.ndarray, c: dict) -> float:
        tps = ratio_of_sums(u[:, :2], c)
        if u.shape[1] == 2:
            return tps
        acc, reached = u[:, 3].sum(), u[:, 4].sum()
        alpha = acc / reached if reached > 0 else math.nan
        bound = expected_tokens(alpha, int(c["gamma"])) / (int(c["gamma"]) * float(c["cost_ratio"]) + 1.0)
        return tps / bound

    return value


# ----------------------------------------------------------------------------------- evaluation


def _untested(base: dict, status: str, note: str, claim: Claim) -> dict:
    cmd = claim.command or ""
    return {**base, "status": status, "verdict": "untested", "note": note + (f"; test it with: {cmd}" if cmd else "")}


def _on_gpu(cells: pd.DataFrame) -> bool:
    devices = cells["device"].dropna().astype(str).str.lower() if "device" in cells else pd.Series(dtype=str)
    return bool(len(devices)) and not devices.str.contains("cpu").any()


def undisturbed(cells: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """(the cells not flagged ``disturbed``, how many were left out): timing claims use only these."""
    if "disturbed" not in cells:
        return cells, 0
    flagged = cells["disturbed"].fillna(False).astype(bool)
    return cells[~flagged], int(flagged.sum())


def evaluate_claim(
    claim: Claim,
    runs: pd.DataFrame,
    samples: pd.DataFrame,
    *,
    cost_ratio: float | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    gpu_cost_ratio: float | None = None,
) -> dict[str, Any]:
    """One claim on one (pair, dataset) group of runs and samples: a row of the claims table.

    The effect is the mean of the prompt-level effects (log ratios for a relative claim, shown as a ratio - 1),
    its 95% interval the exact sign-flip interval over prompts (``stats.sign_flip_interval``); below
    ``stats.MIN_PROMPTS`` prompts the verdict is "too few prompts". ``n_boot`` is kept for callers; the
    interval is exact and needs no replicates.
    """
    stat = STATISTICS[claim.statistic]
    base = {
        "claim": claim.id,
        "source": claim.source,
        "wording": claim.wording,
        "method": claim.method,
        "reference": claim.reference,
        "statistic": claim.statistic,
        "scale": claim.scale,
        "direction": claim.direction,
        "margin": claim.margin,
        "claimed": claim.claimed,
        "requires": claim.requires,
        "effect": math.nan,
        "low": math.nan,
        "high": math.nan,
        "n": 0,
        "n_pairs": 0,
        "pooled_effect": math.nan,
        "reference_value": math.nan,
        "method_value": math.nan,
        "samples_needed": math.nan,
        "mde": math.nan,
        "claimed_in_ci": None,
        "note": "",
    }
    cells = select(runs, claim.method)
    ref_cells = select(runs, claim.reference) if claim.reference else cells.iloc[0:0]
    missing = [n for n, c in ((claim.method, cells), (claim.reference, ref_cells)) if n and c.empty]
    if missing:
        return _untested(base, NO_DATA, f"no data: no finished cells of {', '.join(missing)} in this sweep", claim)
    if claim.requires == "gpu" and not (_on_gpu(cells) and (ref_cells.empty or _on_gpu(ref_cells))):
        return _untested(base, "needs GPU", "an absolute speed or energy claim: decided on GPU cells only", claim)
    notes = []
    if claim.statistic in TIMING_STATISTICS:
        (cells, out_new), (ref_cells, out_ref) = undisturbed(cells), undisturbed(ref_cells)
        if cells.empty or (claim.reference and ref_cells.empty):
            return _untested(
                base,
                DISTURBED,
                "every cell of the method or the reference was measured while the machine was "
                "disturbed (its target step well above the sweep's calibration): no timing verdict",
                claim,
            )
        if out_new + out_ref:
            notes.append(f"{out_new + out_ref} cell(s) measured on a disturbed machine left out")
        samples = samples[samples["run_id"].isin(set(cells["run_id"]) | set(ref_cells["run_id"]))]
    ctx: dict[str, Any] = {}
    if "gamma" in stat.needs:
        gamma = pd.to_numeric(cells.get("gamma"), errors="coerce").dropna()
        if gamma.empty:
            return _untested(base, "no gamma", f"{claim.method} has no chain draft length gamma", claim)
        ctx["gamma"] = int(gamma.iloc[0])
    if "cost_ratio" in stat.needs:
        logged = (
            pd.to_numeric(cells["cost_ratio"], errors="coerce").dropna()
            if "cost_ratio" in cells
            else pd.Series(dtype=float)
        )
        if cost_ratio is None and logged.empty:
            return _untested(
                base,
                "needs c",
                "needs the cost ratio c = t_draft / t_target (not logged by these cells; pass --cost-ratio)",
                claim,
            )
        ctx["cost_ratio"] = (
            float(cost_ratio) if cost_ratio is not None else float(logged.mean())
        )  # given, else the cells' own
    if "gpu_cost_ratio" in stat.needs:
        if gpu_cost_ratio is None or not math.isfinite(gpu_cost_ratio):
            return _untested(
                base,
                "needs c (GPU)",
                "needs the pair's bytes ratio c (its models' configs were not found; pass --gpu-cost-ratio)",
                claim,
            )
        ctx["gpu_cost_ratio"] = float(gpu_cost_ratio)
    if stat.cell_level:  # cells paired by seed: the seed is the cluster
        if "speedup" in stat.columns and "speedup" not in cells:
            ratios = add_ratios(runs)
            cells, ref_cells = (
                select(ratios, claim.method),
                select(ratios, claim.reference) if claim.reference else ref_cells,
            )
        a = ref_cells[["seed", *stat.columns]].dropna()
        b = cells[["seed", *stat.columns]].dropna()
        joined = a.merge(b, on="seed", suffixes=("_ref", "_new"))
        clusters, unit = joined["seed"].to_numpy(), "seeds"
    else:  # generations paired by (seed, prompt, turn): the prompt is the cluster
        key = ["seed", "id", "turn"]
        b = select(samples, claim.method)[[*key, *stat.columns]].dropna().drop_duplicates(key)
        if claim.reference is None:
            joined = b.rename(columns={c: f"{c}_new" for c in stat.columns})
        else:
            ref_cols = stat.columns[:2] if claim.statistic == "speedup_over_bound" else stat.columns
            a = select(samples, claim.reference)[[*key, *ref_cols]].dropna().drop_duplicates(key)
            joined = a.rename(columns={c: f"{c}_ref" for c in ref_cols}).merge(
                b.rename(columns={c: f"{c}_new" for c in stat.columns}), on=key
            )
        clusters, unit = joined["id"].astype(str).to_numpy(), "prompts"
    new = joined[[f"{c}_new" for c in stat.columns]].to_numpy(dtype=float)
    ref = (
        None
        if claim.reference is None
        else joined[[c for c in joined.columns if c.endswith("_ref")]].to_numpy(dtype=float)
    )
    n_pairs = int(new.shape[0])
    if n_pairs == 0:
        return {
            **base,
            "status": TOO_FEW,
            "verdict": TOO_FEW,
            "samples_needed": float(MIN_PROMPTS),
            "note": "no paired generations" + (f"; {'; '.join(notes)}" if notes else ""),
        }
    value = _speedup_bound_value(ctx) if claim.statistic == "speedup_over_bound" else stat.value
    d = cluster_effects(ref, new, clusters, value, ctx, claim.scale)
    undefined = int((~np.isfinite(d)).sum())
    if undefined:
        notes.append(f"{undefined} {unit} without a defined effect left out (a zero value on a relative scale)")
    ci = sign_flip_interval(d, seed=seed)
    n = ci.n_clusters
    effect, low, high = from_d(ci.mean, claim.scale), from_d(ci.low, claim.scale), from_d(ci.high, claim.scale)
    se = ci.se
    result: dict[str, Any] = {
        **base,
        "status": "tested",
        "effect": effect,
        "low": low,
        "high": high,
        "n": n,
        "n_pairs": n_pairs,
        "se": se,
        "pooled_effect": pooled_effect(ref, new, value, ctx, claim.scale),
        "reference_value": value(ref, ctx) if ref is not None else math.nan,
        "method_value": value(new, ctx),
        "mde": from_d((Z_95 + Z_POWER) * se, claim.scale) if math.isfinite(se) else math.nan,
    }
    if n < MIN_PROMPTS:
        result.update(
            status=TOO_FEW, verdict=TOO_FEW, low=math.nan, high=math.nan, mde=math.inf
        )  # no effect is detectable
        notes.insert(
            0,
            f"{n} {unit}: the exact test needs at least {MIN_PROMPTS} {unit} to decide at 95% (the most extreme of "
            f"{2**n} sign patterns is 1 in {2**n}); the {n_pairs} paired generations are not independent",
        )
        needed = samples_needed(n, se, effect, claim.direction, claim.margin, claim.scale)
        result["samples_needed"] = (
            float(max(MIN_PROMPTS, needed)) if math.isfinite(needed) or math.isinf(needed) else float(MIN_PROMPTS)
        )
    else:
        result["verdict"] = verdict(low, high, claim.direction, claim.margin)
        result["samples_needed"] = (
            n
            if result["verdict"] != INCONCLUSIVE
            else samples_needed(n, se, effect, claim.direction, claim.margin, claim.scale)
        )
    if claim.claimed is not None and math.isfinite(result["low"]):
        result["claimed_in_ci"] = bool(result["low"] <= claim.claimed <= result["high"])
    if claim.statistic in ("tokens_per_s", "speedup_over_bound", "speedup") and not _on_gpu(cells):
        notes.append(
            "CPU timing, indicative: the cells ran one after another and the machine's load may differ between them"
        )
    if claim.statistic == "speedup_over_bound" and result["verdict"] == CONTRADICTED and claim.direction == "at_most":
        result["verdict"] = MEASUREMENT_PROBLEM
        notes.insert(
            0,
            (
                "the measured speedup lies above its own bound, which no method can do: a measurement problem (load or "
                "phase differences between the cells, a cost ratio c measured in another state), not a verdict on the "
                "method"
            ),
        )
    if se == 0 and np.ptp(new, axis=0).max() == 0 and (ref is None or np.ptp(ref, axis=0).max() == 0):
        result["verdict"] = INCONCLUSIVE
        notes.insert(0, "no spread: every generation has the same value (e.g. all scores 0), nothing to decide")
    result["note"] = "; ".join(notes)
    return result


COLUMNS = [
    "pair",
    "dataset",
    "claim",
    "verdict",
    "effect",
    "low",
    "high",
    "n",
    "n_pairs",
    "pooled_effect",
    "samples_needed",
    "mde",
    "claimed",
    "claimed_in_ci",
    "reference_value",
    "method_value",
    "method",
    "reference",
    "statistic",
    "scale",
    "direction",
    "margin",
    "requires",
    "status",
    "note",
    "source",
    "wording",
    *(f"predicted_{k}" for k in ("effect", "low", "high", "n", "verdict", "status", "note", "samples_needed")),
    "predicted_c",
]


def _predicted_twin(claim: Claim) -> Claim | None:
    """A speed claim's memory-bound twin: the same comparison on ``PREDICTED[statistic]`` (None for other claims)."""
    twin = PREDICTED.get(claim.statistic)
    return None if twin is None else replace(claim, statistic=twin, requires="cpu", claimed=claim.claimed)


def evaluate_claims(
    claims: Sequence[Claim],
    runs: pd.DataFrame,
    samples: pd.DataFrame,
    *,
    cost_ratio: float | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    gpu_cost_ratio: float | Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """Every claim on every (pair, dataset) group of the sweep: the claims table (``COLUMNS``).

    Each speed claim (tokens_per_s, speedup) gets a second answer in the ``predicted_*`` columns: the same test on
    what the measured acceptance and draft lengths give on a memory-bound accelerator (``PREDICTED``), with c =
    ``gpu_cost_ratio`` (one number, or one per pair: ``analysis.transfer.gpu_cost_ratio``) and v = 0."""
    runs = mark_disturbed(runs)
    samples = add_acceptance_columns(samples, runs)
    by_pair = gpu_cost_ratio if isinstance(gpu_cost_ratio, Mapping) else None
    runs = add_predicted_speedup(
        runs,
        samples,
        by_pair if by_pair is not None else {p: cast(float | None, gpu_cost_ratio) for p in runs["pair"].unique()},
    )
    rows = []
    for (pair, dataset), group in runs.groupby(["pair", "dataset"], sort=True):
        group_samples = samples[samples["run_id"].isin(set(group["run_id"]))]
        c_gpu = by_pair.get(pair) if by_pair is not None else gpu_cost_ratio
        for claim in claims:
            try:
                row = evaluate_claim(
                    claim,
                    group,
                    group_samples,
                    cost_ratio=cost_ratio,
                    n_boot=n_boot,
                    seed=seed,
                    gpu_cost_ratio=c_gpu,  # type: ignore[arg-type]
                )
                twin = _predicted_twin(claim)
                if twin is not None:
                    pred = evaluate_claim(
                        twin,
                        group,
                        group_samples,
                        n_boot=n_boot,
                        seed=seed,
                        gpu_cost_ratio=c_gpu,  # type: ignore[arg-type]
                    )
                    row.update({f"predicted_{k}": pred.get(k) for k in PREDICTED_COLUMNS})
                    row["predicted_c"] = c_gpu
            except ValueError as err:  # an ambiguous label: reported, not fatal for the other claims
                row = _untested(
                    {"claim": claim.id, "method": claim.method, "reference": claim.reference},
                    "error",
                    str(err),
                    replace(claim, command=None),
                )
            rows.append({"pair": pair, "dataset": dataset, **row})
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


PREDICTED_COLUMNS = ("effect", "low", "high", "n", "verdict", "status", "note", "samples_needed")
