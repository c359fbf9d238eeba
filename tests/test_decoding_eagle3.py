"""EAGLE-3 drafting (``pipeline.decoding.eagle3``): exactness against the enumerated warped target law
for spd and block, greedy identity with ``ar``, the acceptance sequence of a random head in the authors'
layout against an independent reference forward written after the authors' code, and checkpoints
written tensor by tensor in the two published layouts (authors', ``speculators``) loading both ways."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from helpers.exact import WARP, chi_square_pvalue, exact_law, first_tokens
from helpers.heads import eagle3_head_folder, eagle_head_folder
from helpers.models import tiny_llama
from pipeline.decoding import build_decoder, check_method, make_generator
from pipeline.decoding.base import DrafterContext
from pipeline.decoding.eagle import load_eagle
from pipeline.decoding.eagle3 import Eagle3Head, default_taps, eagle3_config, load_eagle3_head, save_eagle3_head
from pipeline.decoding.warping import Warper

PROMPT = [0, 3, 5, 0, 3]


def random_head(target, seed: int, draft_ids, scale: float = 0.5) -> Eagle3Head:
    """A random EAGLE-3 head for ``target`` over the draft vocabulary ``draft_ids`` (weights far from tiny)."""
    torch.manual_seed(seed)
    head = Eagle3Head(eagle3_config(target.config), len(draft_ids))
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else torch.randn_like(p) * scale)
        head.set_vocab(torch.tensor(draft_ids))
    return head.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0, layers=7)  # taps the inputs of layers 2, 3, 4
    return target, random_head(target, 7, [0, 1, 2, 3, 5, 6])  # ids 4 and 7 outside the draft vocabulary


@pytest.fixture(scope="module")
def law(pair):
    return exact_law(pair[0], PROMPT, 2, Warper(**WARP))


def samples_of(decoder, n, length=2, max_new=4, seed=99):
    return first_tokens(decoder, n, length, seed=seed, max_new=max_new, prompt=PROMPT)  # batched: the batch-1 samples


# EAGLE-3 chains: opt-in (make test-slow; ~2 min each on this CPU without bf16 kernels); by default the EAGLE-3
# tree below, the EAGLE chain (test_decoding_drafters.py) and greedy identity for every method check the path
@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow) for m in ("spd", "block")])
def test_lossless_with_an_eagle3_drafter(pair, law, method):
    target, head = pair
    decoder = build_decoder(method, target, None, assets={"eagle": head}, drafter="eagle3", gamma=3, **WARP)
    assert (
        decoder.args.drafter == {"kind": "eagle3", "path": None, "top_nodes": 4, "max_nodes": 0}
        and decoder.draft is None
    )
    out = samples_of(decoder, 2000)
    assert chi_square_pvalue(out, law) > 1e-3
    # the draft rows put no mass outside the head's draft vocabulary (q = 0 there)
    with torch.inference_mode():
        decoder.start(PROMPT)
        chain = decoder.drafter_impl.propose(list(PROMPT), 3, decoder.warper, make_generator(0))
    assert float(chain.probs[:, [4, 7]].sum()) == 0.0 and torch.allclose(chain.probs.sum(-1), torch.ones(3))


# one tree walk over the EAGLE-3 tree by default; the others opt-in (make test-slow; ~2-3 min each on this CPU)
@pytest.mark.parametrize(
    "method",
    ["specinfer", pytest.param("mcss", marks=pytest.mark.slow), pytest.param("spectr", marks=pytest.mark.slow)],
)
def test_lossless_with_eagle3_trees(pair, law, method):
    target, head = pair
    shape = {"num_drafts": 3, "gamma": 2} if method == "spectr" else {"k_config": [3, 2]}
    drafter = {"kind": "eagle3", "top_nodes": 0 if method == "spectr" else 2}
    decoder = build_decoder(method, target, None, assets={"eagle": head}, drafter=drafter, **shape, **WARP)
    # 1200 draws, as the other tree rules' law tests (test_decoding_tree_methods.py): 2000 took ~4 min of the suite;
    # 3 new tokens as there: the depth-2 tree's first iteration emits them all (a 4th cost a second iteration whose
    # tokens the law of the first two never reads)
    assert chi_square_pvalue(samples_of(decoder, 1200, max_new=3), law) > 1e-3


def test_eagle_short_form_resolves_to_eagle3(pair):
    target, head = pair
    decoder = build_decoder("spd", target, None, assets={"eagle": head}, drafter="eagle", temperature=0)
    assert decoder.args.drafter["kind"] == "eagle3"
    with pytest.raises(ValueError, match="cannot use drafter: eagle3"):
        build_decoder("bild", target, tiny_llama(1), assets={"eagle": head}, drafter="eagle3")


@pytest.fixture(scope="module")
def greedy_pair():
    target = tiny_llama(10, vocab=64, hidden=32, layers=8)
    return target, random_head(target, 11, list(range(0, 64, 2)) + [1, 3, 5], scale=0.3)


@pytest.mark.parametrize("method", ["spd", "block", "mtad", "typical", "specinfer", "mcss", "typical-tree"])
def test_greedy_identity_with_ar(greedy_pair, method):
    target, head = greedy_pair
    ar = build_decoder("ar", target, temperature=0)
    shape = {"k_config": [3, 2, 2]} if method in ("specinfer", "mcss") else {"gamma": 4}
    if method == "typical-tree":
        method, shape = "typical", {"k_config": [3, 2, 2], "tree": True}
    other = build_decoder(method, target, None, assets={"eagle": head}, temperature=0, drafter="eagle3", **shape)
    for prompt in ([0], [5, 9, 2, 5, 9], list(range(1, 20)) * 2):
        ref = ar.generate(prompt, max_new_tokens=30).tokens
        got = other.generate(prompt, max_new_tokens=30)
        assert got.tokens == ref
        assert sum(got.accepted) == 30 and len(got.accepted) == got.steps


# ------------------------------------------------------------------------------------------------
# An independent reference, written after the authors' EAGLE-3 code (no KV cache, no module of ours)
# ------------------------------------------------------------------------------------------------


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


def reference_head(s, cfg, feats, embeds):
    """The authors' forward over a whole sequence: ``feats [n, 3h]`` (target) or ``[n, h]`` (own), rows at
    positions 0..n-1; returns the midlayer output (before ``norm``)."""
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, eps, theta = h // heads, cfg["rms_norm_eps"], cfg["rope_theta"]
    x = torch.stack([F.linear(f, s["fc.weight"]) if f.shape[-1] != h else f for f in feats])
    n = x.shape[0]
    residual = x
    a = torch.cat(
        [_rms(embeds, s["midlayer.input_layernorm.weight"], eps), _rms(x, s["midlayer.hidden_norm.weight"], eps)], -1
    )
    q = F.linear(a, s["midlayer.self_attn.q_proj.weight"]).view(n, heads, d).transpose(0, 1)
    k = F.linear(a, s["midlayer.self_attn.k_proj.weight"]).view(n, kv, d).transpose(0, 1)
    v = F.linear(a, s["midlayer.self_attn.v_proj.weight"]).view(n, kv, d).transpose(0, 1)
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = torch.arange(n).float()[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d) + torch.triu(torch.full((n, n), float("-inf")), 1)
    o = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, heads * d)
    x = residual + F.linear(o, s["midlayer.self_attn.o_proj.weight"])
    m = _rms(x, s["midlayer.post_attention_layernorm.weight"], eps)
    return x + F.linear(
        F.silu(F.linear(m, s["midlayer.mlp.gate_proj.weight"])) * F.linear(m, s["midlayer.mlp.up_proj.weight"]),
        s["midlayer.mlp.down_proj.weight"],
    )


def reference_greedy_spd(target, s, cfg, prompt, gamma, max_new):
    """Greedy speculative decoding with the reference head: tokens and tokens emitted per target step."""
    L = target.config.num_hidden_layers
    emb = target.get_input_embeddings().weight.detach()
    d2t = s["d2t"]
    ctx, accepted = list(prompt), []
    while len(ctx) - len(prompt) < max_new:
        g = min(gamma, max_new - (len(ctx) - len(prompt)) - 1)
        with torch.no_grad():
            hs = target(torch.tensor([ctx]), output_hidden_states=True).hidden_states
            feats = list(torch.cat([hs[2][0], hs[L // 2][0], hs[L - 3][0]], -1)[:-1])  # inputs of layers 2, L/2, L-3
            toks = ctx[1:]
            drafts = []
            for _ in range(g):
                out = reference_head(s, cfg, feats, emb[torch.tensor(toks)])
                z = F.linear(_rms(out[-1], s["norm.weight"], cfg["rms_norm_eps"]), s["lm_head.weight"])
                t = int(z.argmax()) + int(d2t[int(z.argmax())])
                drafts.append(t)
                feats.append(out[-1])
                toks.append(t)
            logits = target(torch.tensor([ctx + drafts])).logits[0, len(ctx) - 1 :]
        want = logits.argmax(-1).tolist()
        n = 0
        while n < len(drafts) and drafts[n] == want[n]:
            n += 1
        ctx += drafts[:n] + [want[n]]
        accepted.append(n + 1)
    return ctx[len(prompt) :], accepted


def _authors_checkpoint(folder, target, seed, draft_ids, layout="eagle", scale=0.4):
    """A random EAGLE-3 head written tensor by tensor (not by save_eagle3_head) in a published layout."""
    h, heads, kv = target.config.hidden_size, target.config.num_attention_heads, target.config.num_key_value_heads
    d, inter, vocab = h // heads, 2 * h, target.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g) * scale  # noqa: E731
    ids = torch.tensor(sorted(draft_ids))
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    prefix = "midlayer." if layout == "eagle" else "layers.0."
    state = {
        "fc.weight": r(h, 3 * h),
        "norm.weight": 1 + r(h) / 2,
        "lm_head.weight": r(len(ids), h) * 4,
        "d2t": ids - torch.arange(len(ids)),
        "t2d": t2d,
        prefix + "self_attn.q_proj.weight": r(heads * d, 2 * h),
        prefix + "self_attn.k_proj.weight": r(kv * d, 2 * h),
        prefix + "self_attn.v_proj.weight": r(kv * d, 2 * h),
        prefix + "self_attn.o_proj.weight": r(h, heads * d),
        prefix + "mlp.gate_proj.weight": r(inter, h),
        prefix + "mlp.up_proj.weight": r(inter, h),
        prefix + "mlp.down_proj.weight": r(h, inter),
        prefix + "hidden_norm.weight": 1 + r(h) / 2,
        prefix + "input_layernorm.weight": 1 + r(h) / 2,
        prefix + "post_attention_layernorm.weight": 1 + r(h) / 2,
    }
    llama = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "bias": False,
        "torch_dtype": "float32",
    }
    if layout == "eagle":
        config = {**llama, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": len(ids)}
    else:
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": llama,
            "draft_vocab_size": len(ids),
            "norm_before_residual": False,
            "target_hidden_size": None,
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 4}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]},
            },
        }
    folder.mkdir(parents=True, exist_ok=True)
    if layout == "eagle":
        torch.save(state, folder / "pytorch_model.bin")  # the authors ship a PyTorch state dict
    else:
        save_file(state, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config))
    return {k.replace("layers.0.", "midlayer."): v for k, v in state.items()}, llama


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
def test_random_published_head_gives_the_reference_acceptance(tmp_path, layout):
    target = tiny_llama(30, vocab=12, hidden=32, layers=8, heads=4, kv_heads=2, scale=2.0)
    state, cfg = _authors_checkpoint(tmp_path / "head", target, 3, [0, 2, 3, 5, 7, 11], layout)
    assert (
        DrafterContext.of_pair({"name": "p", "target": {"id": "t"}, "eagle": str(tmp_path / "head")}).eagle_version == 3
    )
    # the pair path: `eagle: <folder>` -> load_eagle -> assets; `drafter: eagle` resolves to eagle3 before loading
    ctx = DrafterContext.of_pair({"name": "p", "target": {"id": "t"}, "eagle": str(tmp_path / "head")})
    params = check_method("spd", {"drafter": "eagle", "temperature": 0, "gamma": 4}, drafters=ctx)
    assert params["drafter"]["kind"] == "eagle3"
    head = load_eagle(tmp_path / "head", target)
    decoder = build_decoder("spd", target, None, assets={"eagle": head}, **params)
    seen = []
    for prompt in ([1, 5, 9, 2], [0, 3, 3, 7, 11, 3, 3]):
        want_tokens, want_accepted = reference_greedy_spd(target, state, cfg, prompt, 4, 24)
        got = decoder.generate(prompt, max_new_tokens=24)
        assert got.tokens == want_tokens
        assert got.accepted == want_accepted
        seen += want_accepted
    assert max(seen) >= 4  # several drafts in a row are accepted: the comparison covers drafting on predicted features


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
def test_round_trip_in_both_layouts(tmp_path, layout):
    target = tiny_llama(31, vocab=48, hidden=32, layers=8, heads=4, kv_heads=2)
    state, _ = _authors_checkpoint(tmp_path / "in", target, 4, list(range(0, 48, 2)), "eagle")
    head = load_eagle3_head(tmp_path / "in")
    save_eagle3_head(head, tmp_path / "out", layout=layout, dtype=torch.float32, verifier="tiny")
    written = load_file(tmp_path / "out" / "model.safetensors")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    prefix = "midlayer." if layout == "eagle" else "layers.0."
    for name, tensor in state.items():  # tensor by tensor, under the layout's names
        key = name.replace("midlayer.", prefix)
        assert torch.equal(written[key], tensor.to(written[key].dtype)), key
    assert written["d2t"].dtype == torch.int64 and written["t2d"].dtype == torch.bool
    if layout == "eagle":
        assert (
            config["draft_vocab_size"] == 24
            and config["rope_theta"] == 10000.0
            and config["architectures"] == ["LlamaForCausalLMEagle3"]
        )
    else:
        assert config["speculators_model_type"] == "eagle3" and config["speculators_config"]["algorithm"] == "eagle3"
        assert config["transformer_layer_config"]["rope_theta"] == 10000.0 and config["draft_vocab_size"] == 24
    again = load_eagle3_head(tmp_path / "out")
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))


def test_speculators_config_validates_with_the_library(tmp_path):
    # `make test` does not install it (it pins an older transformers): `make check-speculators` runs this
    speculators = pytest.importorskip("speculators")
    target = tiny_llama(31, vocab=48, hidden=32, layers=8, heads=4, kv_heads=2)
    _authors_checkpoint(tmp_path / "in", target, 4, list(range(0, 48, 2)), "eagle")
    save_eagle3_head(load_eagle3_head(tmp_path / "in"), tmp_path / "out", layout="speculators", verifier="tiny")
    from speculators.models.eagle3 import Eagle3SpeculatorConfig  # noqa: PLC0415 - optional package

    config = Eagle3SpeculatorConfig.from_pretrained(tmp_path / "out")
    assert config.draft_vocab_size == 24 and speculators is not None
    # a head made by the training code (pipeline.training.eagle3.new_head), re-saved in the speculators layout,
    # validates as well
    made = load_eagle3_head(eagle3_head_folder(target, tmp_path / "made", torch.arange(0, 48, 3)))
    save_eagle3_head(made, tmp_path / "made-spec", layout="speculators", verifier="tiny")
    config = Eagle3SpeculatorConfig.from_pretrained(tmp_path / "made-spec")
    assert config.transformer_layer_config.hidden_size == 32 and config.draft_vocab_size == made.d2t.numel() == 16


def test_bad_heads_are_refused(tmp_path):
    target = tiny_llama(32, vocab=48, hidden=32, layers=8, heads=4, kv_heads=2)
    state, _ = _authors_checkpoint(tmp_path / "h", target, 5, list(range(0, 48, 2)), "eagle")
    state["d2t"] = state["d2t"] + 1  # no longer the ids t2d marks
    torch.save(state, tmp_path / "h" / "pytorch_model.bin")
    with pytest.raises(ValueError, match="d2t and t2d disagree"):
        load_eagle3_head(tmp_path / "h")
    with pytest.raises(ValueError, match="three distinct layers"):
        default_taps(5)
    eagle1 = {"name": "p", "target": {"id": "t"}, "eagle": str(eagle_head_folder(target, tmp_path / "eagle1"))}
    with pytest.raises(ValueError, match="use drafter: eagle"):
        check_method("spd", {"drafter": "eagle3"}, drafters=DrafterContext.of_pair(eagle1))
