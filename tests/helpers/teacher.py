"""The teacher data's generation settings for a test run of a second or two (``generate_teacher_data``'s keywords)."""

from __future__ import annotations

from typing import Any


def small_chat_run(**overrides: Any) -> dict[str, Any]:
    """12 chat conversations in shards of 4, 5 new tokens each, the teacher's top 4 kept, sampled as
    conf/distill.yaml samples (top-k 20, top-p 0.95), seed 0, no log; ``overrides`` win."""
    settings: dict[str, Any] = dict(
        n_prompts=12,
        tf_fraction=0.0,
        batch_size=4,
        max_new_tokens=5,
        top_k_store=4,
        sample_top_k=20,
        sample_top_p=0.95,
        seed=0,
        prompts="chat",
        log=lambda m: None,
    )
    return {**settings, **overrides}
