"""The one factory of tiny random causal LMs for tests (seeded, deterministic, fast on a CPU)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

KINDS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
}


def tiny_llama(
    seed: int = 0,
    vocab: int = 8,
    hidden: int = 16,
    layers: int = 1,
    max_positions: int = 256,
    *,
    heads: int = 2,
    kv_heads: int = 1,
    intermediate: int | None = None,
    bos: int | None = 0,
    eos: int | None = None,
    pad: int | None = None,
    scale: float = 4.0,
    kind: str = "llama",
    **config: Any,
):
    """A randomly initialised model (``kind``: llama, mistral, qwen2) in eval mode.

    The defaults are small enough to enumerate every output of a few steps (vocabulary 8). ``scale``
    sharpens the output layer so that distributions are far from uniform (acceptance is informative);
    ``config`` passes further transformers config fields (``attention_bias``, ``head_dim``, ...).
    """
    config_cls, model_cls = KINDS[kind]
    torch.manual_seed(seed)
    cfg = config_cls(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate or 2 * hidden,
        max_position_embeddings=max_positions,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        **config,
    )
    model = model_cls(cfg).eval()
    if scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(scale)
    return model
