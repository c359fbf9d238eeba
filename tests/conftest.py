"""Shared fixtures: tiny random Llama models (fast, deterministic) and the offline data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models gain nothing from intra-op threads, and oversubscribed threads slow CPUs badly.
torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def tiny_llama(seed: int, vocab: int = 8, hidden: int = 16, layers: int = 1, max_positions: int = 256):
    """A randomly initialised Llama small enough for exhaustive enumeration of its outputs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_positions,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(config).eval()
    # Sharpen the output layer so distributions are far from uniform (acceptance is informative).
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model


@pytest.fixture(scope="session")
def tiny_pair():
    """(target, draft): two different random models over the same 8-token vocabulary.

    The target carries (untrained) Medusa heads, as a pair with a ``medusa:`` key does, so that
    every registered method can be built over this pair.
    """
    from pipeline.decoding.medusa import MedusaHeads, attach_medusa_heads

    target = tiny_llama(0)
    attach_medusa_heads(target, MedusaHeads(target.config.hidden_size, 2))
    return target, tiny_llama(1)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"offline data folder {SHARED_DATA} not present")
    return SHARED_DATA
