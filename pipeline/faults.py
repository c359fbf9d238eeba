"""Test-only fault injection into a cell's stages (``fault_injection`` in a sweep's config, ``Cell.fault``).

The driver's tests use it to fail a cell on purpose: raise an exception, kill the actor's process, or hang.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

from pipeline.cell_types import Cell


def inject_fault(cell: Cell, stage: str) -> None:
    """Test-only: fail this cell as ``cell.fault`` says (``raise``, ``exit`` the process, ``sleep``).

    ``fault`` is a mapping or a list of them: ``{kind, stage (default generate), methods, datasets,
    seeds, labels, seconds}``; a fault applies to cells matching every list given.
    """
    faults = cell.fault or []
    for fault in [faults] if isinstance(faults, Mapping) else faults:
        if fault.get("stage", "generate") != stage:
            continue
        fields = (
            ("methods", cell.method),
            ("datasets", cell.dataset_name),
            ("seeds", cell.seed),
            ("labels", cell.label),
        )
        if all(fault.get(f) is None or v in fault[f] for f, v in fields):
            _fail(fault, stage)


def _fail(fault: Mapping[str, Any], stage: str) -> None:
    kind = fault.get("kind", "raise")
    if kind == "raise":
        raise RuntimeError(f"injected fault in stage {stage!r} (fault_injection)")
    if kind == "exit":
        os._exit(int(fault.get("code", 1)))  # the actor process dies mid-cell
    if kind == "sleep":
        time.sleep(float(fault.get("seconds", 3600)))
        return
    raise ValueError(f"unknown fault kind {kind!r}; valid: raise, exit, sleep")
