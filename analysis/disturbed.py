"""Cells measured on a disturbed machine: flagged, and their timing left out of means, speedups and timing claims.

runs = mark_disturbed(runs)              # step_slowdown and a boolean disturbed per cell
timed = without_disturbed_timing(runs)   # the timing columns NaN for disturbed cells
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import schema
from pipeline.measure.costs import DISTURBED_DRIFT, DISTURBED_SLOWDOWN

# Not here: tokens_per_target_step and speedup_normalized, in units of the window's own plain target step: a phase
# before, between or inside windows slows the steps and the tokens alike, so they survive it (issue 53).
TIMING_COLUMNS = (
    "tokens_per_s",
    "tokens_per_s_window",
    "tokens_per_s_mean_of_samples",
    "j_per_token",
    "dynamic_j_per_token",
    "speedup",
    "energy_ratio",
    "dynamic_energy_ratio",
    *schema.SERVING_TIMING,  # a workload's latencies and rates (analysis.serving)
)


def mark_disturbed(runs: pd.DataFrame, threshold: float = DISTURBED_SLOWDOWN) -> pd.DataFrame:
    """A copy of ``runs`` with ``step_slowdown`` and a boolean ``disturbed`` per cell.

    A cell that logged ``step_drift`` judged its own window (``measure.costs.step_drift``: its plain target step,
    read by the loop's clock quarter by quarter, and its probes just before and after, against each other): it is
    disturbed at ``DISTURBED_DRIFT`` or more, and a machine uniformly slower over the whole window is not. Older
    cells (no ``step_drift``):

    A cell's probes (``probe_before_ms``, ``probe_after_ms``: the target's step on a fixed prompt just before
    and after its window) are compared with its pair's step calibrated by the driver at the sweep's start
    (``calibrated_target_step_ms``); cells of a store without a calibration (or run by an older driver) are
    compared with the fastest probe of the same pair on the same device (the machine's quiet speed as the
    sweep saw it). Disturbed: the slower probe is at least ``threshold`` times the reference. Cells without
    probes are never flagged (``step_slowdown`` NaN)."""
    out = runs.copy()
    if "step_drift" in out:  # the cell judged its own window (measure.costs.step_drift): the loop's clock and probes
        drift = pd.to_numeric(out["step_drift"], errors="coerce")
        if drift.notna().any():
            older = mark_disturbed(runs.drop(columns="step_drift"), threshold) if drift.isna().any() else None
            out["step_slowdown"] = drift if older is None else drift.fillna(older["step_slowdown"])
            flagged = drift >= DISTURBED_DRIFT
            out["disturbed"] = (flagged if older is None else flagged.where(drift.notna(), older["disturbed"])).astype(
                bool
            )
            return out
    probe_cols = [c for c in ("probe_before_ms", "probe_after_ms") if c in out]
    if not probe_cols or out.empty:
        out["step_slowdown"] = out.get("step_slowdown", pd.Series(math.nan, index=out.index))
        out["disturbed"] = False
        return out
    probes = out[probe_cols].apply(pd.to_numeric, errors="coerce")
    slowest = probes.max(axis=1)
    calibrated = (
        pd.to_numeric(out["calibrated_target_step_ms"], errors="coerce")
        if "calibrated_target_step_ms" in out
        else pd.Series(math.nan, index=out.index)
    )
    group = [c for c in ("pair", "device") if c in out]
    quickest = probes.min(axis=1)
    fastest = (
        quickest.groupby([out[c].astype(str) for c in group]).transform("min")
        if group
        else pd.Series(quickest.min(), index=out.index)
    )
    reference = calibrated.where(calibrated.notna() & (calibrated > 0), fastest)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["step_slowdown"] = slowest / reference
    out["disturbed"] = (out["step_slowdown"] >= threshold).fillna(False).astype(bool)
    return out


def without_disturbed_timing(runs: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``runs`` whose timing columns (tokens/s, J/token and their ratios) are NaN for disturbed cells:
    means over seeds then use only undisturbed cells; the cells' other metrics (tokens/step, score) stay."""
    out = mark_disturbed(runs) if "disturbed" not in runs or runs["disturbed"].dtype != bool else runs.copy()
    for col in TIMING_COLUMNS:
        if col in out:
            out[col] = out[col].where(~out["disturbed"])
    return out
