"""MLflow tracking of a sweep (docs/DESIGN.md section 7), one module per job:

    layout    the names of the MLflow layout (tags, params, metrics, artifacts, statuses), defined once
    store     tracking URIs: resolved, checked before Ray starts; the store's errors
    leases    the store's creation lock and the drivers' per-cell and per-parent leases (local stores)
    tracker   ``Tracker``: resume queries and the writes of parent and cell runs

A cell's key (its identity's hash) is computed beside the ``Cell`` type (``pipeline.cell_types.cell_key``).
Only the driver writes; actors return a ``CellResult``. ``Tracker`` and ``pick_active`` (so MLflow) load on first
use (PEP 562): an actor imports ``layout`` alone, and MLflow's ~2.4 s of imports are not paid by every cell's process.
"""

from __future__ import annotations

import importlib
from typing import Any

from pipeline.tracking.layout import (
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_LOGGING,
    STATUS_SCORE_FAILED,
    flatten,
    numeric_metrics,
)
from pipeline.tracking.leases import FileLeases, store_lock
from pipeline.tracking.store import (
    StoreWriteError,
    TrackingError,
    check_tracking_uri,
    local_store_path,
    resolve_tracking_uri,
)

_LAZY = {"Tracker": "tracker", "pick_active": "tracker"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"pipeline.tracking.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'pipeline.tracking' has no attribute {name!r}")


__all__ = [
    "STATUS_FAILED",
    "STATUS_FINISHED",
    "STATUS_LOGGING",
    "STATUS_SCORE_FAILED",
    "FileLeases",
    "StoreWriteError",
    "Tracker",
    "TrackingError",
    "check_tracking_uri",
    "flatten",
    "local_store_path",
    "numeric_metrics",
    "pick_active",
    "resolve_tracking_uri",
    "store_lock",
]
