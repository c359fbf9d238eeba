"""The dequantized-GGUF cache: written atomically, safe when several processes convert at once."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from helpers.models import tiny_llama
from pipeline.models import _save_dequantized


def test_save_dequantized_round_trips_and_leaves_no_temporary_folders(tmp_path):
    model = tiny_llama(7)
    target = tmp_path / "cache" / "model"
    _save_dequantized(model, target)
    _save_dequantized(model, target)  # a second writer finishing after the first: no error
    (tmp_path / "cache" / "partial").mkdir()
    _save_dequantized(model, tmp_path / "cache" / "partial")  # a partial folder is replaced
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["model", "partial"]
    for folder in ("model", "partial"):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "cache" / folder).eval()
        ids = torch.tensor([[1, 2, 3]])
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
