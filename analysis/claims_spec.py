"""Claims as data: the schema of ``analysis/claims.yaml`` (``Claim``, ``load_claims``), the statistics a claim
may name, and the verdict rules on an interval (``verdict``, ``samples_needed``). Claims are evaluated on a
sweep by ``analysis.claims``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from analysis.stats import MIN_PROMPTS
from pipeline.measure.bounds import expected_tokens

CLAIMS_FILE = Path(__file__).resolve().parent / "claims.yaml"
DIRECTIONS = ("greater", "less", "at_least", "at_most", "equivalent")
SCALES = ("relative", "absolute")
REQUIRES = ("cpu", "gpu", "cost_ratio")
Z_95, Z_POWER = 1.959964, 0.841621  # two-sided 5% test, 80% power
SUPPORTED, CONTRADICTED, INCONCLUSIVE = "supported", "contradicted", "inconclusive"
TOO_FEW = "too few prompts"  # verdict and status: fewer prompts than the exact test can decide with (stats.MIN_PROMPTS)
MEASUREMENT_PROBLEM = "measurement problem"  # a speedup above its own bound: the measurement, not the method
NO_DATA, DISTURBED = (
    "no data",
    "disturbed",
)  # statuses of claims left untested: no cells of a method; only disturbed cells
TIMING_STATISTICS = ("tokens_per_s", "speedup_over_bound", "j_per_token")  # decided on undisturbed cells only


@dataclass(frozen=True)
class Statistic:
    """How a claim's statistic is computed: the columns of a unit, and the effect from (reference units, method
    units)."""

    columns: tuple[str, ...]
    value: Callable[[np.ndarray, dict], float]  # statistic of one side's units
    one_sample: bool = False
    cell_level: bool = False  # units are cells paired by seed (runs frame), not generations
    needs: tuple[str, ...] = ()  # context keys: gamma, cost_ratio


def ratio_of_sums(u: np.ndarray, ctx: dict) -> float:
    den = u[:, 1].sum()
    return float(u[:, 0].sum() / den) if den > 0 else math.nan


def _mean(u: np.ndarray, ctx: dict) -> float:
    return float(u[:, 0].mean()) if u.size else math.nan


def _leviathan(u: np.ndarray, ctx: dict) -> float:
    """Leviathan's E[tokens/step] at alpha = the acceptance rate at draft position 1 (every drafting step
    reaches it), over the measured tokens/step: 1 when acceptance is i.i.d. over positions."""
    tokens, iters, acc, reached = (u[:, i].sum() for i in range(4))
    if iters <= 0 or reached <= 0:
        return math.nan
    return expected_tokens(acc / reached, int(ctx["gamma"])) / (tokens / iters)


def _predicted(u: np.ndarray, ctx: dict) -> float:
    """Tokens per unit of a memory-bound accelerator's cost (``pipeline.measure.bounds.predicted_speedup`` pooled):
    new tokens over (iterations + c x draft positions verified), c = ``gpu_cost_ratio`` (the pair's bytes ratio),
    v = 0; ar's is 1 (one token per step), so a method's over ar's is its predicted speedup there."""
    tokens, iters, drafted = (u[:, i].sum() for i in range(3))
    cost = iters + float(ctx["gpu_cost_ratio"]) * drafted
    return float(tokens / cost) if cost > 0 else math.nan


STATISTICS: dict[str, Statistic] = {
    "tokens_per_step": Statistic(("new_tokens", "steps"), ratio_of_sums),
    "tokens_per_s": Statistic(("new_tokens", "decode_s"), ratio_of_sums),
    "perplexity": Statistic(("perplexity",), _mean),
    "score": Statistic(("sample_score",), _mean),
    "j_per_token": Statistic(("j_per_token",), _mean, cell_level=True),
    "leviathan_tokens_per_step": Statistic(
        ("new_tokens", "iterations", "accepted_pos1", "reached_pos1"), _leviathan, one_sample=True, needs=("gamma",)
    ),
    "speedup_over_bound": Statistic(
        ("new_tokens", "decode_s", "iterations", "accepted_drafts", "reached"),
        ratio_of_sums,
        needs=("gamma", "cost_ratio"),
    ),
    # tokens/s over the ar cell of the same seed and batch size (stats.add_ratios), per cell paired by seed: compares
    # speedups across batch sizes (e.g. "spd (batch 16)" against "spd") or methods at one batch size
    "speedup": Statistic(("speedup",), _mean, cell_level=True),
    # the speed claims' second answer (issue 44): what the measured acceptance and draft lengths give on a
    # memory-bound accelerator (c from the pair's bytes ratio, v = 0), per generation (tokens_per_s's twin) or per
    # cell over ar at the same batch size (speedup's twin, ``analysis.transfer.add_predicted_speedup``)
    "predicted_tokens_per_cost": Statistic(
        ("new_tokens", "iterations", "drafted_total"), _predicted, needs=("gpu_cost_ratio",)
    ),
    "predicted_speedup": Statistic(("predicted_speedup",), _mean, cell_level=True),
}
# a speed claim's statistic -> its memory-bound prediction's
PREDICTED = {"tokens_per_s": "predicted_tokens_per_cost", "speedup": "predicted_speedup"}


@dataclass(frozen=True)
class Claim:
    """One testable claim (fields of ``claims.yaml``)."""

    id: str
    source: str
    wording: str
    method: str
    reference: str | None
    statistic: str
    scale: str = "relative"
    direction: str = "greater"
    margin: float = 0.0
    claimed: float | None = None
    requires: str = "cpu"
    command: str | None = None
    extra: dict = field(default_factory=dict)


def _check(entry: dict, where: str) -> None:
    missing = [k for k in ("id", "source", "wording", "method", "statistic") if entry.get(k) in (None, "", [])]
    if missing:
        raise ValueError(
            f"{where}: missing {', '.join(missing)} (every claim needs id, source, wording, method, statistic)"
        )
    for key, valid in (
        ("statistic", tuple(STATISTICS)),
        ("scale", SCALES),
        ("direction", DIRECTIONS),
        ("requires", REQUIRES),
    ):
        value = entry.get(key)
        if value is not None and value not in valid:
            raise ValueError(f"{where}: {key} {value!r} is not one of {', '.join(valid)}")
    stat = STATISTICS[entry["statistic"]]
    if entry.get("reference") is None and not stat.one_sample:
        raise ValueError(
            f"{where}: statistic {entry['statistic']!r} compares two methods; set `reference` (a label of the sweep)"
        )
    margin = entry.get("margin")
    margin = 0.0 if margin is None else margin
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin < 0:
        raise ValueError(
            f"{where}: margin must be a finite number >= 0 on the effect's scale (e.g. 0.05), not {margin!r}: "
            "an infinite margin would call any effect equivalent"
        )
    if entry.get("direction") == "equivalent" and not margin:
        raise ValueError(f"{where}: an equivalence claim needs a margin > 0 (the difference that counts as equal)")
    if (
        entry.get("scale", "relative") == "relative"
        and entry.get("direction") in ("at_least", "equivalent")
        and margin >= 1
    ):
        raise ValueError(
            f"{where}: a relative margin of {margin!r} allows any effect (a ratio cannot fall 100% or more below 1); "
            "use a margin below 1, e.g. 0.05 for 5%"
        )
    claimed = entry.get("claimed")
    if claimed is not None and (
        isinstance(claimed, bool) or not isinstance(claimed, (int, float)) or not math.isfinite(claimed)
    ):
        raise ValueError(f"{where}: claimed must be a finite number on the effect's scale or null, not {claimed!r}")


def load_claims(path: str | Path | None = None) -> list[Claim]:
    """The claims of ``path`` (default ``analysis/claims.yaml``), a list ``method`` expanded to one claim per entry."""
    path = Path(path) if path else CLAIMS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no claims file {path}; pass an existing YAML (see analysis/claims.yaml for the format)"
        )
    data = yaml.safe_load(path.read_text()) or {}
    entries = data.get("claims") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a top-level `claims:` list (see analysis/claims.yaml)")
    out, seen = [], set()
    known = {f for f in Claim.__dataclass_fields__ if f != "extra"}
    for i, entry in enumerate(entries):
        where = f"{path} claim {i + 1} ({entry.get('id', '?') if isinstance(entry, dict) else '?'})"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: each claim is a mapping")
        _check(entry, where)
        methods = entry["method"] if isinstance(entry["method"], list) else [entry["method"]]
        for m in methods:
            cid = f"{entry['id']}[{m}]" if len(methods) > 1 else str(entry["id"])
            if cid in seen:
                raise ValueError(f"{where}: duplicate claim id {cid!r}")
            seen.add(cid)
            values = {k: v for k, v in entry.items() if k in known}
            values.update(id=cid, method=str(m), margin=float(entry.get("margin") or 0.0))
            values["claimed"] = None if entry.get("claimed") is None else float(entry["claimed"])
            out.append(Claim(**values, extra={k: v for k, v in entry.items() if k not in known}))
    return out


# ----------------------------------------------------------------------------------- verdicts


def verdict(low: float, high: float, direction: str, margin: float = 0.0) -> str:
    """supported / contradicted / inconclusive from a CI [low, high] on the effect's scale.

    greater: low > 0 supports, high < 0 contradicts; less: the mirror; at_least (effect >= -margin):
    low > -margin supports, high < -margin contradicts; at_most: the mirror at +margin; equivalent:
    the CI inside (-margin, margin) supports, wholly outside it contradicts.
    """
    if not (math.isfinite(low) and math.isfinite(high)):
        return INCONCLUSIVE
    rules = {
        "greater": (low > 0, high < 0),
        "less": (high < 0, low > 0),
        "at_least": (low > -margin, high < -margin),
        "at_most": (high < margin, low > margin),
        "equivalent": (-margin < low and high < margin, low > margin or high < -margin),
    }
    if direction not in rules:
        raise ValueError(f"direction {direction!r} is not one of {', '.join(DIRECTIONS)}")
    ok, against = rules[direction]
    return SUPPORTED if ok else CONTRADICTED if against else INCONCLUSIVE


def to_d(value: float, scale: str) -> float:
    """An effect on the claim's scale onto the scale of the prompt-level effects (log ratio for relative)."""
    if scale != "relative":
        return value
    return math.log1p(value) if value > -1 else -math.inf


def from_d(value: float, scale: str) -> float:
    """The inverse of ``to_d``."""
    return math.expm1(value) if scale == "relative" else value


def boundaries(direction: str, margin: float = 0.0) -> tuple[float, ...]:
    """The effects (claim's scale) a CI must clear for a decisive verdict: 0, -margin, +margin or both."""
    return {
        "greater": (0.0,),
        "less": (0.0,),
        "at_least": (-margin,),
        "at_most": (margin,),
        "equivalent": (-margin, margin),
    }[direction]


def distance_to_decision(effect: float, direction: str, margin: float = 0.0, scale: str = "absolute") -> float:
    """How far the measured effect lies from the nearest boundary the CI must clear, on the scale of the
    prompt-level effects (log ratio for a relative claim)."""
    d = to_d(effect, scale)
    return min(abs(d - to_d(b, scale)) for b in boundaries(direction, margin))


def samples_needed(
    n: int, se: float, effect: float, direction: str, margin: float = 0.0, scale: str = "absolute"
) -> float:
    """Prompts for a decisive verdict at 80% power (two-sided 5%) if ``effect`` is the truth and the
    standard error (of the mean prompt-level effect, ``se``) shrinks as 1/sqrt(n): n ((1.96 + 0.84) se / distance)^2,
    never below the fewest prompts the exact test can decide with (``stats.MIN_PROMPTS``); inf when the
    effect sits on the boundary."""
    dist = distance_to_decision(effect, direction, margin, scale)
    if not (n and math.isfinite(se) and math.isfinite(dist)):
        return math.nan
    if dist <= 0:
        return math.inf
    return float(max(n, MIN_PROMPTS, math.ceil(n * ((Z_95 + Z_POWER) * se / dist) ** 2)))
