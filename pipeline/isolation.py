"""CPU isolation of a cell's process (``cell.isolation``, set by the driver's scheduler and recorded with the cell).

``exclusive`` (one cell per node, all its cores, torch threads = cores), ``pinned`` (this process is bound to a
disjoint core set with ``sched_setaffinity``, torch threads = its size) or ``shared``.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch


def apply_isolation(isolation: Mapping[str, Any] | None) -> dict[str, Any]:
    """Bind this process to the cell's cores and set torch's threads to match; what was applied."""
    iso = dict(isolation or {})
    cores = iso.get("cores")
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(int(c) for c in cores))
    threads = iso.get("threads")
    if threads:
        torch.set_num_threads(int(threads))
        os.environ["OMP_NUM_THREADS"] = str(int(threads))  # Ray sets 1 (its num_cpus) for child libraries
    iso["torch_threads"] = torch.get_num_threads()
    if hasattr(os, "sched_getaffinity"):
        iso["affinity"] = sorted(os.sched_getaffinity(0))
    return iso
