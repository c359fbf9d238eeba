"""Step costs outside the window: Leviathan's t_ar, t_draft and t_verify, and the machine's speed probe.

    t_ar, t_verify = step_times(target_model, prompt, gamma, device)
    costs = drafter_costs(decoder, prompt, device)        # {t_ar, t_draft, t_verify}, the decoder's own drafter
    ms = probe_step_ms(target_model, device)              # before and after each window, and at calibration
    calibrate_draft_length(decoder, prompt, device)       # draft_cost / verify_cost: auto, before the window
    disturbance([before, after], calibrated_ms)           # {step_slowdown, disturbed}

Every timing goes through the one loop, ``pipeline.decoding.timing.median_times``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Sequence

import torch

from pipeline.decoding.kv import CachedModel
from pipeline.decoding.timing import median_times
from pipeline.device import synchronize

PROBE_TOKENS = 32  # the probe's prompt: ids 1..32 (modulo the vocabulary), the same probe everywhere
DISTURBED_SLOWDOWN = 1.5  # a probe this many times the calibrated step: the machine was disturbed


def draft_length(decoder: Any) -> int | None:
    """The chain length gamma a draft-verify decoder drafts per iteration (None for other methods)."""
    gamma = getattr(getattr(decoder, "args", None), "gamma", None)
    if gamma is None and getattr(decoder, "draft_shape", None) == "chain":
        gamma = decoder.draft_length()  # a chain budget of another name (bild: max_small_steps)
    return int(gamma) if isinstance(gamma, int) and not isinstance(gamma, bool) else None


def step_times(
    model: Any, prompt: Sequence[int], gamma: int, device: torch.device | str, reps: int = 20
) -> tuple[float, float]:
    """Median single-token step time and median (gamma + 1)-token forward time, batch 1, with a KV cache.

    The costs behind Leviathan's bound (t_ar or t_draft, and t_verify); measured outside any window.
    """
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


def drafter_costs(decoder: Any, prompt: Sequence[int], device: torch.device | str, reps: int = 10) -> dict[str, float]:
    """Leviathan's costs of a draft-based decoder, each drafter its own: ``t_ar`` and ``t_verify`` of the
    target (``step_times``) and ``t_draft``, the decoder's drafter's own cost of one draft token
    (``Drafter.step_cost``: a draft-model step, an EAGLE head step with its LM-head row, one n-gram lookup
    per token), with the gamma of the decoder (its tree depth for tree methods)."""
    gamma = draft_length(decoder) or int(getattr(decoder, "tree_depth", 1))
    t_ar, t_verify = step_times(decoder.target.model, prompt, gamma, device, reps=reps)
    t_draft = decoder.drafter_impl.step_cost(
        decoder.target, list(prompt), gamma, decoder.warper, reps=reps, sync=lambda: synchronize(device)
    )
    return {"t_ar": t_ar, "t_draft": t_draft, "t_verify": t_verify}


def proposal_cost(decoder: Any, prompt: Sequence[int], device: torch.device | str, reps: int = 10) -> float:
    """t_draft as the decoder drafts: its drafter's ``step_cost``, except mtad over the draft model, whose
    proposal is beam sampling (``num_beams`` beams a step: ``beam_sampling.beam_sample``), timed as such."""
    gamma = draft_length(decoder) or 1
    sync = partial(synchronize, torch.device(device))
    if not (getattr(decoder, "beam_drafts", False) and decoder.drafter_impl.kind == "model"):
        return float(
            decoder.drafter_impl.step_cost(decoder.target, list(prompt), gamma, decoder.warper, reps=reps, sync=sync)
        )
    from pipeline.decoding.beam_sampling import beam_sample  # noqa: PLC0415 - mtad only

    model, args, prompt = decoder.draft_model, decoder.args, list(prompt)
    model.reset()
    with torch.inference_mode():
        model.prefill(prompt[:-1])
        generator = torch.Generator(device=model.device).manual_seed(0)
        (seconds,) = median_times(
            lambda: beam_sample(
                model, prompt, gamma, args.num_beams, decoder.warper, generator, args.beam_weights, args.replacement
            ),
            reps=reps,
            warmup=1,
            sync=sync,
            after=lambda: model.rollback(len(prompt) - 1),
        )
    model.reset()
    return seconds / gamma


def calibrate_draft_length(
    decoder: Any, prompt: Sequence[int], device: torch.device | str, reps: int = 10
) -> dict[str, float]:
    """``draft_cost: auto`` / ``verify_cost: auto``: measure c = t_draft / t_ar (``proposal_cost``) and
    v = (t_verify(gamma + 1) / t_ar - 1) / gamma (``step_times``) on the decoder's own models after ``prompt``, and
    hand them to its draft-length rule (``DraftLength.calibrate``), before any generation is timed. Returns the
    measured ``{calibrated_draft_cost, calibrated_verify_cost, calibrated_t_ar_ms}`` ({} when nothing is auto)."""
    policy = getattr(decoder, "length_policy", None)
    if policy is None or not policy.needs_calibration:
        return {}
    gamma = draft_length(decoder) or 1
    t_ar, t_verify = step_times(decoder.target.model, prompt, gamma, device, reps=reps)
    c = proposal_cost(decoder, prompt, device, reps=reps) / t_ar
    v = (t_verify / t_ar - 1.0) / gamma
    policy.calibrate(c, v)
    return {"calibrated_draft_cost": c, "calibrated_verify_cost": v, "calibrated_t_ar_ms": 1e3 * t_ar}


def probe_step_ms(model: Any, device: torch.device | str, reps: int = 10) -> float:
    """The target's single-token step after a fixed ``PROBE_TOKENS``-token prompt (median of ``reps``,
    milliseconds): the machine's speed as the pair sees it, comparable between the sweep's calibration and
    every cell of the pair."""
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or PROBE_TOKENS + 1)
    prompt = [1 + i % (vocab - 1) for i in range(PROBE_TOKENS)] if vocab > 1 else [0] * PROBE_TOKENS
    return 1e3 * step_times(model, prompt, 1, device, reps=reps)[0]


def disturbance(
    probes_ms: Sequence[float], calibrated_ms: float, threshold: float = DISTURBED_SLOWDOWN
) -> dict[str, float]:
    """``step_slowdown`` (the slowest probe over the calibrated step) and ``disturbed`` (1.0 when it is at
    least ``threshold``, else 0.0); NaN for both without a finite calibration or probe."""
    values = [float(v) for v in probes_ms if v is not None and math.isfinite(float(v)) and float(v) > 0]
    if not values or not (calibrated_ms is not None and math.isfinite(calibrated_ms) and calibrated_ms > 0):
        return {"step_slowdown": math.nan, "disturbed": math.nan}
    slowdown = max(values) / float(calibrated_ms)
    return {"step_slowdown": slowdown, "disturbed": 1.0 if slowdown >= threshold else 0.0}
