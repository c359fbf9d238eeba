"""Statistics over seeds: mean ± std (ddof=1), per-seed ratios to the baseline, paired bootstrap, the bound.

- Speedup and energy ratio are computed per seed (a method's cell over the ``ar`` cell of the same
  pair, dataset, seed and device model, docs/DESIGN.md 5.8), then averaged: mean of ratios, not ratio of means.
- The significance test pairs generations (seed, sample id, turn) of a method with those of a
  reference method and bootstraps the difference of the aggregate statistic, resampling the pairs
  within each seed (stratified), with a fixed RNG seed.
- Leviathan et al. (2023): E[tokens/step] = (1 - a^(g+1)) / (1 - a); speedup bound
  E[tokens/step] / (g c + 1). alpha is recovered from the measured tokens/step by inverting the first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from analysis import schema
from pipeline.bounds import alpha_from_tokens_per_step, leviathan_bound
from pipeline.cell_types import split_batch_label

GROUP = ("pair", "dataset", "label")
MATCH = ("pair", "dataset", "seed", "device", "batch_size")  # batch_size: a method's speedup is over ar at the same batch size


def mean_std(values: Iterable[float]) -> tuple[float, float, int]:
    """(mean, sample std with ddof=1, n) of the finite values; std is NaN for n < 2, both NaN for n = 0."""
    arr = np.asarray(list(values), dtype=float)
    arr = arr[np.isfinite(arr)]
    n = int(arr.size)
    if n == 0:
        return math.nan, math.nan, 0
    return float(arr.mean()), (float(arr.std(ddof=1)) if n > 1 else math.nan), n


def per_seed_ratio(runs: pd.DataFrame, metric: str, baseline: str = schema.BASELINE, match: Sequence[str] = MATCH) -> pd.Series:
    """``runs[metric]`` over the same metric of the baseline's cell with equal ``match`` columns.

    The baseline is a method name (``ar``) or a label; rows without a matching baseline cell get NaN.
    """
    match = [c for c in match if c in runs.columns]
    labels = runs["label"].map(lambda label: split_batch_label(str(label))[0])  # "ar (batch 4)" is ar's cell at batch 4
    if (labels == baseline).any():
        is_base = labels == baseline
    else:
        is_base = runs["method"] == baseline
    keys = runs[match].astype(object).where(runs[match].notna(), "")
    base = keys[is_base].assign(_base=runs.loc[is_base, metric].to_numpy(dtype=float)).drop_duplicates(match)
    merged = keys.merge(base, on=match, how="left")  # a left merge keeps the left rows' order
    with np.errstate(divide="ignore", invalid="ignore"):
        values = runs[metric].to_numpy(dtype=float) / merged["_base"].to_numpy(dtype=float)
    return pd.Series(values, index=runs.index, name=f"{metric}_ratio")


def add_ratios(runs: pd.DataFrame, baseline: str = schema.BASELINE) -> pd.DataFrame:
    """A copy of ``runs`` with per-seed ``speedup`` (tokens/s ÷ baseline), ``energy_ratio`` (J/token ÷
    baseline), ``dynamic_energy_ratio`` and ``accepted_drafts_per_step`` (tokens/step - 1 for methods
    that draft; NaN otherwise)."""
    out = runs.copy()
    out["speedup"] = per_seed_ratio(out, "tokens_per_s", baseline)
    out["energy_ratio"] = per_seed_ratio(out, "j_per_token", baseline)
    out["dynamic_energy_ratio"] = per_seed_ratio(out, "dynamic_j_per_token", baseline)
    drafts = out["draft_steps"].fillna(0) > 0
    out["accepted_drafts_per_step"] = np.where(drafts, out["accepted_per_step"] - 1.0, np.nan)
    return out


def aggregate(runs: pd.DataFrame, metrics: Sequence[str], by: Sequence[str] = GROUP) -> pd.DataFrame:
    """Mean, std (ddof=1) and n over seeds of each metric per group: ``<m>_mean``, ``<m>_std``, ``<m>_n``."""
    rows = []
    for key, g in runs.groupby(list(by), sort=False, dropna=False):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        row["seeds"] = int(g["seed"].nunique()) if "seed" in g else len(g)
        for m in metrics:
            mean, std, n = mean_std(g[m]) if m in g else (math.nan, math.nan, 0)
            row[f"{m}_mean"], row[f"{m}_std"], row[f"{m}_n"] = mean, std, n
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------- bootstrap


@dataclass
class BootstrapResult:
    """Difference ``statistic(method) - statistic(reference)`` and its percentile interval."""

    diff: float
    low: float
    high: float
    n_units: int
    n_boot: int
    level: float
    reference_value: float = math.nan

    @property
    def significant(self) -> bool:
        """The interval excludes 0."""
        return bool(np.isfinite(self.low) and (self.low > 0 or self.high < 0))


def paired_bootstrap(
    reference: np.ndarray,
    method: np.ndarray,
    statistic: Callable[[np.ndarray], float],
    *,
    strata: np.ndarray | None = None,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> BootstrapResult:
    """Paired bootstrap of ``statistic(method[i]) - statistic(reference[i])`` over units ``i``.

    ``reference`` and ``method`` are arrays with one row per unit (paired by position); each replicate
    draws the same unit indices for both, with replacement within each stratum (e.g. seed) so every
    replicate keeps the strata sizes. Percentile interval at ``level``; ``numpy.random.default_rng(seed)``.
    """
    reference, method = np.asarray(reference, dtype=float), np.asarray(method, dtype=float)
    if reference.shape != method.shape:
        raise ValueError(f"paired arrays differ in shape: {reference.shape} vs {method.shape}")
    n = reference.shape[0]
    if n == 0:
        return BootstrapResult(math.nan, math.nan, math.nan, 0, n_boot, level)
    groups = [np.arange(n)] if strata is None else [np.flatnonzero(np.asarray(strata) == s) for s in pd.unique(np.asarray(strata))]
    rng = np.random.default_rng(seed)
    point = statistic(method) - statistic(reference)
    diffs = np.empty(n_boot)
    for b in range(n_boot):
        idx = np.concatenate([g[rng.integers(0, g.size, g.size)] for g in groups])
        diffs[b] = statistic(method[idx]) - statistic(reference[idx])
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(diffs, [alpha, 1.0 - alpha])
    return BootstrapResult(float(point), float(low), float(high), int(n), n_boot, level, float(statistic(reference)))


def ratio_of_sums(units: np.ndarray) -> float:
    """sum(col 0) / sum(col 1): pooled tokens/s from (tokens, seconds) rows, as the cells compute it."""
    den = units[:, 1].sum()
    return float(units[:, 0].sum() / den) if den > 0 else math.nan


def mean_of_column(units: np.ndarray) -> float:
    """Mean of the first column (per-sample scores)."""
    return float(units[:, 0].mean()) if units.size else math.nan


# metric -> (record columns that form a unit, statistic over units)
BOOTSTRAP_METRICS: dict[str, tuple[tuple[str, ...], Callable[[np.ndarray], float]]] = {
    "tokens_per_s": (("new_tokens", "decode_s"), ratio_of_sums),
    "accepted_per_step": (("new_tokens", "steps"), ratio_of_sums),
    "score": (("sample_score",), mean_of_column),
    "perplexity": (("perplexity",), mean_of_column),
}


def paired_units(samples: pd.DataFrame, label: str, reference: str, columns: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(reference units, method units, seeds) of generations present, with finite values, in both."""
    key = ["seed", "id", "turn"]
    a = samples.loc[samples["label"] == reference, [*key, *columns]].drop_duplicates(key)
    b = samples.loc[samples["label"] == label, [*key, *columns]].drop_duplicates(key)
    joined = a.merge(b, on=key, how="inner", suffixes=("_ref", "_new")).dropna()
    ref = joined[[f"{c}_ref" for c in columns]].to_numpy(dtype=float)
    new = joined[[f"{c}_new" for c in columns]].to_numpy(dtype=float)
    seeds = joined["seed"].to_numpy()
    return ref, new, seeds


def significance(samples: pd.DataFrame, reference: str, metric: str = "tokens_per_s", *, n_boot: int = 2000,
                 level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Per (pair, dataset, label): paired bootstrap of ``metric`` against ``reference`` (a label).

    Columns: pair, dataset, label, reference, metric, diff, low, high, n_units, significant.
    The reference's own row and labels sharing no generations with it are left out.
    """
    if metric not in BOOTSTRAP_METRICS:
        raise ValueError(f"no bootstrap statistic for {metric!r}; valid: {sorted(BOOTSTRAP_METRICS)}")
    columns, stat = BOOTSTRAP_METRICS[metric]
    rows = []
    for (pair, dataset), g in samples.groupby(["pair", "dataset"], sort=False):
        if reference not in set(g["label"]):
            continue
        for label in g["label"].unique():
            if label == reference:
                continue
            ref, new, seeds = paired_units(g, label, reference, columns)
            if ref.shape[0] == 0:
                continue
            res = paired_bootstrap(ref, new, stat, strata=seeds, n_boot=n_boot, level=level, seed=seed)
            rows.append({"pair": pair, "dataset": dataset, "label": label, "reference": reference, "metric": metric,
                         "diff": res.diff, "low": res.low, "high": res.high, "reference_value": res.reference_value,
                         "n_units": res.n_units, "significant": res.significant})
    cols = ["pair", "dataset", "label", "reference", "metric", "diff", "low", "high", "reference_value", "n_units", "significant"]
    return pd.DataFrame(rows, columns=cols)


# ----------------------------------------------------------------------------------- Leviathan's bound


NO_C_REASON = "cost ratio c not logged by the cells (pipeline.bench measures it; pass cost_ratio=...)"
NO_GAMMA_REASON = "no chain draft of length gamma"


def bound_frame(runs: pd.DataFrame, cost_ratio: float | dict[str, float] | None = None) -> pd.DataFrame:
    """Per (pair, dataset, label): measured speedup next to Leviathan's bound.

    alpha is derived per seed from the cell's tokens/step and its ``gamma`` param, then averaged.
    ``c`` comes from a logged ``cost_ratio`` metric, else from ``cost_ratio`` (a float, or pair -> c);
    without one the bound is NaN and ``bound_note`` says why. Needs the columns of ``add_ratios``.
    """
    rows = []
    for key, g in runs.groupby(list(GROUP), sort=False):
        pair, dataset, label = key
        method = str(g["method"].iloc[0])
        gamma = pd.to_numeric(g["gamma"], errors="coerce").dropna() if "gamma" in g else pd.Series(dtype=float)
        row = {"pair": pair, "dataset": dataset, "label": label, "method": method}
        row["speedup_mean"], row["speedup_std"], _ = mean_std(g["speedup"])
        row["alpha_mean"] = row["alpha_std"] = row["c"] = row["bound_mean"] = math.nan
        row["gamma"] = math.nan
        if method not in schema.DRAFT_GAMMA_METHODS or gamma.empty:
            row["bound_note"] = NO_GAMMA_REASON
            rows.append(row)
            continue
        gamma_v = int(gamma.iloc[0])
        alphas = [alpha_from_tokens_per_step(v, gamma_v) for v in g["accepted_per_step"]]
        row["gamma"] = gamma_v
        row["alpha_mean"], row["alpha_std"], _ = mean_std(alphas)
        logged = g["cost_ratio"].dropna() if "cost_ratio" in g else pd.Series(dtype=float)
        if not logged.empty:
            c_values, note = logged.to_numpy(dtype=float), "c logged by the cells"
        elif isinstance(cost_ratio, dict) and pair in cost_ratio:
            c_values, note = np.full(len(g), float(cost_ratio[pair])), "c given for the pair"
        elif isinstance(cost_ratio, (int, float)):
            c_values, note = np.full(len(g), float(cost_ratio)), "c given"
        else:
            row["bound_note"] = NO_C_REASON
            rows.append(row)
            continue
        bounds = [leviathan_bound(a, gamma_v, c) for a, c in zip(alphas, c_values)]
        row["c"] = float(np.nanmean(c_values))
        row["bound_mean"], row["bound_std"], _ = mean_std(bounds)
        row["bound_note"] = note
        rows.append(row)
    return pd.DataFrame(rows)
