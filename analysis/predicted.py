"""What a cell's acceptance and draft lengths predict on another machine: a memory-bound accelerator with a compute
roof (``pipeline.measure.bounds.predicted_speedup`` pooled over each cell; ``claims`` re-exports it)."""

from __future__ import annotations

import math
from typing import Mapping

import pandas as pd

from pipeline.measure.bounds import GPU_ROOF_ROWS, pass_cost


def add_predicted_speedup(
    runs: pd.DataFrame,
    samples: pd.DataFrame,
    c_by_pair: Mapping[str, float | None],
    roof_rows: float = GPU_ROOF_ROWS,
) -> pd.DataFrame:
    """``runs`` with ``predicted_speedup`` per cell: its generations' tokens over their cost on a memory-bound
    accelerator with a compute roof (``pipeline.measure.bounds.predicted_speedup`` pooled over the cell: c the pair's,
    v = 0, a pass of g + 1 rows per request at the cell's batch size costing ``pass_cost`` steps: ``roof_rows`` rows
    cost one more step, A100's 153 by default), which is the speedup over ar at the same batch size there (ar's is 1:
    one token per step). The roof is what lets a batch effect appear: without it a batch-invariant engine predicts
    the same speedup at every batch size. ``samples`` need ``iterations`` and ``drafted_total``
    (``add_acceptance_columns``). NaN where the pair has no c."""
    out = runs.copy()
    if samples.empty or not {"iterations", "drafted_total", "new_tokens"} <= set(samples.columns):
        out["predicted_speedup"] = math.nan
        return out
    sums = samples.groupby("run_id")[["new_tokens", "iterations", "drafted_total"]].sum()
    values = []
    batch_col = out["batch_size"] if "batch_size" in out else pd.Series(1, index=out.index)
    batches = pd.to_numeric(batch_col, errors="coerce")
    for run_id, pair, batch in zip(out["run_id"], out["pair"], batches.fillna(1)):
        c = c_by_pair.get(pair)
        if run_id not in sums.index or c is None or not math.isfinite(float(c)):
            values.append(math.nan)
            continue
        tokens, iters, drafted = sums.loc[run_id]
        # the pass is linear in its rows (pass_cost), so the pooled iteration's cost is exact
        passes = iters * pass_cost(drafted / iters + 1.0, int(batch), roof_rows) if iters > 0 else 0.0
        cost = passes + float(c) * drafted
        values.append(float(tokens / cost) if cost > 0 else math.nan)
    out["predicted_speedup"] = values
    return out
