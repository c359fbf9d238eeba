"""The loop's own clock: each iteration's wall time in four phases, and the costs the loop pays, measured live.

    clock = PhaseClock(device)           # BatchedDecoder owns one (``engine.clock``)
    clock.enter("draft"); ...; clock.enter("verify"); ...; clock.enter("rule"); ...; clock.enter("other")
    clock.end_iteration(rows=..., positions=..., drafted=..., emitted=..., context=..., requests=...)
    clock.records()                      # [Iteration]: per iteration its phases' seconds and what it did
    clock.totals()                       # {"draft": s, "verify": s, "rule": s, "other": s}

The phases (``PHASES``): ``draft`` (the drafter's proposal, chains, beams and trees, and its feedback), ``verify``
(the target's forward over the iteration's rows; mtjd's beam draws on the target; beam search's whole
``generate``), ``rule`` (acceptance, resampling, emitting, KV rollback) and ``other`` (admission and the batch-1
prefill, warping outside the rule, host copies, bookkeeping). The clock is in exactly one phase from ``start`` to
``stop`` except while it is ``pause``d (the caller's callbacks: a window's records, formatting a later turn; under a
workload, the wait for the next arrival with nothing to decode), so the four phases sum to the loop's wall time less
the paused time.

On CPU each transition reads ``time.perf_counter`` (one call and a few additions); on CUDA it records a CUDA event
on the current stream (no synchronisation) and the events are read once, when ``records`` or ``totals`` is first
asked for after ``stop``: the phases are then the stream's time between the transitions.

``LiveCosts`` turns the iterations into the cost model the draft-length rule reads while the loop runs (a request's
``draft_cost: auto`` / ``verify_cost: auto``): t_step (a plain target step at the current occupancy), c (one draft
position over t_step) and v (one more drafted position's verified rows over t_step), smoothed so that they follow
the machine and the contexts as they change. ``pipeline.measure.costs.cost_model`` fits the same model to a window's
records for the cell's metrics.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

PHASES = ("draft", "verify", "rule", "other")
OFF = "off"  # paused: the caller's time, on no phase
HALF_LIFE = 16  # LiveCosts: iterations over which an old observation's weight halves
CALIBRATION_ROUNDS = 2  # LiveCosts is ready once each of two row counts has been seen this many times


@dataclass
class Iteration:
    """One iteration of the loop: its phases' seconds and what it did. ``rows``: target rows verified (every live
    request's, a new request's prompt included at batch > 1: ``prefill_rows`` of them); ``positions``: sequential
    draft positions (the longest chain, the deepest tree level, the beams' length); ``drafted``: draft tokens over
    the requests (chain tokens, tree nodes); ``emitted``: tokens emitted; ``context``: the live requests' context
    tokens before the iteration, summed; ``requests``: live requests (the batch's occupancy)."""

    draft_s: float = 0.0
    verify_s: float = 0.0
    rule_s: float = 0.0
    other_s: float = 0.0
    rows: int = 0
    prefill_rows: int = 0
    positions: int = 0
    drafted: int = 0
    emitted: int = 0
    context: int = 0
    requests: int = 0

    @property
    def wall_s(self) -> float:
        return self.draft_s + self.verify_s + self.rule_s + self.other_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PhaseClock:
    """Wall time per phase per iteration, from inside the loop (see the module doc). ``now``: the CPU clock
    (``time.perf_counter``; a test may inject its own); ``device``: CUDA events on a CUDA device."""

    def __init__(self, device: torch.device | str | None = None, now: Callable[[], float] = time.perf_counter) -> None:
        device = torch.device(device) if device is not None else torch.device("cpu")
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        self.device = device
        self.now = now
        self.observers: list[Callable[[Iteration], None]] = []
        self.reset()

    def reset(self) -> None:
        """Forget every record (a window starts its own)."""
        self._records: list[Iteration] = []
        self._counts: list[tuple[int, ...]] = []
        self._marks: list[tuple[Any, str]] = []  # CUDA: (event, phase entered at it)
        self._bounds: list[int] = []  # CUDA: index of each iteration's last mark
        self._phase = OFF
        self._stopped = False
        self._last = 0.0
        self._acc = dict.fromkeys(PHASES, 0.0)
        self._tail = dict.fromkeys(PHASES, 0.0)  # CPU: time after the last iteration, before ``stop``
        self.transitions = 0  # clock reads / events recorded (the clock's own cost: this many times one read)

    # ------------------------------------------------------------------------------------------- transitions

    def _mark(self, phase: str) -> None:
        self.transitions += 1
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append((event, phase))
        else:
            t = self.now()
            if self._phase != OFF:
                self._acc[self._phase] += t - self._last
            self._last = t
        self._phase = phase

    def enter(self, phase: str) -> None:
        """From now on the time is ``phase``'s (one of ``PHASES``)."""
        if phase != self._phase:
            self._mark(phase)

    def start(self) -> None:
        """The loop starts (in ``other``)."""
        self._stopped = False
        self._mark("other")

    def pause(self) -> str:
        """The caller's time begins (on no phase); returns the phase to ``resume``."""
        phase = self._phase
        if phase != OFF:
            self._mark(OFF)
        return phase

    def resume(self, phase: str) -> None:
        if phase != OFF:
            self._mark(phase)

    def stop(self) -> None:
        """The loop ends: the time since the last iteration goes to the last record (``other`` mostly)."""
        if self._phase != OFF:
            self._mark(OFF)
        self._stopped = True
        if self.cuda:
            return
        if self._records:
            last = self._records[-1]
            for p in PHASES:
                setattr(last, f"{p}_s", getattr(last, f"{p}_s") + self._acc[p])
        else:
            for p in PHASES:
                self._tail[p] += self._acc[p]
        self._acc = dict.fromkeys(PHASES, 0.0)

    def end_iteration(
        self,
        rows: int = 0,
        prefill_rows: int = 0,
        positions: int = 0,
        drafted: int = 0,
        emitted: int = 0,
        context: int = 0,
        requests: int = 0,
    ) -> None:
        """One iteration ends: its phases' time so far and what it did (``Iteration``'s count fields)."""
        counts = (rows, prefill_rows, positions, drafted, emitted, context, requests)
        if self.cuda:
            self._mark(self._phase)  # the boundary: the same phase goes on
            self._counts.append(counts)
            self._bounds.append(len(self._marks) - 1)
            if self.observers:  # the live estimate needs the times now: read the events up to here (one sync)
                self._resolve()
                for f in self.observers:
                    f(self._records[-1])
            return
        t = self.now()
        acc = self._acc
        if self._phase != OFF:
            acc[self._phase] += t - self._last
        self._last = t
        self.transitions += 1
        it = Iteration(acc["draft"], acc["verify"], acc["rule"], acc["other"], *counts)
        acc["draft"] = acc["verify"] = acc["rule"] = acc["other"] = 0.0
        self._records.append(it)
        for f in self.observers:
            f(it)

    # ------------------------------------------------------------------------------------------- reading

    def _segments(self, lo: int, hi: int) -> dict[str, float]:
        """CUDA: seconds per phase between marks ``lo`` and ``hi`` (each segment is its first mark's phase)."""
        times = dict.fromkeys(PHASES, 0.0)
        for k in range(lo, hi):
            event, phase = self._marks[k]
            if phase in times:
                times[phase] += event.elapsed_time(self._marks[k + 1][0]) / 1e3
        return times

    def _resolve(self) -> None:
        """CUDA: turn the recorded events of finished iterations into records (one synchronisation); after
        ``stop``, the time after the last iteration joins the last record."""
        if not self.cuda:
            return
        if len(self._records) < len(self._counts) or (self._stopped and self._marks):
            torch.cuda.synchronize(self.device)
        for i in range(len(self._records), len(self._counts)):
            lo = self._bounds[i - 1] if i > 0 else 0
            times = self._segments(lo, self._bounds[i])
            draft, verify, rule, other = (times[p] for p in PHASES)
            self._records.append(Iteration(draft, verify, rule, other, *self._counts[i]))
        if self._stopped and len(self._marks) > 1:  # stopped: the tail after the last boundary
            lo = self._bounds[-1] if self._bounds else 0
            tail = self._segments(lo, len(self._marks) - 1)
            if self._records:
                last = self._records[-1]
                for p in PHASES:
                    setattr(last, f"{p}_s", getattr(last, f"{p}_s") + tail[p])
            else:
                for p in PHASES:
                    self._tail[p] += tail[p]
            self._marks = self._marks[lo:] if not self._bounds else [self._marks[-1]]
            self._bounds = [0] * len(self._bounds)  # every iteration is resolved; the next starts at mark 0

    def records(self) -> list[Iteration]:
        self._resolve()
        return list(self._records)

    def totals(self) -> dict[str, float]:
        """Seconds per phase over every iteration since ``reset``."""
        out = dict(self._tail)
        for it in self.records():
            for p in PHASES:
                out[p] += getattr(it, f"{p}_s")
        return out


def _ema(old: float, new: float, count: float) -> float:
    """An exponential average that is the plain mean over its first ``HALF_LIFE`` observations."""
    w = max(1.0 / count, 1.0 - 0.5 ** (1.0 / HALF_LIFE))
    return new if count <= 1 else old + w * (new - old)


class LiveCosts:
    """The loop's cost model while it runs, from its ``Iteration`` records (``observe``).

    - the target's pass: per row count (iterations without a prompt's rows), a smoothed verify time; the slope b
      (seconds per extra row) is a least-squares line through those points, each weighted by its count (capped);
    - ``t_step(requests)``: a plain step of ``requests`` rows (the smoothed time at that count, else the line's);
    - ``c(requests)``: the smoothed draft time per draft position over ``t_step``;
    - ``v(requests)``: ``requests * b / t_step``: what one more drafted position of every request adds to the pass.

    ``ready`` once two row counts have each been seen ``CALIBRATION_ROUNDS`` times and a draft has been timed; until
    then a policy that reads it drafts a calibration schedule (``DraftLength.budget``)."""

    def __init__(self) -> None:
        self.by_rows: dict[int, list[float]] = {}  # rows -> [smoothed verify seconds, count]
        self.draft = [0.0, 0]  # smoothed draft seconds per position, count
        self.requests = 1

    def observe(self, it: Iteration) -> None:
        if it.requests:
            self.requests = it.requests
        if it.rows > 0 and it.prefill_rows == 0 and it.verify_s > 0:
            point = self.by_rows.setdefault(it.rows, [0.0, 0])
            point[1] += 1
            point[0] = _ema(point[0], it.verify_s, point[1])
        if it.positions > 0 and it.draft_s > 0:
            self.draft[1] += 1
            self.draft[0] = _ema(self.draft[0], it.draft_s / it.positions, self.draft[1])

    @property
    def ready(self) -> bool:
        seen = sum(1 for _, n in self.by_rows.values() if n >= CALIBRATION_ROUNDS)
        return seen >= 2 and self.draft[1] >= 1

    def slope(self) -> float:
        """Seconds per extra verified row (NaN with fewer than two row counts)."""
        pts = [(r, t, min(n, HALF_LIFE)) for r, (t, n) in self.by_rows.items()]
        if len(pts) < 2:
            return math.nan
        w = sum(n for *_, n in pts)
        mx = sum(r * n for r, _, n in pts) / w
        my = sum(t * n for _, t, n in pts) / w
        sxx = sum(n * (r - mx) ** 2 for r, _, n in pts)
        return sum(n * (r - mx) * (t - my) for r, t, n in pts) / sxx if sxx > 0 else math.nan

    def t_step(self, requests: int | None = None) -> float:
        """Seconds of a plain step at ``requests`` rows (default: the current occupancy)."""
        rows = self.requests if requests is None else requests
        if rows in self.by_rows:
            return self.by_rows[rows][0]
        b = self.slope()
        if not self.by_rows or not math.isfinite(b):
            return math.nan
        nearest = min(self.by_rows, key=lambda r: (abs(r - rows), r))
        return max(self.by_rows[nearest][0] + b * (rows - nearest), 1e-12)

    def c(self, requests: int | None = None) -> float:
        t = self.t_step(requests)
        return self.draft[0] / t if self.draft[1] and t > 0 else math.nan

    def v(self, requests: int | None = None) -> float:
        n = self.requests if requests is None else requests
        t, b = self.t_step(n), self.slope()
        return max(0.0, n * b / t) if t > 0 and math.isfinite(b) else math.nan
