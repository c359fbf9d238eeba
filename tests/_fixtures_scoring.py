"""Helpers for the measurement and scoring tests (imported by them; conftest.py belongs to the lead)."""

from __future__ import annotations

from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def tiny_lm(vocab_size: int, seed: int = 0, hidden: int = 16, layers: int = 1):
    """A seeded random Llama over ``vocab_size`` tokens, small enough to run anything on a CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=2 * hidden,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked distributions: speculative drafts get accepted sometimes
    return model


def offline_tokenizer():
    """The offline pair's tokenizer (SmolLM2-135M-Instruct, with its chat template)."""
    from pipeline import models

    return models.load_tokenizer(models.ModelSpec.from_config(models.pair_config("smollm2-offline")["target"]))
