"""The sweep's grid axes beyond the seeds, read and checked: ``sweep.methods``'s ``"*"`` (every registered method),
the batch sizes (the sweep's and each entry's own), the workload's offered rates (``sweep.rates``, with the
``workload`` group) and the temperatures (``sweep.temperatures``); ``plan.expand`` crosses them into cells."""

from __future__ import annotations

import math
from typing import Any, Mapping

from omegaconf import DictConfig

from pipeline.decoding import METHODS
from pipeline.measure.workload import Workload
from pipeline.sweep.checks import MAX_BATCH_SIZE
from pipeline.sweep.compose import SweepConfigError, plain

EVERY_METHOD = "*"  # sweep.methods: every registered method (conf/sweep/all_methods.yaml)


def largest_batches(methods: list[dict[str, Any]], batch_sizes: list[int]) -> list[tuple[str, int]]:
    """``(where it is set, largest batch size)``: ``sweep.batch_sizes`` and each entry's own ``batch_sizes``."""
    out = [(f"sweep entry {m['label']!r}: batch_sizes", max(m["batch_sizes"])) for m in methods if m.get("batch_sizes")]
    if any(not m.get("batch_sizes") for m in methods):
        out.append(("sweep.batch_sizes", max(batch_sizes)))
    return out


def every_method(items: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """``sweep.methods`` with the entry ``"*"`` replaced by every registered method."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name, overrides in items:
        if name != EVERY_METHOD:
            out.append((name, overrides))
        elif overrides:
            raise SweepConfigError(
                f"sweep.methods: the entry {EVERY_METHOD!r} (every registered method) takes no keys, got "
                f"{sorted(overrides)}; set them in sweep.method_overrides or list the methods by name"
            )
        else:
            out.extend((n, {}) for n in METHODS.names())
    return out


def batch_axis(value: Any, where: str) -> list[int]:
    """A batch axis (``sweep.batch_sizes`` or an entry's own): a non-empty list of integers >= 1."""
    value = plain(value)
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in value)
    ):
        raise SweepConfigError(f"{where} must be a non-empty list of integers >= 1, got {value!r} (e.g. [1, 2, 4, 8])")
    if max(value) > MAX_BATCH_SIZE:
        raise SweepConfigError(
            f"{where} has {max(value)}: at most {MAX_BATCH_SIZE} requests decode together "
            f"(each slot holds a KV cache and may fork a drafter copy); e.g. {where}=[1,2,4,8]"
        )
    return sorted(set(value))


def rate_label(label: str, rate: float | None) -> str:
    """A label on a sweep's rate axis (``sweep.rates``): ``spd (batch 4) @ 2/s``; unchanged without one."""
    return label if rate is None else f"{label} @ {rate:g}/s"


def workload_axis(cfg: DictConfig, rates: Any) -> tuple[Workload, list[float] | None]:
    """The sweep's workload (``workload:``, ``slo:``) and its rate axis (``sweep.rates``: poisson only, each a finite
    number > 0); ``ValueError`` naming the fix."""
    node, slo = cfg.get("workload"), cfg.get("slo")
    workload = Workload.from_config(plain(node) if node is not None else None, plain(slo) if slo is not None else None)
    if rates is None:
        return workload, None
    rates = plain(rates)
    if workload.kind != "poisson":
        raise ValueError(
            f"sweep.rates is the poisson workload's axis (workload is {workload.kind!r}): set workload=poisson"
        )
    if not isinstance(rates, list) or not rates:
        raise ValueError(f"sweep.rates={rates!r}: a non-empty list of requests/s, e.g. [0.25, 0.5, 1, 2]")
    for r in rates:  # each rate as workload.rate would be checked
        Workload.from_config(dict(plain(node) or {}, rate=r), plain(slo) if slo is not None else None)
    return workload, sorted({float(r) for r in rates})


def temperature_axis(value: Any) -> list[float] | None:
    """``sweep.temperatures``: a non-empty list of finite numbers >= 0 (0: greedy), or null for none."""
    value = plain(value)
    if value is None:
        return None
    ok = isinstance(value, list) and bool(value)
    ok = ok and all(
        isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0 for t in value
    )
    if not ok:
        raise ValueError(f"sweep.temperatures={value!r}: a non-empty list of numbers >= 0, e.g. [0, 0.7, 1.0]")
    return sorted({float(t) for t in value})


def slice_label(ds: Mapping[str, Any]) -> str:
    """``humaneval[0:20]``, ``spider[ids=5]``, ``mt_bench``: a dataset slice as the driver names it."""
    if ds.get("ids") is not None:
        return f"{ds['name']}[ids={len(ds['ids'])}]"
    start, limit = int(ds.get("start") or 0), ds.get("limit")
    if not start and limit is None:
        return str(ds["name"])
    return f"{ds['name']}[{start}:{'' if limit is None else start + int(limit)}]"
