"""What the loop (``batched.py``) takes and gives: a request, its generation with its clock, the batch-size check that
refuses a batch a configured method cannot decode before any model loads, and the loop's own per-request state
(``LiveRequest``) and its admission helpers (a workload's arrivals, the occupancy told to the draft-length policy)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .base import Decoder, Generation
from .draft_length import DraftLength
from .drafters import Drafter
from .tree import TokenTree


@dataclass
class BatchRequest:
    """One generation to run: its prompt, its own limit and its own generator (``tag``: the caller's)."""

    prompt: Sequence[int] | torch.Tensor
    max_new_tokens: int
    generator: torch.Generator | None = None
    tag: Any = None


@dataclass
class BatchedGeneration(Generation):
    """A ``Generation`` with its request's clock (``time.perf_counter`` seconds): when it took a slot, when
    its first token and its last were emitted (latency, time to first token and TPOT per request)."""

    admitted_at: float = 0.0
    first_token_at: float = 0.0
    finished_at: float = 0.0
    prefill_s: float = 0.0  # batch 1: the part spent writing the prompt into the caches (``prefill_seconds``)
    tag: Any = None


def check_batch(cls: type[Decoder], values: dict[str, Any], batch_size: Any) -> None:
    """Refuse a ``batch_size`` this method (with these resolved parameters: its ``Args`` and their capabilities)
    cannot run, before any model loads; the message names the fix."""
    refuse_batch(cls.name, cls.Args(**values).capabilities.batch_refusal, batch_size)


def refuse_batch(name: str, reason: str | None, batch_size: Any) -> None:
    """A ``batch_size`` that is not an integer >= 1, or above 1 for a method that gives a ``reason`` it cannot batch:
    ``ValueError`` naming the fix."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if batch_size > 1 and reason:
        raise ValueError(f"method {name!r} cannot decode with batch_size {batch_size}: {reason}; use batch_size: 1")


@dataclass
class LiveRequest:
    """A request in a slot: its context, output and counters, its drafter and draft-length policy, and this
    iteration's proposal."""

    index: int
    request: BatchRequest
    slot: int
    context: list[int]
    admitted_at: float
    drafter: Drafter | None = None
    policy: DraftLength | None = None
    out: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    steps: int = 0
    first_token_at: float = 0.0
    prefill_s: float = 0.0
    cached: int = 0  # context positions the target's cache holds (its length, kept here: no cache query per step)
    iterations: int = 0  # iterations so far (the calibration schedule's counter)
    tokens: torch.Tensor | None = None  # this iteration's draft tokens [g] (None: nothing drafted)
    proposal: Any = None  # what the rule reads beside them (``DraftVerifyDecoder.propose_chains``)
    tree: TokenTree | None = None  # a tree method's: this iteration's token tree (None: nothing drafted)


def arrive(arrivals: Any, queue: deque, live: Sequence[Any], clock: Any = None) -> bool:
    """A workload's requests whose time has come join ``queue`` (``arrivals.feed``; it sleeps until the next arrival
    when nothing is queued or ``live``); whether more are to come. No ``arrivals``: False (the queue is the work).
    ``clock`` (the loop's ``PhaseClock``) is paused while the engine waits with nothing to decode: that wait is the
    workload's, on no phase (it went to ``other``, a quarter of a token's time at 0.5 requests/s on the CPU)."""
    if arrivals is None:
        return False
    idle = not queue and not live
    phase = clock.pause() if idle and clock is not None else None
    try:
        return bool(arrivals.feed(queue, idle))
    finally:
        if phase is not None:
            clock.resume(phase)


def occupy(live: Sequence[Any], slots: int) -> None:
    """Each live request's draft-length policy hears how full the batch is this iteration (``draft_stop: load``)."""
    for r in live:
        if r.policy is not None:
            r.policy.observe_load(len(live), slots)
