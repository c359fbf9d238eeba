"""Distillation on tiny random models: the loss falls, deterministically from a seed; checkpoints load."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers.marks import has_kernels, require_kernels
from helpers.models import tiny_llama
from helpers.paths import REPO
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.vocab import restrict_head
from pipeline.decoding.warping import warp
from pipeline.training.distill import data_engine, make_student, save_checkpoint
from pipeline.training.distill_heldout import evaluate_alpha
from pipeline.training.distill_train import choose_token_map, collate, kd_loss, make_batches, train
from pipeline.training.teacher_data import sample_answers, sample_answers_packed, teacher_force, teacher_force_cached


def tiny_target(vocab: int = 256):
    """A peaked teacher (so there is something to learn quickly), tied embedding."""
    return tiny_llama(
        0,
        vocab=vocab,
        hidden=64,
        layers=2,
        intermediate=128,
        heads=4,
        kv_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        bos=1,
        eos=2,
        pad=0,
        scale=8.0,
    )


def tiny_records(target, n: int = 24, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(3, 256, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]
    recs = sample_answers(
        target,
        prompts[: n // 2],
        max_new_tokens=12,
        top_k_store=8,
        sample_top_k=20,
        sample_top_p=0.95,
        eos_id=2,
        pad_id=0,
        gen=g,
    )
    recs += teacher_force(target, [(p + p[::-1] + p, len(p)) for p in prompts[n // 2 :]], top_k_store=8, pad_id=0)
    return [r.__dict__ for r in recs]


def heldout_for(target, recs):
    rows = []
    with torch.no_grad():
        for r in recs[:6]:
            ids, start = r["ids"].long(), r["start"]
            logits = target(ids[None]).logits[0, start - 1 : len(ids) - 1]
            p = warp(logits, 1.0, 10, 0.9)
            vals, idx = p.topk(10, dim=-1)
            rows.append({"ids": ids, "start": start, "p_ids": idx, "p": vals, "argmax": logits.argmax(-1)})
    return {"rows": rows}


def run_once(target, recs, seed, steps=30):
    student = make_student(
        target,
        hidden_size=32,
        num_layers=1,
        intermediate_size=64,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        seed=seed,
        init_from_target=False,
    )
    token_map = choose_token_map(recs, 256, 128, always=[0, 1, 2])
    losses = []

    def log(msg):
        losses.append(msg)

    curve = train(
        student,
        recs,
        token_map,
        heldout_for(target, recs),
        steps=steps,
        tokens_per_batch=64,
        max_len=64,
        lr=1e-2,
        warmup=2,
        weight_decay=0.0,
        negatives=16,
        eval_every=steps,
        seed=seed,
        pad_id=0,
        log=log,
        progress=False,
    )
    return student, token_map, curve


def test_sample_answers_records_match_teacher_forcing():
    target = tiny_target()
    recs = tiny_records(target, n=4)
    r = recs[0]
    with torch.no_grad():
        logp = target(r["ids"].long()[None]).logits[0].log_softmax(-1)
    rows = logp[r["start"] - 1 : len(r["ids"]) - 1]
    assert torch.equal(rows.argmax(-1), r["topk_ids"][:, 0].long())
    assert torch.allclose(rows.max(-1).values, r["topk_logp"][:, 0].float(), atol=1e-2)


def test_svd_init_gives_a_better_start_than_random():
    target = tiny_target()
    recs = tiny_records(target)
    held = heldout_for(target, recs)
    kw = dict(hidden_size=32, num_layers=1, intermediate_size=64, num_heads=2, num_kv_heads=1, head_dim=16, seed=0)
    svd = evaluate_alpha(make_student(target, **kw), held, None)["alpha"]
    rnd = evaluate_alpha(make_student(target, init_from_target=False, **kw), held, None)["alpha"]
    assert svd > rnd


def test_kd_loss_is_zero_at_the_teacher():
    torch.manual_seed(0)
    emb = torch.randn(50, 8)
    h = torch.randn(5, 8)
    logp = (h @ emb.T).log_softmax(-1)
    vals, idx = logp.topk(50, dim=-1)  # the whole vocabulary: rest bucket empty
    loss = kd_loss(h, emb, torch.arange(50), torch.arange(0), idx, vals)
    assert abs(loss.item()) < 1e-4


def test_training_reduces_loss_deterministically_and_saves(tmp_path):
    target = tiny_target()
    recs = tiny_records(target)
    s1, token_map, c1 = run_once(target, recs, seed=3)
    _, _, c2 = run_once(target, recs, seed=3)
    assert [c["alpha"] for c in c1] == [c["alpha"] for c in c2]  # same seed, same run
    assert c1[-1]["loss"] == c2[-1]["loss"]
    assert c1[-1]["alpha"] > c1[0]["alpha"]  # held-out alpha rises from the initial student

    # the loss falls: first vs last batch loss of a fresh run, measured directly

    to_map = torch.full((256,), -1, dtype=torch.long)
    to_map[token_map] = torch.arange(token_map.numel())
    batch = make_batches(recs, 64, 64, 0)[0]

    def loss_of(student):
        ids, mask, pos, t_idx, t_logp = collate(recs, batch, 64, to_map, 0)
        with torch.no_grad():
            h = student.model(input_ids=ids, attention_mask=mask).last_hidden_state
            h = h.reshape(-1, h.shape[-1])[pos]
            return kd_loss(h, student.get_input_embeddings().weight, token_map, torch.arange(0), t_idx, t_logp).item()

    fresh = make_student(
        target,
        hidden_size=32,
        num_layers=1,
        intermediate_size=64,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        seed=3,
        init_from_target=False,
    )
    assert loss_of(s1) < 0.8 * loss_of(fresh)

    save_checkpoint(s1, token_map, tmp_path / "draft", "bfloat16")
    assert json.loads((tmp_path / "draft" / "restricted_head_map.json").read_text()) == token_map.tolist()

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "draft", dtype=torch.float32).eval()
    ids = recs[0]["ids"].long()[None]
    with torch.no_grad():
        full = loaded(ids).logits
        restricted = restrict_head(loaded)(ids).logits
    assert torch.equal(loaded.draft_token_map, token_map)
    assert full.shape[-1] == 256 and restricted.shape[-1] == token_map.numel()
    assert torch.allclose(full[..., token_map], restricted, atol=1e-4)
    a_loaded = evaluate_alpha(loaded, heldout_for(target, recs), token_map)["alpha"]
    assert a_loaded == pytest.approx(c1[-1]["alpha"], abs=0.03)  # bf16 storage changes little


# --------------------------------------------------------------------------------------------------
# Packed teacher data: many sequences in one KV cache through the engine's batch-1 forward
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def _rows_alone(cached, ids: list[int], start: int) -> torch.Tensor:
    """The model's log-prob rows at the answer positions of one sequence, run alone."""
    cached.reset()
    return cached.forward(ids, keep=0)[start - 1 : len(ids) - 1].log_softmax(-1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("slots,max_cache", [(2, 16384), (3, 24), (8, 16384)])
def test_packed_answers_have_each_sequence_own_rows(dtype, slots, max_cache):
    """Every record's teacher rows are those of its sequence run alone, whatever the packing: few slots
    (continuous batching: prompts wait for a free slot), a cache small enough to be compacted, all at once."""
    if dtype == "bfloat16":
        require_kernels()
    target = tiny_target().to(getattr(torch, dtype))
    cached = CachedModel(target)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (3, 7, 5, 9, 4, 6)]
    recs = sample_answers_packed(
        cached,
        prompts,
        max_new_tokens=10,
        top_k_store=8,
        sample_top_k=20,
        sample_top_p=0.95,
        eos_id=2,
        gen=torch.Generator().manual_seed(0),
        slots=slots,
        max_cache=max_cache,
    )
    assert [r.ids[: r.start].tolist() for r in recs] == prompts
    tol = 4e-3 if dtype == "float32" else 2e-2  # the records keep float16 log-probs
    for r in recs:
        answer = r.ids[r.start :].tolist()
        assert 1 <= len(answer) <= 10 and (len(answer) == 10 or answer[-1] == 2) and 2 not in answer[:-1]
        rows = _rows_alone(cached, r.ids.tolist(), r.start)
        vals, idx = rows.topk(8, dim=-1)
        assert torch.equal(idx[:, 0], r.topk_ids[:, 0].long())
        assert torch.allclose(vals, r.topk_logp.float(), atol=tol)
        # every sampled token is inside the warped support of its row (top-20, top-p 0.95)
        support = warp(rows.exp(), 1.0, 20, 0.95) > 0  # warp of probs: same order as of logits
        assert bool(support[torch.arange(len(answer)), torch.tensor(answer)].all())


def test_packed_answers_are_deterministic_and_draw_from_the_warped_row():
    target = tiny_llama(1, vocab=64, hidden=32, layers=1, heads=2, kv_heads=1, eos=2, scale=1.0)  # a flat law
    cached = CachedModel(target)
    prompts = [[5, 6, 7]] * 400
    kw = dict(max_new_tokens=1, top_k_store=4, sample_top_k=5, sample_top_p=0.9, eos_id=2, slots=64)
    recs = sample_answers_packed(cached, prompts, gen=torch.Generator().manual_seed(1), **kw)
    again = sample_answers_packed(cached, prompts, gen=torch.Generator().manual_seed(1), **kw)
    assert [r.ids.tolist() for r in recs] == [r.ids.tolist() for r in again]
    # 400 draws of the first answer token against the warped law of the prompt's last row
    cached.reset()
    p = warp(cached.forward([5, 6, 7], keep=1)[-1], 1.0, 5, 0.9)
    counts = torch.bincount(torch.tensor([int(r.ids[3]) for r in recs]), minlength=p.numel()).double()
    support = p > 0
    assert counts[~support].sum() == 0
    expected = 400 * p[support].double()
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    dof = int(support.sum()) - 1
    assert dof >= 3 and chi2 < dof + 6 * (2 * dof) ** 0.5  # far beyond any plausible deviation at 400 draws


def test_teacher_force_cached_matches_transformers_rows():
    target = tiny_target()
    seqs = [([5, 9, 11, 40, 41, 42, 2], 3), ([7, 8, 100, 101, 102, 103], 2)]
    ours = teacher_force_cached(CachedModel(target), seqs, top_k_store=8)
    ref = teacher_force(target, seqs, top_k_store=8, pad_id=0)
    for a, b in zip(ours, ref):
        assert a.start == b.start and torch.equal(a.ids, b.ids)
        assert torch.equal(a.topk_ids[:, 0], b.topk_ids[:, 0])
        assert torch.allclose(a.topk_logp.float(), b.topk_logp.float(), atol=2e-3)


def test_data_engine_choice():
    fp32 = tiny_target()
    assert data_engine("auto", fp32) == "batched" and data_engine("packed", fp32) == "packed"
    with pytest.raises(ValueError, match="auto, batched or packed"):
        data_engine("fast", fp32)
    if has_kernels():  # bf16 on a CPU with the engine's kernels: sequences packed into one cache
        assert data_engine("auto", tiny_target().to(torch.bfloat16)) == "packed"


def test_training_measures_every_heldout_set_against_training_tokens():
    """The curve carries alpha on each extra held-out set (the chat mix's) and the answer tokens trained on."""
    target = tiny_target()
    recs = tiny_records(target)
    student = make_student(
        target,
        hidden_size=32,
        num_layers=1,
        intermediate_size=64,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        seed=0,
        init_from_target=False,
    )
    token_map = choose_token_map(recs, 256, 128, always=[0, 1, 2])
    held = heldout_for(target, recs)
    chat = heldout_for(target, recs[6:])
    curve = train(
        student,
        recs,
        token_map,
        held,
        steps=8,
        tokens_per_batch=64,
        max_len=64,
        lr=1e-2,
        warmup=2,
        weight_decay=0.0,
        negatives=16,
        eval_every=4,
        seed=0,
        pad_id=0,
        log=lambda m: None,
        progress=False,
        extra_heldout={"chat": chat},
        tokens_before=100,
    )
    assert [c["step"] for c in curve] == [0, 4, 8]
    assert curve[0]["tokens"] == 100 and curve[0]["tokens"] < curve[1]["tokens"] < curve[2]["tokens"]
    assert curve[-1]["alpha_chat"] == pytest.approx(evaluate_alpha(student, chat, token_map)["alpha"])
    assert curve[-1]["alpha"] == pytest.approx(evaluate_alpha(student, held, token_map)["alpha"])


@pytest.mark.parametrize(
    "override,message",
    [
        ("data.prompts=web", "data.prompts must be instructions or chat"),
        ("init_from=models/no-such-draft", "init_from=models/no-such-draft: no checkpoint there"),
    ],
)
def test_bad_distill_settings_fail_before_any_model_loads(override, message, monkeypatch, tmp_path):
    from hydra import compose, initialize_config_dir  # noqa: PLC0415
    from hydra.core.global_hydra import GlobalHydra  # noqa: PLC0415

    from pipeline.training import distill as distill_mod  # noqa: PLC0415

    monkeypatch.setattr(distill_mod, "load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("distill", overrides=[override, f"work_dir={tmp_path}"])
    with pytest.raises(ValueError, match=message):
        distill_mod.run(cfg)


def test_the_card_shows_the_chat_heldout_set_and_the_continued_run(tmp_path):
    from pipeline.training.cards import write_model_card  # noqa: PLC0415

    curve = [
        {
            "step": 0,
            "train_s": 0.0,
            "tokens": 0,
            "loss": None,
            "alpha": 0.45,
            "greedy_agreement": 0.47,
            "alpha_chat": 0.38,
        },
        {
            "step": 10,
            "train_s": 60.0,
            "tokens": 40000,
            "loss": 1.2,
            "alpha": 0.46,
            "greedy_agreement": 0.48,
            "alpha_chat": 0.41,
        },
    ]
    info = {
        "target": "t",
        "command": "python -m pipeline.distill data.prompts=chat",
        "save_dtype": "bfloat16",
        "seed": 0,
        "init_from": "models/smollm2-135m-draft",
        "config": {"threads": 2},
        "student": {
            "num_layers": 4,
            "hidden_size": 192,
            "num_heads": 3,
            "head_dim": 64,
            "num_kv_heads": 1,
            "intermediate_size": 1024,
            "vocab_size": 49152,
            "params": 12e6,
            "bytes": 24e6,
            "map_size": 16384,
        },
        "data": {
            "records": 10,
            "tokens": 1000,
            "gen_records": 6,
            "gen2_records": 3,
            "tf_records": 1,
            "top_k_store": 32,
            "sample_top_k": 20,
            "sample_top_p": 0.95,
            "max_new_tokens": 160,
            "prompts": "chat",
            "engine_used": "batched",
            "wall_s": 60.0,
            "map_coverage": 0.99,
        },
        "train": {"steps": 10, "tokens_per_batch": 4096, "lr": 5e-4, "negatives": 2048, "wall_s": 60.0},
        "heldout": {
            "n_humaneval": 24,
            "n_mtbench": 24,
            "max_new_tokens": 128,
            "n_chat": 48,
            "positions": {"eval": 5000, "chat": 7000},
        },
        "curve": curve,
        "final": {**curve[-1], "positions": 5000},
        "final_full": {"alpha": 0.46},
    }
    write_model_card(tmp_path, info)
    card = (tmp_path / "MODEL_CARD.md").read_text()
    assert "| step | tokens | train min | loss (EMA) | alpha | alpha (chat) | greedy agreement |" in card
    assert "| 10 | 40000 | 1.0 | 1.2 | 0.4600 | 0.4100 | 0.4800 |" in card
    assert "alpha **0.4100**" in card and "Continued from `models/smollm2-135m-draft`" in card
    assert "3 of them second turns" in card


def test_distill_speed_times_the_bench_methods_and_refuses_an_unknown_one_before_any_model(capsys):
    """``--methods`` defaults to the bench's configured methods (the one default list of methods to time lives in
    conf/), and a name that is not registered exits 2 naming the registered methods, before any model loads."""
    import yaml  # noqa: PLC0415

    from pipeline.decoding import METHODS  # noqa: PLC0415
    from pipeline.training import speed  # noqa: PLC0415

    configured = yaml.safe_load((REPO / "conf" / "bench.yaml").read_text())["methods"]
    assert speed.parse_args([]).methods == configured and set(configured) <= set(METHODS)
    assert speed.parse_args(["--methods", "ar", "typical"]).methods == ["ar", "typical"]
    with pytest.raises(SystemExit) as exit_info:
        speed.parse_args(["--methods", "ar", "nope"])
    assert exit_info.value.code == 2
    assert "--methods: unknown method 'nope'; valid methods: the registered methods" in capsys.readouterr().err
