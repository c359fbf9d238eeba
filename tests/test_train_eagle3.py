"""EAGLE-3 training (``pipeline.training.eagle3``): the authors' training-time test on tiny random targets -
the extended mask written out by hand, the unrolled forward against an independent reference of the authors'
attention, the feed-back of the head's own output, a loss that training lowers, determinism, the draft
vocabulary, a saved head that the engine loads and drafts with, and held-out alpha that training raises."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from helpers.models import tiny_llama
from helpers.paths import REPO
from pipeline.decoding import build_decoder
from pipeline.decoding.eagle3 import default_taps, load_eagle3_head
from pipeline.decoding.warping import Warper
from pipeline.train_eagle import training_config
from pipeline.training.eagle3 import (
    LOSS_DECAY,
    draft_vocab,
    fit,
    heldout_alpha,
    new_head,
    tap_states,
    train_eagle3,
    ttt_batch,
    ttt_forward,
    ttt_loss,
    ttt_mask,
    windows,
)

VOCAB, LAYERS = 16, 7  # taps: the inputs of layers 2, 3, 4


@pytest.fixture(scope="module")
def target():
    return tiny_llama(40, vocab=VOCAB, hidden=32, layers=LAYERS, heads=4, kv_heads=2).requires_grad_(False)


def sampled_text(target, n: int, length: int, seed: int) -> list[list[int]]:
    """Sequences the target writes itself (T = 1): its next token is what the head has to learn."""
    g = torch.Generator().manual_seed(seed)
    out = []
    with torch.no_grad():
        for _ in range(n):
            s = [int(torch.randint(1, VOCAB, (1,), generator=g))]
            for _ in range(length - 1):
                p = torch.softmax(target(torch.tensor([s])).logits[0, -1], -1)
                s.append(int(torch.multinomial(p, 1, generator=g)))
            out.append(s)
    return out


@pytest.fixture(scope="module")
def data(target):
    taps = default_taps(LAYERS)
    return {
        "train": tap_states(target, sampled_text(target, 12, 40, 1), taps, log=lambda m: None),
        "heldout": tap_states(target, sampled_text(target, 4, 40, 2), taps, log=lambda m: None),
    }


def config(out_dir, steps: int = 40, **train) -> dict:
    return {
        "seed": 0,
        "out_dir": str(out_dir),
        "command": "test",
        "head": {"draft_vocab_size": 12, "init_from_target": False, "save_dtype": "float32"},
        "train": {
            "steps": steps,
            "batch": 4,
            "length": 16,
            "ttt_steps": 3,
            "lr": 3e-3,
            "warmup": 5,
            "weight_decay": 0.0,
            "log_every": 0,
            "eval_every": 20,
            "time_budget_s": None,
            **train,
        },
    }


def test_ttt_mask_is_the_authors():
    assert torch.equal(ttt_mask(3, 0), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool))
    # step 2 over the keys of steps 0 | 1 | 2: the causal prefix of step 0, then the row's own entry of steps 1 and 2
    want = torch.tensor(
        [
            [1, 0, 0, 1, 0, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0, 0, 1, 0],
            [1, 1, 1, 0, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(ttt_mask(3, 2), want)


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):
    d = x.shape[-1]
    ang = pos.float()[:, None] * (1.0 / theta ** (torch.arange(0, d, 2).float() / d))[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    a, b = x.chunk(2, -1)
    return x * cos + torch.cat([-b, a], -1) * sin


def authors_ttt(head, feats, emb_ext, steps):
    """The authors' unrolled forward for one sequence (``cnets.Model.forward`` / ``LlamaAttention``), written
    from their code with plain tensors: scores over step 0's keys under the causal mask, then one dot product
    per earlier step with the row's own key, positions ``t + j``."""
    s = {k: v.detach() for k, v in head.state_dict().items()}
    cfg = head.config
    h, nh, kv, eps, theta = (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.rms_norm_eps,
        cfg.rope_parameters["rope_theta"],
    )
    d = h // nh
    n = feats.shape[0]
    hidden = F.linear(feats, s["fc.weight"])
    ks, vs, outs = [], [], []
    for j in range(steps):
        residual = hidden
        a = torch.cat(
            [
                _rms(emb_ext[j : j + n], s["midlayer.input_layernorm.weight"], eps),
                _rms(hidden, s["midlayer.hidden_norm.weight"], eps),
            ],
            -1,
        )
        pos = torch.arange(n) + j
        q = _rope(F.linear(a, s["midlayer.self_attn.q_proj.weight"]).view(n, nh, d).transpose(0, 1), pos, theta)
        k = _rope(F.linear(a, s["midlayer.self_attn.k_proj.weight"]).view(n, kv, d).transpose(0, 1), pos, theta)
        v = F.linear(a, s["midlayer.self_attn.v_proj.weight"]).view(n, kv, d).transpose(0, 1)
        ks.append(k.repeat_interleave(nh // kv, 0))
        vs.append(v.repeat_interleave(nh // kv, 0))
        scores = [(q @ ks[0].transpose(-1, -2)) / math.sqrt(d) + torch.triu(torch.full((n, n), float("-inf")), 1)]
        scores += [((q * ki).sum(-1) / math.sqrt(d))[..., None] for ki in ks[1:]]
        w = torch.cat(scores, -1).softmax(-1)
        o = w[..., :n] @ vs[0]
        for i in range(1, len(ks)):
            o = o + w[..., n + i - 1 : n + i] * vs[i]
        x = residual + F.linear(o.transpose(0, 1).reshape(n, nh * d), s["midlayer.self_attn.o_proj.weight"])
        m = _rms(x, s["midlayer.post_attention_layernorm.weight"], eps)
        x = x + F.linear(
            F.silu(F.linear(m, s["midlayer.mlp.gate_proj.weight"])) * F.linear(m, s["midlayer.mlp.up_proj.weight"]),
            s["midlayer.mlp.down_proj.weight"],
        )
        outs.append(x)
        hidden = x
    return outs


def test_unrolled_forward_matches_the_authors_attention(target, data):
    head = new_head(target, torch.arange(12), init_from_target=False, seed=3)
    with torch.no_grad():
        for name, p in head.named_parameters():  # weights far from their init, so every term counts
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else torch.randn_like(p) * 0.3)
    batch = ttt_batch(data["train"], [(0, 0), (1, 5)], 8, 4)
    emb = target.get_input_embeddings()(batch["ids"])
    with torch.no_grad():
        got = ttt_forward(head, batch["feats"], emb, 4)
        for b in range(2):
            want = authors_ttt(head, batch["feats"][b], emb[b], 4)
            for j in range(4):
                assert torch.allclose(got[j][b], want[j], rtol=1e-4, atol=1e-4), (
                    b,
                    j,
                    float((got[j][b] - want[j]).abs().max()),
                )


def test_step_j_reads_the_heads_own_step_j_minus_1_output(target, data):
    head = new_head(target, torch.arange(12), init_from_target=False, seed=4)
    calls = []
    hook = head.midlayer.register_forward_hook(lambda mod, args, out: calls.append((args[0], args[1], out)))
    batch = ttt_batch(data["train"], [(0, 0), (2, 3)], 8, 3)
    emb = target.get_input_embeddings()(batch["ids"])
    with torch.no_grad():
        outs = ttt_forward(head, batch["feats"], emb, 3)
    hook.remove()
    assert len(calls) == 3
    assert torch.equal(calls[0][1], head.fc(batch["feats"]))  # step 0: the target's fused features
    for j in (1, 2):
        embeds, hidden, _ = calls[j]
        assert hidden is outs[j - 1] and hidden is calls[j - 1][2]  # the head's own previous output, same rows
        assert not torch.allclose(hidden, head.fc(batch["feats"]))
        assert torch.equal(embeds, emb[:, j : j + 8])  # the tokens one position on per step
    # extended positions: step j row t reads x_{s+t+1+j}
    s = data["train"][2]["ids"]
    assert torch.equal(batch["ids"][1], s[4 : 4 + 10])


def test_loss_is_the_authors_weighted_forward_kl(target, data):
    head = new_head(target, torch.tensor([0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 12, 14]), init_from_target=False, seed=5)
    W = target.get_output_embeddings().weight
    batch = ttt_batch(data["train"], [(0, 30), (3, 0)], 16, 3)  # the first window runs past its text
    with torch.no_grad():
        loss, losses, _ = ttt_loss(head, batch, W, target.get_input_embeddings(), 3)
        outs = ttt_forward(head, batch["feats"], target.get_input_embeddings()(batch["ids"]), 3)
    ids = head.draft_to_target()
    want = []
    for j in range(3):
        logits = batch["last"][:, j : j + 16] @ W.T
        keep = torch.isin(logits.argmax(-1), ids) & batch["valid"][:, j : j + 16]
        p = torch.softmax(logits[..., ids], -1)
        logq = torch.log_softmax(head.draft_logits(outs[j]), -1).detach()
        want.append(float(-(keep[..., None] * p * logq).sum(-1).mean()))
    assert batch["valid"][0, 9:].sum() == 0 and not bool(batch["valid"][0].all())
    assert losses == pytest.approx(want, rel=1e-5)
    assert float(loss) == pytest.approx(sum(LOSS_DECAY**j * w for j, w in enumerate(want)), rel=1e-5)


def test_one_training_step_lowers_the_loss(target, data):
    head = new_head(target, torch.arange(12), init_from_target=False, seed=6)
    W, embed = target.get_output_embeddings().weight, target.get_input_embeddings()
    batch = ttt_batch(data["train"], [(0, 0), (1, 16), (2, 0), (5, 8)], 16, 3)
    before, _, _ = ttt_loss(head, batch, W, embed, 3)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3, betas=(0.9, 0.95))
    before.backward()
    opt.step()
    after, _, _ = ttt_loss(head, batch, W, embed, 3)
    assert float(after.detach()) < float(before.detach()) - 1e-3


def test_draft_vocab_is_the_authors_most_frequent_ids():
    text = torch.tensor([5, 5, 5, 2, 2, 9, 9, 9, 9, 1, 7, 7])
    ids, coverage = draft_vocab(text, 3, 12)
    assert ids.tolist() == [2, 5, 9] and coverage == pytest.approx(9 / 12)
    ids, _ = draft_vocab(text, 4, 12)  # 2 and 7 tie (twice each): 2 came in first as the lower id, then 7
    assert ids.tolist() == [2, 5, 7, 9]
    assert draft_vocab(text, 7, 12)[0].tolist() == [0, 1, 2, 3, 5, 7, 9]  # filled up with the lowest unseen ids
    head = new_head(
        tiny_llama(0, vocab=12, hidden=32, layers=7, heads=4, kv_heads=2),
        torch.tensor([2, 5, 9]),
        init_from_target=False,
        seed=0,
    )
    used = [2, 5, 9]
    assert head.d2t.tolist() == [used[i] - i for i in range(3)]  # cnets.scandata
    assert head.t2d.tolist() == [i in used for i in range(12)]


def test_same_seed_gives_bit_identical_weights(target, data):
    W, embed = target.get_output_embeddings().weight, target.get_input_embeddings()
    heads = []
    for _ in range(2):
        head = new_head(target, torch.arange(12), init_from_target=True, seed=7)
        train_eagle3(
            head,
            data["train"],
            W,
            embed,
            steps=6,
            batch=3,
            length=8,
            ttt_steps=3,
            lr=1e-3,
            warmup=2,
            weight_decay=0.0,
            seed=7,
            log_every=0,
        )
        heads.append(head.state_dict())
    assert all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])
    other = new_head(target, torch.arange(12), init_from_target=True, seed=8)
    train_eagle3(
        other,
        data["train"],
        W,
        embed,
        steps=6,
        batch=3,
        length=8,
        ttt_steps=3,
        lr=1e-3,
        warmup=2,
        weight_decay=0.0,
        seed=8,
        log_every=0,
    )
    assert not torch.equal(other.state_dict()["fc.weight"], heads[0]["fc.weight"])


@pytest.fixture(scope="module")
def trained(target, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("eagle3") / "head"
    info = fit(config(out, steps=60, stop_after_steps=None), target, data, base_model="tiny", log=lambda m: None)
    return out, info


def test_training_raises_heldout_alpha(trained, target, data):
    _, info = trained
    curve = info["heldout_alpha_curve"]
    assert [p["step"] for p in curve] == [0, 20, 40, 60]
    assert curve[-1]["heldout"]["alpha"] > curve[0]["heldout"]["alpha"] + 0.1, curve
    # the figure the curve records is the head's: recompute it from the saved head
    head = load_eagle3_head(trained[0])
    r = heldout_alpha(
        head,
        data["heldout"],
        target.get_output_embeddings().weight,
        16,
        target.get_input_embeddings(),
        Warper(1.0, 10, 0.9),
    )
    assert r["alpha"] == pytest.approx(curve[-1]["heldout"]["alpha"], abs=1e-3)
    assert r["tokens"] == sum(s["ids"].numel() - 1 for s in data["heldout"])
    assert len(windows(data["heldout"], 16)) == 4 * 3


def test_saved_head_loads_and_drafts_with_the_engine(trained, target):
    out, info = trained
    head = load_eagle3_head(out)
    assert head.draft_vocab_size == 12 and head.layers_of(LAYERS) == (2, 3, 4)
    card = (out / "MODEL_CARD.md").read_text()
    assert "| step | minutes | alpha (heldout) |" in card and "| 60 | " in card and "training-time test" in card
    ar = build_decoder("ar", target, temperature=0)
    spd = build_decoder("spd", target, None, assets={"eagle": head}, drafter="eagle3", temperature=0, gamma=3)
    assert spd.args.drafter["kind"] == "eagle3"
    for prompt in ([1, 5, 9], [3, 3, 7, 2, 11, 4]):
        got = spd.generate(prompt, max_new_tokens=20)
        assert got.tokens == ar.generate(prompt, max_new_tokens=20).tokens
        assert sum(got.accepted) == 20 and max(got.accepted) >= 2  # the trained head's drafts get accepted
    sampled = build_decoder(
        "spd", target, None, assets={"eagle": head}, drafter="eagle3", gamma=3, temperature=1.0, top_k=10, top_p=0.9
    )
    assert len(sampled.generate([1, 5, 9], max_new_tokens=12).tokens) == 12


@pytest.mark.parametrize("overrides", [["head=eagle3"], ["head=eagle3", "seed=3", "train.steps=7"]])
def test_head_eagle3_short_form_selects_the_eagle3_config(overrides):
    """``python -m pipeline.train_eagle head=eagle3 ...`` trains an EAGLE-3 head, the other overrides kept."""
    GlobalHydra.instance().clear()  # another test in this process may have left Hydra initialised
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = training_config(compose("train_eagle", overrides=overrides), overrides)
        plain = training_config(compose("train_eagle", overrides=overrides[1:]), overrides[1:])
    assert int(cfg["head"]["version"]) == 3 and cfg["out_dir"] == "models/smollm2-135m-eagle3"
    assert int(plain["head"].get("version", 2)) == 2 and plain["out_dir"] == "models/smollm2-135m-eagle"
    if "seed=3" in overrides:
        assert cfg["seed"] == 3 and cfg["train"]["steps"] == 7
