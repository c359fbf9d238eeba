"""What the loop (``batched.py``) takes and gives: a request, its generation with its clock, and the batch-size check
that refuses a batch a configured method cannot decode, before any model loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .base import Decoder, Generation


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
