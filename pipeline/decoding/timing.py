"""The one step-timing loop: median wall times of device work, each call bracketed by a device sync.

Used by the machine probe (``pipeline.measure.costs.step_times`` / ``probe_step_ms``), the bench's step profile
(``pipeline.bench.profile``) and copy bandwidth; a cell's and a bench row's costs come from the loop's own clock
(``phase_clock``), never from here.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def _no_sync() -> None:
    """A device without queued work (the CPU)."""


def median_times(
    *steps: Callable[[], object],
    reps: int,
    warmup: int = 0,
    sync: Callable[[], None] = _no_sync,
    after: Callable[[], object] | None = None,
) -> list[float]:
    """Median seconds of each of ``steps`` over ``reps`` rounds after ``warmup`` untimed ones.

    A round calls every step once, in order (steps are interleaved, so a drift in the machine's load hits them
    alike); each call runs between two ``sync()`` calls on the clock, and ``after()`` (a cache rollback) runs
    after it, off the clock. Returns one median per step."""
    times: list[list[float]] = [[] for _ in steps]
    for r in range(warmup + reps):
        for step, out in zip(steps, times):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            if r >= warmup:
                out.append(time.perf_counter() - t0)
            if after is not None:
                after()
    return [statistics.median(t) for t in times]
