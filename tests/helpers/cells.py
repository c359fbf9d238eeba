"""Cells built by hand, for tests of the tracking and analysis layers that log runs without a sweep.

``make_cell`` fills what a test does not care about with small valid values; the key defaults to the
hash of the cell's identity, as the planner computes it (``pipeline.sweep.plan``).
"""

from __future__ import annotations

from typing import Any

from pipeline.cell_types import Cell, cell_key
from pipeline.sweep.plan import HARNESS_VERSION


def make_cell(
    key: str | None = None,
    *,
    label: str | None = None,
    method: str = "spd",
    params: dict[str, Any] | None = None,
    pair: dict[str, Any] | None = None,
    dataset: dict[str, Any] | str = "humaneval",
    seed: int = 0,
    sweep: str = "t",
    measure: dict[str, Any] | None = None,
    hardware: str = "any",
    harness: str = HARNESS_VERSION,
    method_config: str | None = None,
    **fields: Any,
) -> Cell:
    """A ``Cell`` (``fields``: ``judge``, ``baseline``, ``fault``, ``isolation``)."""
    params = {"gamma": 4} if params is None and method == "spd" else dict(params or {})
    pair = dict(pair or {"name": "tiny"})
    dataset = {"name": dataset} if isinstance(dataset, str) else dict(dataset)
    measure = dict(measure or {})
    if key is None:
        key = cell_key(
            {
                "harness": harness,
                "method": {"name": method, "params": params},
                "pair": pair,
                "dataset": dataset,
                "seed": seed,
                "measure": measure,
                "judge": None,
                "hardware": hardware,
            }
        )
    return Cell(
        key=key,
        sweep=sweep,
        label=label or method,
        method=method,
        params=params,
        method_config=method_config or method,
        pair=pair,
        dataset=dataset,
        seed=seed,
        measure=measure,
        hardware=hardware,
        harness=harness,
        **fields,
    )
