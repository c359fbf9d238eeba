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

import functools
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from analysis import schema
from analysis.disturbed import TIMING_COLUMNS, mark_disturbed, without_disturbed_timing  # noqa: F401 - re-exported
from pipeline.cell_types import split_temperature_label
from pipeline.measure.bounds import alpha_from_tokens_per_step, leviathan_bound
from pipeline.measure.costs import DISTURBED_DRIFT, DISTURBED_SLOWDOWN  # noqa: F401 - the report names them

GROUP = ("pair", "dataset", "label")
MATCH = (
    "pair",
    "dataset",
    "seed",
    "device",
    "batch_size",
    "rate",
)  # batch_size, rate: a method's speedup is over ar at the same batch size and offered load (NaN offline)


def mean_std(values: Iterable[float]) -> tuple[float, float, int]:
    """(mean, sample std with ddof=1, n) of the finite values; std is NaN for n < 2, both NaN for n = 0."""
    arr = np.asarray(list(values), dtype=float)
    arr = arr[np.isfinite(arr)]
    n = int(arr.size)
    if n == 0:
        return math.nan, math.nan, 0
    return float(arr.mean()), (float(arr.std(ddof=1)) if n > 1 else math.nan), n


def per_seed_ratio(
    runs: pd.DataFrame, metric: str, baseline: str = schema.BASELINE, match: Sequence[str] = MATCH
) -> pd.Series:
    """``runs[metric]`` over the same metric of the baseline's cell with equal ``match`` columns.

    The baseline is a method name (``ar``) or a label; rows without a matching baseline cell get NaN.
    """
    match = [c for c in match if c in runs.columns]
    # "ar (batch 4)": ar's cell at batch 4; "ar @ 2/s" at rate 2; "ar (T=0.7)" at temperature 0.7 (matched too)
    split = runs["label"].map(lambda label: split_temperature_label(str(label)))
    labels = split.map(lambda t: t[0])
    is_base = labels == baseline if (labels == baseline).any() else runs["method"] == baseline
    keys = runs[match].astype(object).where(runs[match].notna(), "")
    keys["_temperature"] = split.map(lambda t: "" if t[1] is None else t[1])
    match = [*match, "_temperature"]
    base = keys[is_base].assign(_base=runs.loc[is_base, metric].to_numpy(dtype=float)).drop_duplicates(match)
    merged = keys.merge(base, on=match, how="left")  # a left merge keeps the left rows' order
    with np.errstate(divide="ignore", invalid="ignore"):
        values = runs[metric].to_numpy(dtype=float) / merged["_base"].to_numpy(dtype=float)
    return pd.Series(values, index=runs.index, name=f"{metric}_ratio")


def add_ratios(runs: pd.DataFrame, baseline: str = schema.BASELINE) -> pd.DataFrame:
    """A copy of ``runs`` with per-seed ``speedup`` (tokens/s ÷ baseline), ``speedup_normalized`` (tokens per
    own target step ÷ baseline's), ``energy_ratio`` (J/token ÷
    baseline), ``dynamic_energy_ratio`` and ``accepted_drafts_per_step`` (tokens/step - 1 for methods
    that draft; NaN otherwise)."""
    out = runs.copy()
    out["speedup"] = per_seed_ratio(out, "tokens_per_s", baseline)
    # the same ratio in units of each cell's own target step (its loop's clock): a machine phase between a cell and
    # its baseline cancels in it (NaN for cells logged before the clock)
    if "tokens_per_target_step" in out:
        out["speedup_normalized"] = per_seed_ratio(out, "tokens_per_target_step", baseline)
    else:
        out["speedup_normalized"] = math.nan
    out["energy_ratio"] = per_seed_ratio(out, "j_per_token", baseline)
    out["dynamic_energy_ratio"] = per_seed_ratio(out, "dynamic_j_per_token", baseline)
    drafts = out["draft_steps"].fillna(0) > 0
    out["accepted_drafts_per_step"] = np.where(drafts, out["accepted_per_step"] - 1.0, np.nan)
    return out


def aggregate(runs: pd.DataFrame, metrics: Sequence[str], by: Sequence[str] = GROUP) -> pd.DataFrame:
    """Mean, std (ddof=1) and n over seeds of each metric per group: ``<m>_mean``, ``<m>_std``, ``<m>_n``. A metric
    that is not a column is refused: a metric reaches the runs only through ``schema.METRICS`` (NaN where a run did
    not log it), so a missing column is a metric the schema lacks, not a missing value."""
    if missing := [m for m in metrics if m not in runs.columns]:
        msg = "add each to analysis/schema.METRICS as '<column>': '<logged name>' (docs/extending.md, A metric)"
        raise ValueError(f"metric(s) {missing} are not columns of the runs: {msg}")
    rows = []
    for key, g in runs.groupby(list(by), sort=False, dropna=False):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        row["seeds"] = int(g["seed"].nunique()) if "seed" in g else len(g)
        for m in metrics:
            mean, std, n = mean_std(g[m])
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
    reference, method = _paired(reference, method)
    n = reference.shape[0]
    groups = (
        [np.arange(n)]
        if strata is None
        else [np.flatnonzero(np.asarray(strata) == s) for s in pd.unique(np.asarray(strata))]
    )
    return _bootstrap(
        reference,
        method,
        statistic,
        lambda rng: np.concatenate([g[rng.integers(0, g.size, g.size)] for g in groups]),
        n_units=n,
        n_boot=n_boot,
        level=level,
        seed=seed,
    )


def _paired(reference: np.ndarray, method: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays as floats, paired by position: ValueError when their shapes differ."""
    reference, method = np.asarray(reference, dtype=float), np.asarray(method, dtype=float)
    if reference.shape != method.shape:
        raise ValueError(f"paired arrays differ in shape: {reference.shape} vs {method.shape}")
    return reference, method


def _bootstrap(
    reference: np.ndarray,
    method: np.ndarray,
    statistic: Callable[[np.ndarray], float],
    draw: Callable[[np.random.Generator], np.ndarray],
    *,
    n_units: int,
    n_boot: int,
    level: float,
    seed: int,
) -> BootstrapResult:
    """``statistic(method) - statistic(reference)`` and its percentile interval at ``level`` over ``n_boot``
    replicates, each on the unit indices ``draw(rng)`` (``numpy.random.default_rng(seed)``); NaN without units."""
    if reference.shape[0] == 0:
        return BootstrapResult(math.nan, math.nan, math.nan, 0, n_boot, level)
    rng = np.random.default_rng(seed)
    point = statistic(method) - statistic(reference)
    diffs = np.empty(n_boot)
    for b in range(n_boot):
        idx = draw(rng)
        diffs[b] = statistic(method[idx]) - statistic(reference[idx])
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(diffs, [alpha, 1.0 - alpha])
    return BootstrapResult(
        float(point), float(low), float(high), int(n_units), n_boot, level, float(statistic(reference))
    )


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


def paired_units(
    samples: pd.DataFrame, label: str, reference: str, columns: Sequence[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(reference units, method units, seeds, prompt ids) of generations present, with finite values, in both."""
    key = ["seed", "id", "turn"]
    a = samples.loc[samples["label"] == reference, [*key, *columns]].drop_duplicates(key)
    b = samples.loc[samples["label"] == label, [*key, *columns]].drop_duplicates(key)
    joined = a.merge(b, on=key, how="inner", suffixes=("_ref", "_new")).dropna()
    ref = joined[[f"{c}_ref" for c in columns]].to_numpy(dtype=float)
    new = joined[[f"{c}_new" for c in columns]].to_numpy(dtype=float)
    return ref, new, joined["seed"].to_numpy(), joined["id"].astype(str).to_numpy()


def significance(
    samples: pd.DataFrame,
    reference: str,
    metric: str = "tokens_per_s",
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    exclude_runs: Iterable[str] = (),
) -> pd.DataFrame:
    """Per (pair, dataset, label): paired bootstrap of ``metric`` against ``reference`` (a label), resampling
    prompts (``cluster_bootstrap``: a prompt's generations of every seed and turn move together).

    Columns: pair, dataset, label, reference, metric, diff, low, high, n_units (paired generations),
    n_prompts, significant. The reference's own row and labels sharing no generations with it are left out;
    generations of ``exclude_runs`` (e.g. cells measured on a disturbed machine) are left out first.
    """
    if metric not in BOOTSTRAP_METRICS:
        raise ValueError(f"no bootstrap statistic for {metric!r}; valid: {sorted(BOOTSTRAP_METRICS)}")
    columns, stat = BOOTSTRAP_METRICS[metric]
    excluded = set(exclude_runs)
    if excluded and "run_id" in samples:
        samples = samples[~samples["run_id"].isin(excluded)]
    rows = []
    for (pair, dataset), g in samples.groupby(["pair", "dataset"], sort=False):
        if reference not in set(g["label"]):
            continue
        for label in g["label"].unique():
            if label == reference:
                continue
            ref, new, _, prompts = paired_units(g, label, reference, columns)
            if ref.shape[0] == 0:
                continue
            res = cluster_bootstrap(ref, new, prompts, stat, n_boot=n_boot, level=level, seed=seed)
            rows.append(
                {
                    "pair": pair,
                    "dataset": dataset,
                    "label": label,
                    "reference": reference,
                    "metric": metric,
                    "diff": res.diff,
                    "low": res.low,
                    "high": res.high,
                    "reference_value": res.reference_value,
                    "n_units": int(ref.shape[0]),
                    "n_prompts": res.n_units,
                    "significant": res.significant and res.n_units >= MIN_PROMPTS,
                }
            )
    cols = [
        "pair",
        "dataset",
        "label",
        "reference",
        "metric",
        "diff",
        "low",
        "high",
        "reference_value",
        "n_units",
        "n_prompts",
        "significant",
    ]
    return pd.DataFrame(rows, columns=cols)


# ----------------------------------------------------------------------------------- prompt-level exact test

# Generations of one prompt are not independent (they share the prompt's difficulty, length and topic), so a
# test that treats them as the units over-states its precision when prompts are few: 6 pairs from 3 prompts
# are 3 clusters. The unit here is the prompt: one effect per prompt (its generations of every seed and turn
# pooled), then Fisher's sign-flip (randomization) test of their mean and the exact interval that inverts it
# (Hartigan 1969: the bounds are order statistics of the means of subsets of the prompt-level effects). Under
# a null where the method's and the reference's generations of a prompt are exchangeable (a lossless method
# against ``ar``), a prompt-level effect is symmetric about 0, and the test is exact at every size: each
# one-sided tail rejects with probability at most LEVEL_TAIL, the two together at most 1 - level.

EXACT_MAX_CLUSTERS = 14  # enumerate all 2^n sign patterns up to here (16,384); above, FLIPS random ones (still exact)
FLIPS = 10000
TAIL = 0.025  # each side of a 95% interval


def min_clusters(tail: float = TAIL) -> int:
    """The fewest clusters (prompts) with which the exact test can reject at all: the smallest n with
    2^n * tail >= 1 (6 at 2.5% per side: with 5 prompts the most extreme of 32 sign patterns has p = 1/32)."""
    if not 0 < tail < 0.5:
        raise ValueError(f"tail {tail!r} must lie in (0, 0.5)")
    return int(math.ceil(math.log2(1.0 / tail)))


MIN_PROMPTS = min_clusters()


@dataclass
class ClusterInterval:
    """Mean of the cluster-level effects ``d`` and its exact sign-flip interval (on the scale of ``d``)."""

    mean: float
    low: float
    high: float
    n_clusters: int
    sd: float
    exact: bool  # every sign pattern enumerated (else FLIPS random ones)

    @property
    def se(self) -> float:
        """Standard error of the mean of the cluster effects (sd / sqrt(n)); NaN below 2 clusters."""
        return self.sd / math.sqrt(self.n_clusters) if self.n_clusters > 1 else math.nan


@functools.lru_cache(maxsize=None)
def _all_subsets(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every non-empty subset of n items as a 0/1 float matrix (one row each) and the subsets' sizes."""
    masks = ((np.arange(1, 2**n)[:, None] >> np.arange(n)) & 1).astype(float)
    return masks, masks.sum(axis=1)


def _subset_means(d: np.ndarray, seed: int) -> tuple[np.ndarray, int, int]:
    """(means of the non-empty flipped subsets, number of patterns incl. the identity, empty random subsets)."""
    n = d.size
    if n <= EXACT_MAX_CLUSTERS:
        masks, sizes = _all_subsets(n)
        return (masks @ d) / sizes, 2**n, 0
    rng = np.random.default_rng(seed)
    masks = rng.integers(0, 2, size=(FLIPS, n), dtype=np.uint8).astype(float)
    sizes = masks.sum(axis=1)
    keep = sizes > 0
    return (masks[keep] @ d) / sizes[keep], FLIPS + 1, int((~keep).sum())


def sign_flip_interval(d: Sequence[float] | np.ndarray, *, tail: float = TAIL, seed: int = 0) -> ClusterInterval:
    """Exact interval for the centre of symmetric cluster effects ``d`` (NaNs dropped): the set of theta that
    Fisher's sign-flip test of mean(d - theta) does not reject at ``tail`` on either side.

    The test of "centre <= theta" counts the sign patterns whose flipped sum is at least the observed one; a
    pattern flipping the subset F does so exactly when theta >= mean(d over F). So the lower bound is the K-th
    smallest subset mean with K = floor(tail * patterns) (minus the empty random subsets, which always count),
    the upper bound the K-th largest; with K < 1 (fewer than ``min_clusters`` clusters) the interval is the
    whole line. Deterministic: the random patterns (above ``EXACT_MAX_CLUSTERS``) come from ``seed``.
    """
    finite: np.ndarray = np.asarray(d, dtype=float)
    finite = finite[np.isfinite(finite)]
    n = int(finite.size)
    if n == 0:
        return ClusterInterval(math.nan, math.nan, math.nan, 0, math.nan, True)
    mean, sd = float(finite.mean()), (float(finite.std(ddof=1)) if n > 1 else math.nan)
    means, total, empty = _subset_means(finite, seed)
    k = int(math.floor(tail * total + 1e-12)) - empty
    if k < 1:
        return ClusterInterval(mean, -math.inf, math.inf, n, sd, n <= EXACT_MAX_CLUSTERS)
    ordered = np.sort(means)
    return ClusterInterval(mean, float(ordered[k - 1]), float(ordered[-k]), n, sd, n <= EXACT_MAX_CLUSTERS)


def cluster_bootstrap(
    reference: np.ndarray,
    method: np.ndarray,
    clusters: np.ndarray,
    statistic: Callable[[np.ndarray], float],
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> BootstrapResult:
    """Paired bootstrap of ``statistic(method) - statistic(reference)`` that resamples whole clusters (prompts)
    with replacement, each with all its units (seeds, turns): generations of one prompt move together, so
    the interval reflects how much the answer depends on which prompts were drawn. A descriptive interval
    for the tables; with few clusters it is too narrow (3 prompts have 10 distinct resamples), so verdicts
    use ``sign_flip_interval`` instead."""
    reference, method = _paired(reference, method)
    labels = pd.unique(np.asarray(clusters))
    members = [np.flatnonzero(np.asarray(clusters) == c) for c in labels]
    return _bootstrap(
        reference,
        method,
        statistic,
        lambda rng: np.concatenate([members[i] for i in rng.integers(0, len(members), len(members))]),
        n_units=len(labels),
        n_boot=n_boot,
        level=level,
        seed=seed,
    )


# ----------------------------------------------------------------------------------- Leviathan's bound


NO_C_REASON = "cost ratio c not logged by the cells (pipeline.bench measures it; pass cost_ratio=...)"
NO_GAMMA_REASON = "no draft of a known depth (a chain's gamma, a tree's levels)"
TREE_BOUND = "tree: tokens/step over (depth c + 1)"
ABOVE_BOUND = (
    "measured speedup above its own bound: a measurement problem (load or phase differences between the cells, "
    "c measured in another state), not a property of the method"
)


def _number(value: object) -> float:
    """A cell's column as a float (NaN when absent or not a number)."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def bound_frame(runs: pd.DataFrame, cost_ratio: float | dict[str, float] | None = None) -> pd.DataFrame:
    """Per (pair, dataset, label): measured speedup next to its ideal bound, for what the cells drafted as
    configured (``schema.draft_of``: a chain or a tree, and its depth).

    A chain of gamma tokens: Leviathan's bound, alpha derived per seed from the cell's tokens/step and gamma,
    then averaged. A tree of d levels: its tokens/step over (d c + 1) (one target pass and d draft levels per
    step: the same number as for a chain, with no i.i.d. alpha for a tree). The column ``gamma`` holds
    the depth, ``shape`` the draft's. ``c`` comes from a logged ``cost_ratio`` metric, else from ``cost_ratio``
    (a float, or pair -> c); without one the bound is NaN and ``bound_note`` says why. Needs the columns of
    ``add_ratios``.
    """
    rows = []
    for key, g in runs.groupby(list(GROUP), sort=False):
        pair, dataset, label = key
        method = str(g["method"].iloc[0])
        first = g.iloc[0]
        shape, depth = schema.draft_of(
            method, _number(first.get("draft_depth")), _number(first.get("tree_draft")), _number(first.get("gamma"))
        )
        row = {"pair": pair, "dataset": dataset, "label": label, "method": method, "shape": shape}
        row["speedup_mean"], row["speedup_std"], _ = mean_std(g["speedup"])
        row["alpha_mean"] = row["alpha_std"] = row["c"] = row["bound_mean"] = math.nan
        row["gamma"] = math.nan
        if depth is None:
            row["bound_note"] = NO_GAMMA_REASON
            rows.append(row)
            continue
        gamma_v = depth
        row["gamma"] = gamma_v
        if shape == "chain":
            alphas = [alpha_from_tokens_per_step(v, gamma_v) for v in g["accepted_per_step"]]
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
        if shape == "chain":
            bounds = [leviathan_bound(a, gamma_v, c) for a, c in zip(alphas, c_values)]
        else:
            bounds = [float(t) / (gamma_v * c + 1.0) for t, c in zip(g["accepted_per_step"], c_values)]
            note = f"{note}; {TREE_BOUND}"
        row["c"] = float(np.nanmean(c_values))
        row["bound_mean"], row["bound_std"], _ = mean_std(bounds)
        row["bound_note"] = note
        if (
            math.isfinite(row["speedup_mean"])
            and math.isfinite(row["bound_mean"])
            and row["speedup_mean"] > row["bound_mean"]
        ):
            row["bound_note"] = f"{note}; {ABOVE_BOUND}"
        rows.append(row)
    return pd.DataFrame(rows)
