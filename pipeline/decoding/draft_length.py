"""Draft lengths that adapt: when a chain method stops drafting (``draft_stop``; docs/ALGORITHMS.md section 21).

Every chain method (spd, block, hsd, hsd_ref, typical over a chain, mtad) takes three parameters, with every
chain drafter (model, eagle, eagle3, ngram, a drafter of your own):

- ``draft_stop: none`` (the default): a chain of ``gamma`` drafts (shortened near ``max_new_tokens``), as before;
- ``draft_stop: confidence``: ``gamma`` becomes the most; drafting stops after the first draft whose own warped
  probability ``q_i(x_i)`` is under ``draft_threshold`` (the draft's confidence, as EAGLE-2 ranks its tree by and
  SpecDec++ stops on): threshold 0 never stops early, 1 stops after the first draft that is not certain. A
  deterministic draft (n-gram lookup's one-hot rows, and every drafter at temperature 0, whose warped rows are
  one-hot) is always certain, so the rule never fires there;
- ``draft_stop: acceptance``: before drafting, the length ``g`` in ``1..gamma`` that maximises Leviathan's
  expected tokens per unit cost ``(1 - a^(g+1)) / ((1 - a)(g (c + v) + 1))`` with ``c = draft_cost``,
  ``v = verify_cost`` and ``a`` this request's running acceptance estimate: (1 + drafts accepted) / (2 + drafts
  examined) over its iterations so far (an iteration that accepted n of g examined n + 1, or g when all passed; the
  +1/+2: a uniform prior). ``v`` is what each draft adds to the verification pass, as a share of a target step:
  0 (Leviathan's model) where the pass is memory-bound (a GPU, a CPU with AVX512-BF16: 5 rows ~1.24 steps), about
  0.35 where every row is multiply-adds at the compute roofline (the bf16 kernels on AVX2: 5 rows ~2.4 steps).
  ``draft_cost: auto`` / ``verify_cost: auto``: read live from the loop's own clock (``phase_clock.LiveCosts``, fed
  by ``BatchedDecoder``'s ``PhaseClock`` every iteration and smoothed over the last ``HALF_LIFE`` iterations): c = the
  draft phase per draft position over a plain target step at the batch's current occupancy, v = the extra verified
  rows' cost per drafted position over that step (the slope of the verify phase against rows), so the rule follows
  the costs the requests actually pay (mtad's c is its beams', a tree's its levels'); until both are measured the
  policy drafts the calibration schedule (``calibration_length``: gamma, gamma - 1, ..., 0 in turn; in a cell the
  warm-up does, so the window starts measured). ``draft_min: 0`` lets the
  rule choose no draft at all: where no length ``g >= 1`` beats a plain step (``g = 0``: one token for one step,
  the same formula at g = 0) the iteration is a plain target step (an ar step); every ``PROBE_EVERY``-th iteration
  the rule sends to a plain step drafts one token instead, so the running estimate keeps learning (a request whose
  acceptance rises goes back to drafting). ``draft_min: 1`` (the default) always drafts at least one token, as before;
- ``draft_stop: load``: ``acceptance`` at the costs of this iteration's batch (``load_aware_length``): the loop tells
  each request's policy how many of its slots are live (``observe_load``, ``decoding/batched.py``), and a verified
  row's cost rises from ``verify_cost`` (a request alone) to ``verify_cost_full`` (a full batch; 1 = as dear as a
  step's own row, a compute-bound device) with the share of the other slots busy, so one configuration drafts long
  at low load and short, or not at all, at high load. The costs are inputs (``costs_at``; the loop's live costs can
  replace them); the exactness argument below holds as for ``acceptance`` (the choice reads past verdicts and the
  occupancy, never the current draft).

Exactness: each rule reads only the draft (its rows and tokens) and the verdicts of past iterations, never the
target's rows of the current one, so the rule verifies whatever chain was proposed and every lossless rule stays
lossless. The acceptance length is fixed before the draft is drawn (a fixed gamma given the past). With
``draft_min: 0`` an iteration of length 0 is the loop's plain step (``batched.py``: one target forward, its
next token drawn from the warped target row, the drafter told that nothing was drafted): exactly an ar step, so the
output law of such an iteration is the target's; the choice between 0 and g >= 1 is made from past verdicts and the
iteration count only, so by the same argument every lossless rule stays lossless (tests/test_draft_length.py checks
spd and block with plain steps by chi-square). For the
confidence stop, a chain cut after draft K is the chain of a draft model q' that draws a token t* of target
probability 0 once the stop fires: token and block verification treat t* as a sure rejection whose residual is the
target row itself (the bonus row after K), so they act on the cut chain exactly as on the full-length chain of q',
for which they are exact (docs/ALGORITHMS.md section 21; tests/test_draft_length.py checks spd, block and hsd by
chi-square).

Where the stop is applied: ``Drafter.stop`` (set by the decoder) lets a drafter stop inside its own loop (the
draft model's token-by-token chain, ``drafting.draft_chain``); a drafter that proposes the whole chain in one call
(the draft model's fused C++ chain on the bf16 kernels, n-gram lookup, the EAGLE heads) is cut after the fact
(``cut``: its drafts past the stop were drawn and are discarded, and the drafter's cache is rolled back to what
the target kept by the usual ``feedback``), so there the stop saves verification rows but not draft time.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .base import Param, in_closed, in_half_open, one_of
from .phase_clock import LiveCosts

DRAFT_STOPS = ("none", "confidence", "acceptance", "load")
COSTED = ("acceptance", "load")  # the policies that weigh expected tokens against draft_cost / verify_cost
AUTO = "auto"  # draft_cost / verify_cost read live from the loop's clock
PROBE_EVERY = 8  # draft_min 0: every 8th iteration the rule sends to a plain step drafts a token (the estimate learns)


def number_or_auto(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    """``check`` for a number, or the string ``auto`` (measured live by the loop's clock)."""

    def checked(v: Any) -> str | None:
        problem = None if v == AUTO else check(v)
        return None if problem is None else f"{problem}, or auto (measured live by the loop's clock)"

    return checked


def draft_minimum(v: Any) -> str | None:
    return None if isinstance(v, int) and not isinstance(v, bool) and v in (0, 1) else "must be 0 or 1"


# The policy's parameters, declared by DraftVerifyDecoder (so by every chain method). ``keyed_at_default=False``:
# added after cell keys were pinned, they stay out of a cell's resolved parameters (and so its key) at their
# defaults, so every cell planned before them keeps its key (base.Param).
DRAFT_LENGTH_PARAMS: dict[str, Param] = {
    "draft_stop": Param(
        "none",
        one_of(*DRAFT_STOPS),
        "draft length: none = gamma drafts; confidence = stop under draft_threshold; acceptance = by the running "
        "acceptance estimate and draft_cost (gamma: the most); load = acceptance at the batch's occupancy (its "
        "verify cost rising to verify_cost_full at a full batch)",
        keyed_at_default=False,
    ),
    "draft_threshold": Param(
        0.5,
        in_closed(0.0, 1.0),
        "draft_stop: confidence: stop after a draft with q(x) under it",
        keyed_at_default=False,
    ),
    "draft_cost": Param(
        0.05,
        number_or_auto(in_half_open(0.0, 1.0)),
        "draft_stop: acceptance: c = t_draft / t_ar the length is chosen for (auto: the loop's clock)",
        keyed_at_default=False,
    ),
    "verify_cost": Param(
        0.0,
        number_or_auto(in_closed(0.0, 1.0)),
        "draft_stop: acceptance: v = what one more verified row adds to the target pass, over t_ar (0: memory-bound; "
        "auto: the loop's clock)",
        keyed_at_default=False,
    ),
    "draft_min": Param(
        1,
        draft_minimum,
        "draft_stop: acceptance or load: the fewest drafts of an iteration; 0 = a plain target step where no length "
        "pays",
        keyed_at_default=False,
    ),
    "verify_cost_full": Param(
        1.0,
        in_closed(0.0, 1.0),
        "draft_stop: load: v at a full batch (1: a compute-bound device, each verified row as dear as a step's own "
        "row; near verify_cost on a memory-bound one)",
        keyed_at_default=False,
    ),
}


def check_draft_length(values: dict[str, Any]) -> None:
    """A threshold or cost set for a policy that does not read it is an error naming the fix."""
    stop = values.get("draft_stop", "none")
    for key, policies in (
        ("draft_threshold", ("confidence",)),
        ("draft_cost", COSTED),
        ("verify_cost", COSTED),
        ("draft_min", COSTED),
        ("verify_cost_full", ("load",)),
    ):
        if key in values and values[key] != DRAFT_LENGTH_PARAMS[key].default and stop not in policies:
            policy = " or ".join(policies)
            raise ValueError(
                f"{key}={values[key]!r} is read only with draft_stop: {policy} (draft_stop is {stop!r}): "
                f"set draft_stop: {policies[0]}, or leave {key} at its default"
            )


def calibration_length(k: int, gamma: int) -> int:
    """The ``k``-th length (from 0) of the calibration schedule: gamma, gamma - 1, ..., 0, gamma, ... (0: a plain
    step). The warm-up drafts it (``BatchedDecoder(calibrate=True)``) and so does an ``auto`` cost not measured
    yet: the loop's clock then sees the target's pass at gamma + 1 row counts, and the drafter at every length."""
    return gamma - k % (gamma + 1) if gamma > 0 else 0


def tokens_per_cost(alpha: float, gamma: int, c: float, v: float = 0.0) -> float:
    """Leviathan's expected tokens per unit cost (1 - a^(g+1)) / ((1 - a)(g c + 1)): the arithmetic of
    ``pipeline.measure.bounds.leviathan_bound``, which the engine may not import (the measurement layer comes
    after it; tests/test_draft_length.py checks that the two agree). ``v``: each verified draft's share of a target
    step, added to the iteration's cost (``g (c + v) + 1``; 0 is Leviathan's memory-bound verification)."""
    tokens = float(gamma + 1) if alpha >= 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)
    return tokens / (gamma * (c + v) + 1.0)


def load_aware_length(
    alpha: float, gamma: int, occupancy: float, costs: Callable[[float], tuple[float, float]], minimum: int = 0
) -> int:
    """The draft length in ``minimum..gamma`` with the most expected tokens per unit cost at this batch:
    ``costs(occupancy) -> (c, v)`` are the draft's and one verified row's costs over a target step when
    ``occupancy`` (0..1: the share of the other slots busy, 0 alone, 1 at a full batch) of the batch decodes, the
    live costs the loop reads (ties: the shorter). At a full batch on a compute-bound device a verified row costs
    nearly a full row, so the length shrinks with the load, down to a plain step (0) where no draft pays."""
    c, v = costs(occupancy)
    return max(range(minimum, gamma + 1), key=lambda g: (tokens_per_cost(alpha, g, c, v), -g))


class DraftLength:
    """One decoder's draft-length policy and the running acceptance counts of its current request.

    ``cost`` / ``verify``: numbers, or ``"auto"``: read from ``live`` (the loop's clock) as it runs; ``minimum``: 1,
    or 0 to allow plain target steps (``draft_min``)."""

    def __init__(
        self,
        stop: str = "none",
        threshold: float = 0.5,
        cost: float | str = 0.05,
        verify: float | str = 0.0,
        minimum: int = 1,
        full: float = 1.0,
    ) -> None:
        if stop not in DRAFT_STOPS:
            raise ValueError(f"draft_stop must be one of {list(DRAFT_STOPS)}, got {stop!r}")
        if minimum not in (0, 1):
            raise ValueError(f"draft_min must be 0 or 1, got {minimum!r}")
        self.stop, self.threshold, self.minimum = stop, float(threshold), int(minimum)
        self.cost: float | None = None if cost == AUTO else float(cost)
        self.verify: float | None = None if verify == AUTO else float(verify)
        # auto: c and v read from the loop's clock as it runs (shared by every request's copy, ``fresh``)
        self.live: LiveCosts | None = LiveCosts() if stop in COSTED and None in (self.cost, self.verify) else None
        self.accepted = self.examined = self.plain = self.iterations = 0
        self.full = float(full)  # draft_stop: load: v at a full batch
        self.occupancy = 0.0  # draft_stop: load: the share of the other slots busy, set by the loop (``observe_load``)

    @classmethod
    def of(cls, args: Any) -> "DraftLength":
        """From a decoder's resolved parameters (the defaults where a method does not declare them)."""
        value: dict[str, Any] = {k: getattr(args, k, None) for k in DRAFT_LENGTH_PARAMS}
        value = {k: DRAFT_LENGTH_PARAMS[k].default if v is None else v for k, v in value.items()}
        return cls(
            str(value["draft_stop"]),
            float(value["draft_threshold"]),
            value["draft_cost"],
            value["verify_cost"],
            int(value["draft_min"]),
            float(value["verify_cost_full"]),
        )

    def fresh(self) -> "DraftLength":
        """A policy for one more request: the same parameters and calibrated costs, its counts from the prior."""
        policy = DraftLength(self.stop, self.threshold, 0.0, 0.0, self.minimum, self.full)
        policy.cost, policy.verify, policy.live = self.cost, self.verify, self.live
        return policy

    def costs(self) -> tuple[float, float] | None:
        """(c, v) as the rule reads them now: the numbers set, or the live clock's (``LiveCosts``: at the batch's
        current occupancy); None while an ``auto`` cost has not been measured yet (``LiveCosts.ready``)."""
        live = self.live
        if live is not None and not live.ready:
            return None
        c = self.cost if self.cost is not None else live.c() if live is not None else math.nan
        v = self.verify if self.verify is not None else live.v() if live is not None else math.nan
        if not (math.isfinite(c) and math.isfinite(v)):
            return None
        return max(c, 1e-9), max(v, 0.0)

    def start(self) -> None:
        """A new request: its acceptance estimate starts from the prior again."""
        self.accepted = self.examined = self.plain = self.iterations = 0

    @property
    def alpha(self) -> float:
        """This request's running acceptance estimate (1 + accepted) / (2 + examined)."""
        return (1 + self.accepted) / (2 + self.examined)

    def observe_load(self, live: int, slots: int) -> None:
        """``draft_stop: load``: ``live`` of the loop's ``slots`` decode this iteration (the loop calls it before
        proposing); the occupancy the costs read is the share of the other slots busy: 0 alone (batch 1 included),
        1 at a full batch."""
        self.occupancy = (live - 1) / (slots - 1) if slots > 1 else 0.0

    def costs_at(self, occupancy: float) -> tuple[float, float]:
        """(c, v) at ``occupancy`` (0..1): with costs set as numbers, c as set and v from ``verify_cost`` (a lone
        request's row) to ``full`` at a full batch, linearly in the share of the other slots busy; with ``auto`` costs,
        the loop's live ones (``LiveCosts`` reads them at the batch's current occupancy already)."""
        if self.live is not None:  # auto: the loop's live costs, already those of the batch's current occupancy
            costs = self.costs()
            if costs is None:
                raise RuntimeError("draft_cost / verify_cost: auto not measured yet (budget() drafts the calibration)")
            return costs
        assert self.cost is not None and self.verify is not None
        share = min(max(occupancy, 0.0), 1.0)
        return self.cost, self.verify + (max(self.full, self.verify) - self.verify) * share

    def best(self, gamma: int) -> int:
        """The length in ``draft_min..gamma`` with the most expected tokens per unit cost at the running estimate
        and the costs (``costs``; ties: the shorter; 0 is a plain step, one token for one step)."""
        costs = self.costs()
        if costs is None:
            raise RuntimeError(
                "draft_cost / verify_cost: auto not measured yet: budget() drafts a calibration schedule"
            )
        if self.stop == "load":
            return load_aware_length(self.alpha, gamma, self.occupancy, self.costs_at, self.minimum)
        a, (c, v) = self.alpha, costs
        return max(range(self.minimum, gamma + 1), key=lambda g: (tokens_per_cost(a, g, c, v), -g))

    def budget(self, gamma: int) -> int:
        """The most drafts of this iteration, given at most ``gamma`` (>= 1); 0 (``draft_min: 0`` only): a plain
        target step, except every ``PROBE_EVERY``-th one, which drafts one token (so the estimate keeps learning).
        While an ``auto`` cost is not measured yet (the loop's first iterations), the calibration schedule
        (``calibration_length``): lengths gamma, gamma - 1, ..., 0 in turn, so that the clock sees the pass at
        several row counts; chosen from the iteration count only, so every lossless rule stays lossless."""
        if self.stop not in COSTED:
            return gamma
        self.iterations += 1
        if self.costs() is None:
            return calibration_length(self.iterations - 1, gamma)
        if gamma <= 1 and self.minimum >= 1:
            return gamma
        g = self.best(gamma)
        if g == 0:
            self.plain += 1
            if self.plain % PROBE_EVERY == 0:
                return 1
        else:
            self.plain = 0
        return g

    def observe(self, proposed: int, kept: int) -> None:
        """After a verification: ``kept`` of ``proposed`` drafts accepted."""
        if proposed > 0:
            self.accepted += kept
            self.examined += min(kept + 1, proposed)

    def stops_after(self, confidence: float) -> bool:
        """The confidence stop on one draft's own probability ``q_i(x_i)``."""
        return self.stop == "confidence" and confidence < self.threshold

    def drafter_stop(self) -> Callable[[torch.Tensor, torch.Tensor], bool] | None:
        """What a drafter that stops inside its own loop calls after each draft: ``stop(q_row, token)``."""
        if self.stop != "confidence":
            return None
        return lambda row, token: self.stops_after(float(row[token]))

    def cut(self, confidences: torch.Tensor) -> int:
        """How many of a chain's drafts to keep, given each draft's own probability ``q_i(x_i)`` ``[g]``."""
        g = int(confidences.shape[0])
        if self.stop != "confidence" or g == 0:
            return g
        low = (confidences < self.threshold).nonzero()
        return int(low[0]) + 1 if low.numel() else g
