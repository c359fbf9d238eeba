"""Step costs outside the window: Leviathan's t_ar, t_draft and t_verify, and the machine's speed probe.

    t_ar, t_verify = step_times(target_model, prompt, gamma, device)
    t_draft = chain_draft_cost(drafter, target, prompt, gamma, warper)  # any drafter's draft token, via propose
    costs = drafter_costs(decoder, prompt, device)        # {t_ar, t_draft, t_verify, depth}, as the decoder drafts
    ms = probe_step_ms(target_model, device)              # before and after each window, and at calibration
    calibrate_draft_length(decoder, prompt, device)       # draft_cost / verify_cost: auto, before the window
    disturbance([before, after], calibrated_ms)           # {step_slowdown, disturbed}

Every timing goes through the one loop, ``pipeline.decoding.timing.median_times``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable, Sequence

import torch

from pipeline.decoding.kv import CachedModel
from pipeline.decoding.timing import median_times
from pipeline.decoding.tree_verify import tree_verify_forward
from pipeline.device import synchronize

PROBE_TOKENS = 32  # the probe's prompt: ids 1..32 (modulo the vocabulary), the same probe everywhere
DISTURBED_SLOWDOWN = 1.5  # a probe this many times the calibrated step: the machine was disturbed


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


def per_draft_token(
    propose: Callable[[], Any], rollback: Callable[[], Any], gamma: int, reps: int, sync: Callable[[], None]
) -> float:
    """Median seconds per draft token of ``propose()`` (one ``gamma``-token proposal after a cached prompt), over
    ``reps`` calls after one warm-up, each followed by ``rollback()`` (the caches back to the prompt), under
    ``torch.inference_mode``: the timing of every proposal cost (``chain_draft_cost``, ``proposal_cost``, the bench's
    ``t_propose``)."""
    with torch.inference_mode():
        (seconds,) = median_times(propose, reps=reps, warmup=1, sync=sync, after=rollback)
    return seconds / gamma


def chain_draft_cost(
    drafter: Any,
    target: CachedModel,
    prompt: Sequence[int],
    gamma: int,
    warper: Any,
    reps: int = 10,
    sync: Callable[[], None] = lambda: None,
) -> float:
    """t_draft of any drafter, timed through its public interface: median seconds per draft token of a
    ``gamma``-token ``propose`` after ``prompt`` (the drafter's whole work: forwards, warping, sampling or lookup),
    over ``reps`` proposals after one warm-up, each rolled back (``rollback``) before the next. ``target`` is the
    decoder's cached target (it gives the prompt's features to a drafter that reads them); ``sync`` waits for the
    device. c = t_draft / t_ar is the drafter's, not the draft model's."""
    prompt = list(prompt)
    target.reset()
    hidden = None
    if drafter.uses_hidden:
        hidden = target.prefill_hidden(prompt[:-1])
    else:
        target.prefill(prompt[:-1])
    drafter.start(prompt, hidden)
    generator = torch.Generator(device=target.device).manual_seed(0)
    seconds = per_draft_token(
        lambda: drafter.propose(prompt, gamma, warper, generator),
        lambda: drafter.rollback(len(prompt) - 1),
        gamma,
        reps,
        sync,
    )
    target.reset()
    return seconds


def drafter_costs(decoder: Any, prompt: Sequence[int], device: torch.device | str, reps: int = 10) -> dict[str, float]:
    """The costs of a draft-based decoder as it is configured (``decoder.shape``, ``decoder.draft_depth``), each
    drafter its own: ``t_ar`` (the target's step), ``t_draft`` (one draft position: a chain's token, a tree's
    level) and ``t_verify`` (the target's pass over what one iteration drafts), with ``depth``, the draft
    positions per iteration (gamma, or the tree's levels).

    A chain: ``chain_draft_cost`` (a draft-model step, an EAGLE head step with its LM-head row, one n-gram
    lookup per token) and the target's pass over gamma + 1 positions. A tree: ``tree_costs`` (the drafter's own
    ``propose_tree`` and the target's tree-attention pass over that tree)."""
    if decoder.shape == "tree":
        return tree_costs(decoder, prompt, device, reps=reps)
    gamma = int(decoder.draft_depth)
    t_ar, t_verify = step_times(decoder.target.model, prompt, gamma, device, reps=reps)
    t_draft = chain_draft_cost(
        decoder.drafter_impl,
        decoder.target,
        prompt,
        gamma,
        decoder.warper,
        reps=reps,
        sync=lambda: synchronize(device),
    )
    return {"t_ar": t_ar, "t_draft": t_draft, "t_verify": t_verify, "depth": float(gamma)}


def tree_costs(decoder: Any, prompt: Sequence[int], device: torch.device | str, reps: int = 10) -> dict[str, float]:
    """A tree decoder's costs, its drafter's own: after one plain target step (the tree loop's first iteration,
    which gives a drafter that reads hidden states, Medusa's heads, its first state), the median of ``reps``
    ``propose_tree`` calls with the decoder's tree shape and children (``t_draft``: per level of the tree drawn)
    and of the target's tree-attention pass over that tree (``t_verify``); ``t_ar``: the target's step
    (``step_times``). Returns ``{t_ar, t_draft, t_verify, depth, nodes}``."""
    target, drafter = decoder.target, decoder.drafter_impl
    prompt = list(prompt)
    sync = lambda: synchronize(device)  # noqa: E731
    t_ar = step_times(target.model, prompt, 1, device, reps=reps)[0]
    shape = decoder.tree_shape(int(decoder.draft_depth))
    children = decoder.walk_impl.children
    generator = torch.Generator(device=target.device).manual_seed(0)
    with torch.inference_mode():
        target.reset()
        hidden = None
        target.capture_hidden = drafter.uses_hidden and drafter.prompt_hidden
        if target.capture_hidden:
            hidden = target.prefill_hidden(prompt[:-1])
        else:
            target.prefill(prompt[:-1])
        target.capture_hidden = drafter.uses_hidden
        drafter.start(prompt, hidden)
        row = target.forward(prompt[-1:], keep=1)[-1]  # a plain step, as the loop's first
        drafter.feedback(len(prompt), 0, target.hidden if drafter.uses_hidden else None)
        context = prompt + [int(row.argmax())]

        def propose() -> Any:
            return drafter.propose_tree(context, shape, decoder.warper, generator, children)

        def restore() -> None:
            drafter.rollback(len(context) - 1)
            target.rollback(len(context) - 1)

        tree = propose()
        restore()
        if tree is None or len(tree) == 0:
            raise RuntimeError(f"drafter {drafter.kind!r} proposed no tree to time (method {decoder.name!r})")
        t_propose, t_verify = median_times(
            propose, lambda: tree_verify_forward(target, context, tree), reps=reps, warmup=1, sync=sync, after=restore
        )
        target.reset()
        target.capture_hidden = False
    depth = max(tree.depths) + 1
    return {
        "t_ar": t_ar,
        "t_draft": t_propose / depth,
        "t_verify": t_verify,
        "depth": float(depth),
        "nodes": float(len(tree)),
    }


def proposal_cost(decoder: Any, prompt: Sequence[int], device: torch.device | str, reps: int = 10) -> float:
    """t_draft as the decoder drafts: its drafter's ``chain_draft_cost``, except mtad over the draft model, whose
    proposal is beam sampling (``num_beams`` beams a step: ``beam_sampling.beam_sample``), timed as such."""
    gamma = draft_length(decoder) or 1
    sync = partial(synchronize, torch.device(device))
    if not (getattr(decoder, "beam_drafts", False) and decoder.drafter_impl.kind == "model"):
        return chain_draft_cost(decoder.drafter_impl, decoder.target, prompt, gamma, decoder.warper, reps, sync)
    from pipeline.decoding.beam_sampling import beam_sample  # noqa: PLC0415 - mtad only

    model, args, prompt = decoder.draft_model, decoder.args, list(prompt)
    model.reset()
    with torch.inference_mode():
        model.prefill(prompt[:-1])
    generator = torch.Generator(device=model.device).manual_seed(0)
    seconds = per_draft_token(
        lambda: beam_sample(
            model, prompt, gamma, args.num_beams, decoder.warper, generator, args.beam_weights, args.replacement
        ),
        lambda: model.rollback(len(prompt) - 1),
        gamma,
        reps,
        sync,
    )
    model.reset()
    return seconds


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
