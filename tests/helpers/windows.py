"""What the measurement-window tests share (tests/test_measure_batched.py, tests/test_measure_workload.py): the tiny
pair, the warper, a few chat samples and run_window's keyword arguments."""

from __future__ import annotations

from typing import Any

from helpers.models import tiny_llama
from pipeline.data.base import Sample

LM = dict(max_positions=4096, bos=1, eos=2, scale=8.0)
WARP = dict(temperature=1.0, top_k=10, top_p=0.9)
WORDS = ["apples", "rivers", "engines", "violins", "glaciers", "comets", "lanterns"]


def tiny_pair(tokenizer) -> tuple[Any, Any]:
    """(target, draft): two layers and one, over the tokenizer's vocabulary, seeded alike."""
    vocab = len(tokenizer)
    return tiny_llama(0, vocab=vocab, **LM), tiny_llama(0, vocab=vocab, layers=1, **LM)


def window_samples(n: int, turns: int = 1) -> list[Sample]:
    """``n`` (at most 7) chat samples of ``turns`` turns each."""
    return [
        Sample(id=f"s{i}", dataset="spec_bench", turns=[f"Tell me about {WORDS[i]}."] + ["And more?"] * (turns - 1))
        for i in range(n)
    ]


def window_kwargs(tokenizer) -> dict[str, Any]:
    """run_window's keyword arguments for a short window: 8 new tokens, seed 3, one warm-up generation, no idle."""
    return dict(
        tokenizer=tokenizer,
        chat=True,
        eos_token_ids=[tokenizer.eos_token_id],
        max_new_tokens=8,
        seed=3,
        device="cpu",
        warmup_generations=1,
        warmup_seconds=0.0,
        idle_seconds=0.0,
    )
