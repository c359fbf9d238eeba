"""How often batching changes a request's output (float32 and CUDA rows are not batch-invariant; the bf16 CPU
kernels are: 0 differing there)."""

from __future__ import annotations

from typing import Sequence

import torch

from .base import Decoder
from .batched import BatchedDecoder, BatchedGeneration


def batch_divergence(
    decoder: Decoder,
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int,
    max_new_tokens: int,
    seeds: Sequence[int],
    eos_token_ids: Sequence[int] = (),
) -> dict[str, float]:
    """How often a request's output at ``batch_size`` differs from its output at batch 1 (same generator seeds):
    ``{"requests", "differing", "fraction", "first_difference_mean"}`` (0 differing on the bf16 kernels;
    float32 and CUDA rows are not batch-invariant, so this measures what batching changes there)."""

    def run(b: int) -> list[BatchedGeneration]:
        gens = [torch.Generator(device=decoder.target.device).manual_seed(int(s)) for s in seeds]
        return BatchedDecoder(decoder, b).generate(
            prompts, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids, generators=gens
        )

    alone, together = run(1), run(batch_size)
    firsts = []
    for a, t in zip(alone, together):
        if a.tokens != t.tokens:
            firsts.append(
                next(
                    (i for i, (x, y) in enumerate(zip(a.tokens, t.tokens)) if x != y), min(len(a.tokens), len(t.tokens))
                )
            )
    n = len(alone)
    return {
        "requests": n,
        "differing": len(firsts),
        "fraction": len(firsts) / n if n else float("nan"),
        "first_difference_mean": sum(firsts) / len(firsts) if firsts else float("nan"),
    }
