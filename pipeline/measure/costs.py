"""Step costs from the loop's own clock, and the machine's speed probe.

    model = cost_model(window_iterations, batch_size, calibration=warmup_iterations)
    #  {t_target_step_ms, t_draft_step_ms, t_verify_ms, cost_ratio_c, row_cost_v, time_*_s, phase_share_*, ...}
    drift = step_drift(window_iterations, model, probes_ms)   # {step_drift, disturbed}: did the window's step move?
    ms = probe_step_ms(target_model, device)                  # before and after each window

Every cost here is read off the iterations the decoding loop itself timed (``pipeline.decoding.phase_clock``:
``BatchedDecoder.clock``): no proposal, chain or tree is timed beside the loop. The cell's warm-up drafts the
calibration schedule (gamma, gamma - 1, ..., 0: ``BatchedDecoder(calibrate=True)``), so its iterations show the
target's pass at several row counts even for a method whose window drafts one fixed length; the slope of that pass
against rows comes from both (each with its own level), the step itself from the window's iterations alone.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Sequence

import torch

from pipeline.decoding.kv import CachedModel
from pipeline.decoding.phase_clock import PHASES, Iteration
from pipeline.decoding.timing import median_times
from pipeline.device import synchronize

PROBE_TOKENS = 32  # the probe's prompt: ids 1..32 (modulo the vocabulary), the same probe everywhere
DISTURBED_DRIFT = 1.3  # a window whose own step moved this much (slowest quarter / fastest, or probe after / before)
DRIFT_QUARTER = 8  # the in-loop quarters of step_drift need this many iterations each (fewer: the probes alone)
DISTURBED_SLOWDOWN = 1.5  # older cells (no step_drift): a probe this many times the sweep-start calibration


def draft_length(decoder: Any) -> int | None:
    """The chain length a decoder drafts per iteration as configured (gamma; bild: max_small_steps); None where
    it drafts no chain (trees, methods without a draft)."""
    if getattr(decoder, "shape", None) != "chain":
        return None
    depth = decoder.draft_depth
    return int(depth) if isinstance(depth, int) and not isinstance(depth, bool) else None


def step_times(
    model: Any, prompt: Sequence[int], gamma: int, device: torch.device | str, reps: int = 20
) -> tuple[float, float]:
    """Median single-token step time and median (gamma + 1)-token forward time, batch 1, with a KV cache: the
    machine probe's primitive (``probe_step_ms``) and the distillation's speed check, never a cell's cost model."""
    device = torch.device(device)
    prompt = list(prompt)
    cm = CachedModel(model)
    with torch.inference_mode():
        cm.prefill(prompt)
        length = cm.length
        single, block = median_times(
            lambda: cm.forward(prompt[-1:], keep=1),
            lambda: cm.forward(prompt[-(gamma + 1) :], keep=gamma + 1),
            reps=reps,
            sync=lambda: synchronize(device),
            after=lambda: cm.rollback(length),
        )
    return single, block


def probe_step_ms(model: Any, device: torch.device | str, reps: int = 10) -> float:
    """The target's single-token step after a fixed ``PROBE_TOKENS``-token prompt (median of ``reps``,
    milliseconds): the machine's speed just before and just after a window (``step_drift``)."""
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or PROBE_TOKENS + 1)
    prompt = [1 + i % (vocab - 1) for i in range(PROBE_TOKENS)] if vocab > 1 else [0] * PROBE_TOKENS
    return 1e3 * step_times(model, prompt, 1, device, reps=reps)[0]


def _steady(iterations: Iterable[Iteration]) -> list[Iteration]:
    """Iterations whose pass verified rows and no prompt (a new request's prefill rides in its first step at
    batch > 1: that pass is another kind of work)."""
    return [it for it in iterations if it.rows > 0 and it.prefill_rows == 0 and it.verify_s > 0]


def row_slope(groups: Sequence[Sequence[Iteration]]) -> float:
    """Seconds per verified row: per group (the window, the warm-up) the median verify phase at each row count (a
    preempted iteration moves a median little), then the least-squares slope through those medians weighted by their
    counts, each group about its own mean (a machine phase between the groups moves the level, not the slope);
    never below 0 (a verified row costs something or nothing); NaN where no group's rows vary."""
    sxy = sxx = 0.0
    for group in groups:
        by: dict[int, list[float]] = {}
        for it in group:
            by.setdefault(it.rows, []).append(it.verify_s)
        if len(by) < 2:
            continue
        points = [(r, statistics.median(v), len(v)) for r, v in by.items()]
        w = sum(n for *_, n in points)
        mx = sum(r * n for r, _, n in points) / w
        my = sum(m * n for _, m, n in points) / w
        sxx += sum(n * (r - mx) ** 2 for r, _, n in points)
        sxy += sum(n * (r - mx) * (m - my) for r, m, n in points)
    return max(0.0, sxy / sxx) if sxx > 0 else math.nan


def plain_steps(iterations: Sequence[Iteration], slope: float, batch_size: int) -> list[float]:
    """Each steady iteration's pass brought to a plain step of ``batch_size`` rows (its verify time less the slope
    times its rows beyond ``batch_size``, plus it times the rows it lacks), kept between the pass itself and its rows'
    share of it (a pass of more rows costs more, and at most in proportion to its rows: above ``batch_size`` rows the
    step is at least the share, below it at most the share, which a partly filled batch under a workload reaches at
    every iteration): the target's step as the window paid it, iteration by iteration."""
    out = []
    for it in _steady(iterations):
        if it.rows == batch_size:
            out.append(it.verify_s)
        elif math.isfinite(slope):
            low, high = sorted((it.verify_s, it.verify_s * batch_size / it.rows))
            out.append(min(max(it.verify_s - slope * (it.rows - batch_size), low), high))
    return out


def cost_model(
    iterations: Sequence[Iteration],
    batch_size: int,
    calibration: Sequence[Iteration] = (),
    step_hint_s: float | None = None,
) -> dict[str, float]:
    """The window's cost model and time breakdown, from its own iterations (``calibration``: the warm-up's, which
    drafted the calibration schedule).

    - ``time_draft_s``, ``time_verify_s``, ``time_rule_s``, ``time_other_s``: the phases over the window (they sum
      to the loop's wall time) and ``phase_share_*`` of their sum;
    - ``t_target_step_ms``: a plain target step of ``batch_size`` rows at the contexts the window ran (the mean of
      ``plain_steps``; ``step_hint_s`` where there is none to read: a window that drafted one row count only, with no
      warm-up schedule beside it, the probes' step at batch 1); ``t_verify_ms``: the mean pass of an iteration that
      drafted; ``t_draft_step_ms``: the draft phase per draft position (a chain's token, MTAD's beams' position, a
      tree's level) over the window (over the warm-up where the window drafted nothing: plain steps only);
    - ``cost_ratio_c`` = t_draft / t_step, ``row_cost_v`` = batch_size * slope / t_step (what one more drafted
      position of every request adds to the pass, over a step);
    - ``speedup_bound``: over the iterations without a prompt's rows, tokens per second of model work (the draft and
      verify phases only) over a plain step's tokens per second at each iteration's occupancy: the speedup over ar
      if rule and other cost nothing (ar: 1);
    - ``iterations``, ``rows_per_iteration``, ``context_mean`` (a request's context, tokens)."""
    its = list(iterations)
    totals = {p: sum(getattr(it, f"{p}_s") for it in its) for p in PHASES}
    wall = sum(totals.values())
    out: dict[str, float] = {f"time_{p}_s": totals[p] for p in PHASES}
    out.update({f"phase_share_{p}": (totals[p] / wall if wall > 0 else math.nan) for p in PHASES})
    slope = row_slope([_steady(its), _steady(calibration)])
    steps = plain_steps(its, slope, batch_size)
    t_step = statistics.fmean(steps) if steps else math.nan
    if not steps and step_hint_s is not None and math.isfinite(step_hint_s) and step_hint_s > 0:
        t_step = step_hint_s  # no plain step to read (no warm-up schedule, one row count): the probes' step
    drafting = [it for it in its if it.positions > 0]
    if not drafting:  # a window whose rule drafted nothing (plain steps): the drafter's cost as the warm-up timed it
        drafting = [it for it in calibration if it.positions > 0]
    positions = sum(it.positions for it in drafting)
    t_draft = sum(it.draft_s for it in drafting) / positions if positions else math.nan
    verified = [it.verify_s for it in _steady(drafting)]
    requests = sum(it.requests for it in its)
    out.update(
        iterations=float(len(its)),
        rows_per_iteration=sum(it.rows for it in its) / len(its) if its else math.nan,
        context_mean=sum(it.context for it in its) / requests if requests else math.nan,
        t_target_step_ms=1e3 * t_step,
        row_slope_ms=1e3 * slope,
    )
    steady = _steady(its)
    model_s = sum(it.draft_s + it.verify_s for it in steady)
    if model_s > 0 and t_step > 0:
        # Leviathan's bound with these measured costs, any method and batch: over the iterations without a prompt's
        # rows, tokens per second of model work (draft and verify phases only) over ar's, one token per request for
        # a plain step at each iteration's occupancy (the plain step less the slope's rows it lacks)
        slope_s = slope if math.isfinite(slope) else 0.0
        plain_s = sum(
            max(t_step - slope_s * (batch_size - it.requests), t_step * it.requests / batch_size) for it in steady
        )
        out["speedup_bound"] = (sum(it.emitted for it in steady) / model_s) / (
            sum(it.requests for it in steady) / plain_s
        )
    if drafting:
        out.update(
            t_draft_step_ms=1e3 * t_draft,
            t_verify_ms=1e3 * statistics.fmean(verified) if verified else math.nan,
            cost_ratio_c=t_draft / t_step if t_step > 0 else math.nan,
            row_cost_v=batch_size * slope / t_step if t_step > 0 and math.isfinite(slope) else math.nan,
        )
    return out


def step_drift(
    iterations: Sequence[Iteration], slope_ms: float, batch_size: int, probes_ms: Sequence[float | None] = ()
) -> dict[str, float]:
    """Whether the window's own step moved while it ran. ``step_drift`` is the larger of (the slowest quarter's
    median plain step over the fastest quarter's, the iterations in time order) and (the slower probe over the
    faster, just before and just after the window). ``disturbed`` is 1.0 when that ratio is ``DISTURBED_DRIFT`` or
    more and, for the quarters, also beyond their noise: the two medians differ by more than 3 standard errors (each
    from its quarter's median absolute deviation), so a steady but jittery machine is not flagged and a step that
    changes inside the window is. A machine uniformly slower for the whole window is not disturbed (its speed in own
    steps, ``tokens_per_target_step``, is what it always is). NaN for both without enough to compare."""
    ratios, flags = [], []
    steps = plain_steps(iterations, slope_ms / 1e3 if math.isfinite(slope_ms) else math.nan, batch_size)
    if len(steps) >= 4 * DRIFT_QUARTER:
        q = len(steps) // 4
        quarters = [steps[i * q : (i + 1) * q] for i in range(4)]
        medians = [statistics.median(x) for x in quarters]
        if min(medians) > 0:
            hi, lo = medians.index(max(medians)), medians.index(min(medians))
            ratio = medians[hi] / medians[lo]
            se = [
                1.253 * 1.4826 * statistics.median(abs(v - m) for v in x) / math.sqrt(len(x))
                for x, m in zip(quarters, medians)
            ]
            beyond_noise = medians[hi] - medians[lo] > 3.0 * math.hypot(se[hi], se[lo])
            ratios.append(ratio)
            flags.append(ratio >= DISTURBED_DRIFT and beyond_noise)
    probes = [float(p) for p in probes_ms if p is not None and math.isfinite(float(p)) and float(p) > 0]
    if len(probes) >= 2:
        ratios.append(max(probes) / min(probes))
        flags.append(ratios[-1] >= DISTURBED_DRIFT)
    if not ratios:
        return {"step_drift": math.nan, "disturbed": math.nan}
    return {"step_drift": max(ratios), "disturbed": 1.0 if any(flags) else 0.0}
