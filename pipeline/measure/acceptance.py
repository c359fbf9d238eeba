"""Acceptance metrics in the field's conventions, from a generation's per-iteration ``accepted`` lists.

Every metric comes in two forms, named by a suffix:

- ``_pooled``: summed over all iterations (tokens) of all requests, then divided (vLLM's Prometheus
  counters, Spec-Bench's "mean accepted tokens" over a run). Long answers weigh more.
- ``_per_request``: computed per request (generation), then averaged over requests (what a user of one
  request sees; vLLM users asked for it). Requests where a metric is undefined (no drafts) are left out.

The metrics (an iteration = one target verification forward; ``a_s`` = accepted drafts of iteration
s = tokens it emitted - 1; ``d_s`` = draft positions it put to the target):

- ``acceptance_length``: mean tokens emitted per iteration, bonus token included (vLLM's "mean
  acceptance length", Spec-Bench's "mean accepted tokens"; 1.0 for plain decoding);
- ``draft_acceptance_rate``: sum a_s / sum d_s (vLLM's "draft acceptance rate");
- ``acceptance_rate_pos<i>`` (i = 1..depth): accepted at draft position i / drafts reaching position i,
  i.e. #{s: a_s >= i} / #{s: d_s >= i and a_s >= i - 1} (a conditional rate: under Leviathan et al.'s
  i.i.d. assumption it is alpha at every position);
- ``alpha_positions``: the i.i.d. maximum-likelihood alpha from the same counts, sum(accepted at any
  position) / sum(drafts reaching any position) = reached-weighted mean of the per-position rates;
- ``alpha_implied``: the alpha whose Leviathan expectation (1 - alpha^(g+1)) / (1 - alpha) equals the
  measured acceptance length (g = the method's draft length).

``iid_check`` compares the two alphas and tests whether acceptance falls with position (position 1
against positions >= 2, a two-proportion z test). The last iteration of a request can be cut by EOS or
``max_new_tokens``; its tokens are counted as emitted (a draft cut off after acceptance counts as not
reached), the same way for every method.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from pipeline.measure.bounds import alpha_from_tokens_per_step, expected_tokens

POOLED, PER_REQUEST = "pooled", "per_request"
CONVENTIONS = {
    POOLED: "pooled over tokens: sums over every iteration of every request, then one ratio",
    PER_REQUEST: "per-request mean: the ratio per request (generation), then the mean over requests",
}
Z_FALL = 1.96  # |z| above which position 1 and positions >= 2 differ (two-sided 5%)


def reconstruct_drafted(accepted: Sequence[int], gamma: int, max_new_tokens: int | None = None) -> list[int]:
    """Draft positions per iteration for records logged without ``drafted``: the chain loop's rule
    ``min(gamma, max_new_tokens - emitted so far - 1)``, at least what was accepted."""
    out, done = [], 0
    for emitted in accepted:
        d = gamma if max_new_tokens is None else max(0, min(gamma, max_new_tokens - done - 1))
        out.append(max(d, int(emitted) - 1))
        done += int(emitted)
    return out


def position_counts(accepted: Sequence[int], drafted: Sequence[int]) -> tuple[list[int], list[int]]:
    """(reached, accepted_at): per draft position i = 1..max depth, how many iterations put a draft at
    position i to the target after accepting positions 1..i-1, and how many accepted it."""
    if len(accepted) != len(drafted):
        raise ValueError(f"accepted ({len(accepted)} iterations) and drafted ({len(drafted)}) differ in length")
    depth = max((int(d) for d in drafted), default=0)
    reached, acc = [0] * depth, [0] * depth
    for emitted, d in zip(accepted, drafted):
        a = min(max(int(emitted) - 1, 0), int(d))
        for i in range(1, int(d) + 1):  # position i is reached when i - 1 drafts were accepted
            if a >= i - 1:
                reached[i - 1] += 1
                if a >= i:
                    acc[i - 1] += 1
    return reached, acc


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan


def _mean(values: Iterable[float]) -> float:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else math.nan


def request_metrics(accepted: Sequence[int], drafted: Sequence[int]) -> dict[str, Any]:
    """One request's counts and ratios: iterations, tokens, drafted, accepted drafts, reached/accepted per position."""
    reached, acc_at = position_counts(accepted, drafted)
    acc_drafts = sum(min(max(int(e) - 1, 0), int(d)) for e, d in zip(accepted, drafted))
    drafted_total = sum(int(d) for d in drafted)
    return {
        "iterations": len(accepted),
        "tokens": sum(int(e) for e in accepted),
        "drafted": drafted_total,
        "accepted_drafts": acc_drafts,
        "reached": reached,
        "accepted_at": acc_at,
        "acceptance_length": _ratio(sum(int(e) for e in accepted), len(accepted)),
        "draft_acceptance_rate": _ratio(acc_drafts, drafted_total),
        "rates": [_ratio(a, r) for a, r in zip(acc_at, reached)],
    }


def acceptance_metrics(
    requests: Sequence[tuple[Sequence[int], Sequence[int]]], gamma: int | None = None
) -> dict[str, float]:
    """The flat per-cell metrics of module doc from ``(accepted, drafted)`` per request.

    Returns ``{}`` when no request drafted anything (methods without a draft). ``gamma`` (the method's
    draft length) gives ``alpha_implied``; without it the largest draft length seen is used.
    """
    per = [request_metrics(a, d) for a, d in requests]
    if not per or sum(p["drafted"] for p in per) == 0:
        return {}
    depth = max(len(p["reached"]) for p in per)
    reached = [sum(p["reached"][i] for p in per if i < len(p["reached"])) for i in range(depth)]
    acc_at = [sum(p["accepted_at"][i] for p in per if i < len(p["accepted_at"])) for i in range(depth)]
    out: dict[str, float] = {
        f"acceptance_length_{POOLED}": _ratio(sum(p["tokens"] for p in per), sum(p["iterations"] for p in per)),
        f"acceptance_length_{PER_REQUEST}": _mean(p["acceptance_length"] for p in per),
        f"draft_acceptance_rate_{POOLED}": _ratio(
            sum(p["accepted_drafts"] for p in per), sum(p["drafted"] for p in per)
        ),
        f"draft_acceptance_rate_{PER_REQUEST}": _mean(p["draft_acceptance_rate"] for p in per),
    }
    for i in range(depth):
        out[f"acceptance_rate_pos{i + 1}_{POOLED}"] = _ratio(acc_at[i], reached[i])
        out[f"acceptance_rate_pos{i + 1}_{PER_REQUEST}"] = _mean(p["rates"][i] for p in per if i < len(p["rates"]))
        out[f"drafts_reaching_pos{i + 1}"] = float(reached[i])
    out.update(iid_check(reached, acc_at, out[f"acceptance_length_{POOLED}"], gamma or depth))
    return out


def iid_check(
    reached: Sequence[int], accepted_at: Sequence[int], acceptance_length: float, gamma: int
) -> dict[str, float]:
    """Leviathan's i.i.d. check: ``alpha_positions`` (MLE from the per-position counts), ``alpha_implied``
    (from the acceptance length), ``leviathan_tokens_per_step`` (the formula at ``alpha_positions``),
    ``acceptance_falls_z`` (z of rate(position >= 2) - rate(position 1); negative: falls) and
    ``acceptance_falls`` (1.0 when z < -1.96, else 0.0; NaN without position 2)."""
    alpha_pos = _ratio(sum(accepted_at), sum(reached))
    out = {
        "alpha_positions": alpha_pos,
        "alpha_implied": alpha_from_tokens_per_step(acceptance_length, int(gamma)) if gamma else math.nan,
        "leviathan_tokens_per_step": expected_tokens(alpha_pos, int(gamma))
        if gamma and math.isfinite(alpha_pos)
        else math.nan,
        "acceptance_falls_z": math.nan,
        "acceptance_falls": math.nan,
    }
    if len(reached) >= 2 and reached[0] > 0 and sum(reached[1:]) > 0:
        n1, n2 = reached[0], sum(reached[1:])
        p1, p2 = accepted_at[0] / n1, sum(accepted_at[1:]) / n2
        pooled = (accepted_at[0] + sum(accepted_at[1:])) / (n1 + n2)
        se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
        z = (p2 - p1) / se if se > 0 else 0.0
        out["acceptance_falls_z"] = z
        out["acceptance_falls"] = 1.0 if z < -Z_FALL else 0.0
    return out


def as_list(value: Any) -> list[int]:
    """A logged list, or [] for a missing one (None, NaN from a DataFrame)."""
    return list(value) if isinstance(value, (list, tuple)) else []


def records_metrics(
    records: Sequence[Any], gamma: int | None = None, max_new_tokens: int | None = None
) -> dict[str, float]:
    """``acceptance_metrics`` of generation records (objects or dicts with ``accepted``, ``drafted``,
    ``draft_steps``): records without ``drafted`` are reconstructed from ``gamma`` when given, skipped otherwise."""
    requests = []
    for rec in records:
        get = rec.get if isinstance(rec, dict) else lambda k, r=rec: getattr(r, k, None)
        accepted, drafted = as_list(get("accepted")), as_list(get("drafted"))
        if not accepted:
            continue
        if not drafted:  # logged before ``drafted`` existed: the chain loop's rule, for methods that drafted
            if not gamma or not (get("draft_steps") or 0):
                continue
            drafted = reconstruct_drafted(accepted, int(gamma), max_new_tokens)
        requests.append((accepted, list(drafted)))
    return acceptance_metrics(requests, gamma)


# ----------------------------------------------------------------------------------- specdec_bench's profile

PROFILE_SCHEMA_VERSION = "1.0"  # NVIDIA Model-Optimizer examples/specdec_bench speculation_profile.py SCHEMA_VERSION


def checkpoint_id(path: Any) -> str | None:
    """A model path as the profile publishes it: its last two components (``org/model``, a Hub id unchanged), as
    specdec_bench's ``checkpoint_id`` does, so a profile carries no local directory layout."""
    parts = [p for p in str(path or "").replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:]) if parts else None


def length_histogram(requests: Sequence[Sequence[int]]) -> dict[int, int]:
    """Steps per acceptance length (tokens emitted by a verification step, bonus included), over every request."""
    hist: dict[int, int] = {}
    for accepted in requests:
        for e in accepted:
            hist[int(e)] = hist.get(int(e), 0) + 1
    return dict(sorted(hist.items()))


def speculation_profile(
    records: Sequence[Any],
    *,
    method: str,
    verification_method: str | None = None,
    prefix_drafts: bool = False,
    num_speculative_tokens: int | None = None,
    target_model: Mapping[str, Any] | None = None,
    draft_checkpoint: Mapping[str, Any] | None = None,
    measurement_conditions: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The cell's acceptance as NVIDIA specdec_bench's ``speculation_profile.json`` (schema 1.0), so vLLM's
    synthetic sampler and Dynamo's mocker can replay what was measured here; None for a method that drafts
    nothing (specdec_bench writes no profile for ``--speculative_algorithm NONE`` either).

    ``verification_method`` and ``prefix_drafts`` are what the method declares (``Decoder.verification_method``:
    specdec_bench's word, e.g. ``longest_prefix`` for token verification, ``block``; ``Decoder.prefix_drafts``: its
    draft of K tokens is a prefix of its draft of K + 1, so the marginal vector predicts the acceptance length at
    every smaller K, ``chain_analytic``; else ``measured_per_k``).

    As specdec_bench computes it from the histogram of acceptance lengths L (per verification step, bonus
    included): ``marginal_accept_rates[i]`` = P(L >= i + 2) (the first i + 1 drafts all accepted; vLLM's
    synthetic sampler), ``conditional_accept_rates[i]`` = P(L >= i + 2 | L >= i + 1) (Dynamo), both dense over
    ``num_speculative_tokens`` positions; ``mean_accept_length`` per step (what the vectors describe, = 1 +
    sum of the marginals) and ``mean_accept_length_per_request`` (the mean of each generation's own mean, its
    ``Average_AL``); and the same ``validation`` block (mean consistency, non-increasing marginals). The
    vectors are the survival function of the histogram itself, so a length that never occurred between two
    that did still gets its true rate (specdec_bench's own builder writes 0.0 there). ``num_speculative_tokens``
    is the draft length (a tree's depth); the vectors are never cut below the longest step measured.
    """
    requests = []
    for rec in records:
        get = rec.get if isinstance(rec, Mapping) else lambda k, r=rec: getattr(r, k, None)
        accepted = as_list(get("accepted"))
        # it drafted: draft forwards ran, or draft positions were put to the target (Medusa's heads run no
        # draft forward of their own)
        if accepted and ((get("draft_steps") or 0) > 0 or any(as_list(get("drafted") or []))):
            requests.append([int(e) for e in accepted])
    if not requests:
        return None
    hist = length_histogram(requests)
    steps = sum(hist.values())
    k = max(int(num_speculative_tokens or 0), max(hist) - 1, 1)  # never shorter than the longest step seen
    survival = [sum(v for length, v in hist.items() if length >= i + 2) / steps for i in range(k)]  # P(L >= i + 2)
    previous = [1.0, *survival[:-1]]
    conditional = [s / p if p > 0 else 0.0 for s, p in zip(survival, previous)]
    mean_step = sum(length * v for length, v in hist.items()) / steps
    mean_request = sum(sum(a) / len(a) for a in requests) / len(requests)
    implied = 1.0 + sum(survival)
    violations = [
        {"position": i, "value": survival[i], "previous": survival[i - 1]}
        for i in range(1, len(survival))
        if survival[i] > survival[i - 1] + 1e-9
    ]
    return {
        "schema_version": PROFILE_SCHEMA_VERSION,
        "measured": True,
        "method": method,
        "draft_checkpoint": dict(draft_checkpoint) if draft_checkpoint else None,
        "target_model": dict(target_model) if target_model else None,
        "num_speculative_tokens": k,
        "block_size": None,
        "max_supported_k": k,
        "verification_method": verification_method or method,
        "conditional_accept_rates": [round(x, 6) for x in conditional],
        "marginal_accept_rates": [round(x, 6) for x in survival],
        "mean_accept_length": round(mean_step, 6),
        "mean_accept_length_per_request": round(mean_request, 6),
        "accept_length_model": "chain_analytic" if prefix_drafts else "measured_per_k",
        "accept_length_by_k": {str(k): round(mean_step, 6)},
        "acceptance_length_histogram": {str(length): v for length, v in hist.items()},
        "per_category": None,
        "measurement_conditions": dict(measurement_conditions) if measurement_conditions else None,
        "validation": {
            "mean_consistency": {
                "implied_mean_accept_length": round(implied, 6),
                "reported_mean_accept_length": round(mean_step, 6),
                "abs_delta": round(abs(implied - mean_step), 6),
                "tolerance": 0.02,
                "passed": abs(implied - mean_step) <= 0.02,
            },
            "marginal_monotonicity": {"passed": not violations, "violations": violations},
        },
    }
