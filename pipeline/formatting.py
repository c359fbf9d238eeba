"""The one mean ± std format of the project's tables (the sweep's closing table and ``analysis/``).

A base-layer module with no project imports, so that the analysis package can format its tables
without importing the sweep (and through it Ray, torch and the engine).
"""

from __future__ import annotations

import math

MISSING = "–"


def fmt_mean_std(mean: float | None, std: float | None, digits: int = 2, latex: bool = False) -> str:
    """``m ± s`` (``m`` alone for one seed, ``MISSING`` without a value)."""
    if mean is None or not math.isfinite(mean):
        return MISSING
    if std is None or not math.isfinite(std):
        return f"{mean:.{digits}f}"
    pm = " $\\pm$ " if latex else " ± "
    return f"{mean:.{digits}f}{pm}{std:.{digits}f}"
