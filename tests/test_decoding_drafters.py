"""Drafters (draft model, EAGLE head, n-gram lookup) under the chain methods: exactness against the
enumerated warped target law, greedy identity with ``ar``, MTAD's tau = 1 limit, the EAGLE head's
published checkpoint layout, n-gram lookup, and validation before any model loads."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from helpers.exact import WARP, chi_square_pvalue, exact_law, first_tokens
from helpers.heads import with_eagle
from helpers.models import tiny_llama
from pipeline.decoding import build_decoder, check_method, make_generator
from pipeline.decoding.base import DRAFTERS, DrafterContext
from pipeline.decoding.batched import BatchedDecoder
from pipeline.decoding.drafter_scope import DRAFT, PAIR, register_drafter
from pipeline.decoding.drafters import NgramDrafter
from pipeline.decoding.eagle import (
    EagleHead,
    EagleRunner,
    attach_eagle_head,
    eagle_config,
    load_eagle_head,
    save_eagle_head,
)
from pipeline.decoding.warping import Warper
from pipeline.measure.costs import cost_model

PROMPT = [0, 3, 5, 0, 3]  # repeats: the n-gram drafter finds matches from the first step


@pytest.fixture(scope="module")
def eagle_pair():
    return with_eagle(tiny_llama(0)), tiny_llama(1)


@pytest.fixture(scope="module")
def law(eagle_pair):
    return exact_law(eagle_pair[0], PROMPT, 2, Warper(**WARP))


def samples_of(decoder, n, length=2, max_new=4, seed=99):
    return first_tokens(decoder, n, length, seed=seed, max_new=max_new, prompt=PROMPT)  # batched: the batch-1 samples


@pytest.mark.parametrize("drafter", ["eagle", "ngram"])  # drafter: model: test_decoding_engine.py
# block over the same drafters: opt-in (make test-slow); block's rule is checked by default in test_decoding_engine.py
@pytest.mark.parametrize("method", ["spd", pytest.param("block", marks=pytest.mark.slow)])
def test_lossless_with_every_drafter(eagle_pair, law, method, drafter):
    decoder = build_decoder(method, *eagle_pair, drafter=drafter, gamma=3, **WARP)
    out = samples_of(decoder, 2500)
    assert chi_square_pvalue(out, law) > 1e-3
    if drafter != "model":
        assert decoder.draft is None  # no draft model cache is built for other drafters


@pytest.mark.parametrize(
    "drafter", [pytest.param("eagle", marks=pytest.mark.slow), "ngram"]
)  # eagle: opt-in (make test-slow)
def test_mtad_tau_one_samples_like_ar(eagle_pair, law, drafter):
    decoder = build_decoder("mtad", *eagle_pair, drafter=drafter, tau=1.0, gamma=3, **WARP)
    assert chi_square_pvalue(samples_of(decoder, 2000), law) > 1e-3
    out = decoder.generate(PROMPT, max_new_tokens=12, generator=make_generator(0))
    assert out.accepted == [1] * 12


@pytest.fixture(scope="module")
def greedy_eagle_pair():
    return with_eagle(tiny_llama(10, vocab=64, hidden=32, layers=2)), tiny_llama(11, vocab=64, hidden=32, layers=1)


@pytest.mark.parametrize("drafter", ["model", "eagle", "ngram"])
@pytest.mark.parametrize("method", ["spd", "block", "mtad", "typical"])
def test_greedy_identity_with_every_drafter(greedy_eagle_pair, method, drafter):
    ar = build_decoder("ar", greedy_eagle_pair[0], temperature=0)
    other = build_decoder(method, *greedy_eagle_pair, temperature=0, gamma=4, drafter=drafter)
    for prompt in ([0], [5, 9, 2, 5, 9], list(range(1, 20)) * 2):
        ref = ar.generate(prompt, max_new_tokens=40).tokens
        got = other.generate(prompt, max_new_tokens=40)
        assert got.tokens == ref
        assert sum(got.accepted) == 40 and len(got.accepted) == got.steps


TREE_SHAPES = {"specinfer": {"k_config": [3, 2]}, "mcss": {"k_config": [3, 2]}, "spectr": {"num_drafts": 3, "gamma": 2}}


# one walk over the EAGLE tree by default; the others opt-in (make test-slow)
@pytest.mark.parametrize(
    "method",
    [pytest.param("specinfer", marks=pytest.mark.slow), "mcss", pytest.param("spectr", marks=pytest.mark.slow)],
)
def test_lossless_with_eagle_trees(eagle_pair, law, method):
    """EAGLE-2 dynamic trees (2 of the 3 root children expanded by cumulative draft probability) under the
    multi-candidate walks, and the head's 3 i.i.d. chains under SpecTr's K-SEQ: children drawn from the
    head's q rows keep the target's law."""
    top = 0 if method == "spectr" else 2  # K-SEQ needs every chain whole
    decoder = build_decoder(
        method, eagle_pair[0], None, drafter={"kind": "eagle", "top_nodes": top}, **TREE_SHAPES[method], **WARP
    )
    assert decoder.draft is None
    out = samples_of(decoder, 2500, max_new=3)  # the depth-2 tree's first iteration emits up to 3 tokens
    assert chi_square_pvalue(out, law) > 1e-3


@pytest.mark.parametrize("drafter", ["model", "eagle"])
@pytest.mark.parametrize("method", ["specinfer", "mcss", "spectr"])
def test_greedy_identity_with_trees(greedy_eagle_pair, method, drafter):
    ar = build_decoder("ar", greedy_eagle_pair[0], temperature=0)
    shape = {"num_drafts": 3, "gamma": 3} if method == "spectr" else {"k_config": [3, 2, 2]}
    other = build_decoder(method, *greedy_eagle_pair, temperature=0, drafter=drafter, **shape)
    for prompt in ([0], [5, 9, 2, 5, 9], list(range(1, 20)) * 2):
        got = other.generate(prompt, max_new_tokens=40)
        assert got.tokens == ar.generate(prompt, max_new_tokens=40).tokens
        assert sum(got.accepted) == 40 and len(got.accepted) == got.steps


@pytest.mark.slow  # ~30 s here, opt-in (make test-slow)
def test_typical_over_eagle_trees(eagle_pair, law, greedy_eagle_pair):
    """typical with tree: true: EAGLE-2's tree (top-k children) under the typical tree walk; greedy is ar's
    greedy, and a threshold nothing passes (epsilon 1, delta huge) samples the target's law."""
    ar = build_decoder("ar", greedy_eagle_pair[0], temperature=0)
    tree = build_decoder(
        "typical", greedy_eagle_pair[0], None, temperature=0, drafter="eagle", tree=True, k_config=[3, 2, 2]
    )
    for prompt in ([0], [5, 9, 2, 5, 9]):
        assert tree.generate(prompt, max_new_tokens=30).tokens == ar.generate(prompt, max_new_tokens=30).tokens
    nothing = build_decoder(
        "typical", eagle_pair[0], None, drafter="eagle", tree=True, k_config=[3, 2], epsilon=1.0, delta=1e9, **WARP
    )
    assert chi_square_pvalue(samples_of(nothing, 1500), law) > 1e-3
    with pytest.raises(
        ValueError, match="cannot use drafter: ngram .drafter ngram makes chain proposals; this method verifies a tree"
    ):
        check_method("typical", {"tree": True, "drafter": "ngram"}, has_draft=False)


def test_eagle_tree_shape_follows_cumulative_draft_probability(eagle_pair):
    """top_nodes: only the most probable nodes of a level get children; max_nodes caps the tree."""
    target = eagle_pair[0]
    for top, budget, k_config in ((1, 0, [3, 2, 2]), (2, 0, [3, 2, 2]), (0, 5, [3, 2, 2])):
        decoder = build_decoder(
            "specinfer",
            target,
            None,
            drafter={"kind": "eagle", "top_nodes": top, "max_nodes": budget},
            k_config=k_config,
            temperature=0,
        )
        with torch.inference_mode():
            decoder.start(PROMPT)
            tree = decoder.drafter_impl.propose_tree(list(PROMPT), k_config, decoder.warper, None)
        parents = [p for p in tree.parents if p >= 0]
        if budget:
            assert len(tree) == budget
        else:
            assert len(tree) == 3 + 2 * top + 2 * top
            level1 = tree.children[0]  # greedy: the root's top-3 tokens, most probable first
            assert {p for p in parents if p in level1} == set(level1[:top])
    with pytest.raises(ValueError, match="top_nodes"):
        check_method(
            "specinfer", {"drafter": {"kind": "eagle", "top_nodes": -1}}, drafters=DrafterContext(has_eagle=True)
        )


def test_eagle_head_with_the_targets_layer_reproduces_the_target():
    """Head wiring (fc -> decoder layer with rotary positions and its KV cache -> the target's LM
    head): a 1-layer target's own layer in the head, fc passing the embedding, gives the target's logits."""
    target = tiny_llama(20, vocab=64, hidden=32, layers=1)
    head = EagleHead(eagle_config(target.config))
    h = target.config.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.bias.zero_()
        head.fc.weight[:, :h] = torch.eye(h)  # x = emb(next token)
        head.layers[0].load_state_dict(target.model.layers[0].state_dict(), strict=False)
        head.layers[0].input_layernorm = target.model.layers[0].input_layernorm
    # the head's output is the target's pre-final-norm state; fold the final norm into the LM head
    head.token_map = None
    attach_eagle_head(target, head)
    runner = EagleRunner(target, head, 64)
    runner.W = (target.lm_head.weight * target.model.norm.weight).detach()
    tokens = torch.tensor([3, 9, 14, 2, 7])
    with torch.no_grad():
        ref = target(tokens[None]).logits[0]
        feats = torch.zeros(len(tokens), h)
        out = runner.step(feats, tokens, 0)  # the target's own layer over the same tokens and positions
        normed = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + target.config.rms_norm_eps)
        got = runner.logits(normed)
    assert torch.allclose(got, ref, atol=1e-4)


def test_eagle_incremental_matches_one_pass():
    target = with_eagle(tiny_llama(3, vocab=32, hidden=32, layers=2))
    runner = EagleRunner(target, target.eagle_head, 32)
    f, x = torch.randn(12, 32), torch.randint(0, 32, (12,))
    with torch.no_grad():
        full = runner.step(f, x, 0)
        runner.reset()
        a = runner.step(f[:5], x[:5], 0)
        runner.step(torch.randn(3, 32), torch.randint(0, 32, (3,)), 5)  # a draft that is then rolled back
        runner.rollback(5)
        b = runner.step(f[5:], x[5:], 5)
    assert torch.allclose(torch.cat([a, b]), full, atol=1e-5)


def _published_checkpoint(tmp_path, embed: bool):
    """A random EAGLE-1 checkpoint written tensor by tensor in the published layout (not via save_eagle_head)."""
    h, inter, heads, kv, vocab = 32, 64, 4, 2, 64
    d = h // heads
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g) * 0.2  # noqa: E731
    state = {
        "fc.weight": r(h, 2 * h),
        "fc.bias": r(h),
        "layers.0.self_attn.q_proj.weight": r(heads * d, h),
        "layers.0.self_attn.k_proj.weight": r(kv * d, h),
        "layers.0.self_attn.v_proj.weight": r(kv * d, h),
        "layers.0.self_attn.o_proj.weight": r(h, heads * d),
        "layers.0.mlp.gate_proj.weight": r(inter, h),
        "layers.0.mlp.up_proj.weight": r(inter, h),
        "layers.0.mlp.down_proj.weight": r(h, inter),
        "layers.0.post_attention_layernorm.weight": 1 + r(h),
    }
    if embed:
        state["embed_tokens.weight"] = r(vocab, h)
    save_file(state, tmp_path / "model.safetensors")
    config = {
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
        "torch_dtype": "float16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return state


@pytest.mark.parametrize("embed", [False, True])
def test_published_layout_loads_and_computes_eagle(tmp_path, embed):
    state = _published_checkpoint(tmp_path, embed)
    target = tiny_llama(4, vocab=64, hidden=32, layers=1)
    head = load_eagle_head(tmp_path, target)
    assert target.eagle_head is head and (head.embed_tokens is not None) == embed
    f, tok = torch.randn(1, 32), torch.tensor([7])
    emb = state["embed_tokens.weight"][tok] if embed else target.get_input_embeddings().weight[tok].detach()
    # reference by hand, one position: attention over a single key is the value itself
    x = F.linear(torch.cat([emb, f], -1), state["fc.weight"], state["fc.bias"])
    v = F.linear(x, state["layers.0.self_attn.v_proj.weight"]).view(1, 2, 8).repeat_interleave(2, 1).reshape(1, 32)
    x = x + F.linear(v, state["layers.0.self_attn.o_proj.weight"])
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * state["layers.0.post_attention_layernorm.weight"]
    ref = x + F.linear(
        F.silu(F.linear(n, state["layers.0.mlp.gate_proj.weight"])) * F.linear(n, state["layers.0.mlp.up_proj.weight"]),
        state["layers.0.mlp.down_proj.weight"],
    )
    with torch.no_grad():
        got = EagleRunner(target, head, 64).step(f, tok, 0)
    assert torch.allclose(got, ref, atol=1e-5)


def test_bad_checkpoints_are_refused(tmp_path):
    state = _published_checkpoint(tmp_path, False)
    del state["fc.bias"]
    state["layers.0.input_layernorm.weight"] = torch.ones(32)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="unexpected tensors .*input_layernorm"):
        load_eagle_head(tmp_path)
    save_file(
        {**load_file(tmp_path / "model.safetensors"), "midlayer.self_attn.q_proj.weight": torch.zeros(1)},
        tmp_path / "model.safetensors",
    )
    with pytest.raises(ValueError, match="EAGLE-3"):
        load_eagle_head(tmp_path)
    with pytest.raises(ValueError, match="train_eagle"):
        load_eagle_head(tmp_path / "nothing")


def test_save_and_load_round_trip_with_a_restricted_head(tmp_path):
    target = with_eagle(tiny_llama(6, vocab=64, hidden=32, layers=1))
    token_map = torch.tensor([1, 5, 9, 30, 63])
    save_eagle_head(target.eagle_head, tmp_path, token_map=token_map, dtype=torch.float32)
    other = tiny_llama(6, vocab=64, hidden=32, layers=1)
    head = load_eagle_head(tmp_path, other)
    runner = EagleRunner(other, head, 64)
    with torch.no_grad():
        z = runner.logits(runner.step(torch.randn(2, 32), torch.tensor([1, 2]), 0))
    assert torch.isfinite(z).sum(-1).tolist() == [5, 5]
    assert torch.isfinite(z[:, token_map]).all()


def test_saved_config_carries_the_top_level_rope_theta(tmp_path):
    """The authors' EAGLE code reads the rotary base from config.rope_theta (10000 when absent)."""
    target = tiny_llama(6, vocab=64, hidden=32, layers=1, rope_theta=1e5)
    head = EagleHead(eagle_config(target.config))
    save_eagle_head(head, tmp_path, dtype=torch.float32)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rope_theta"] == 1e5 == config["rope_parameters"]["rope_theta"]
    assert load_eagle_head(tmp_path).config.rope_parameters["rope_theta"] == 1e5


@pytest.mark.parametrize("drafter", ["model", "eagle", "ngram"])
def test_each_drafter_measures_its_own_draft_cost(eagle_pair, drafter):
    """The cell's t_draft is the cell's own drafter's work, timed by the loop's clock: every proposal falls in the
    draft phase of its iteration (a model or head proposal of 3 is 3 forwards, a lookup one), and the cost model
    reads one draft position's cost off them."""
    decoder = build_decoder("spd", *eagle_pair, drafter=drafter, gamma=3, **WARP)
    engine = BatchedDecoder(decoder, 1)
    engine.generate([PROMPT], max_new_tokens=13, generators=[make_generator(0)])
    its = engine.clock.records()
    impl = decoder.drafter_impl
    work = {"model": lambda: impl.model.forwards, "eagle": lambda: impl.runner.forwards, "ngram": lambda: impl.lookups}[
        drafter
    ]()
    drafting = [it for it in its if it.positions > 0]
    assert drafting and all(it.draft_s > 0 for it in drafting)
    if drafter == "ngram":
        assert work == len(its) - 1  # a lookup an iteration but the last (no room left)
    else:
        assert work >= sum(it.positions for it in drafting)
    costs = cost_model(its, 1, its)
    assert math.isfinite(costs["t_draft_step_ms"]) and costs["t_draft_step_ms"] > 0


def test_ngram_lookup():
    d = NgramDrafter(device="cpu", max_ngram=3, min_ngram=1)
    assert d.lookup([1, 2, 3, 4, 1, 2, 3], 2) == [4, 1]  # the trigram [1 2 3] matched
    assert d.lookup([1, 2, 9, 7, 2, 8, 2], 3) == [8, 2]  # unigram 2: most recent earlier match, cut at the end
    assert d.lookup([5, 6, 7], 3) == []  # no match
    ctx = [4, 4, 7, 1, 4, 4]  # bigram [4 4] matched at 0 (the longest n wins over unigram matches)
    assert d.lookup(ctx, 3) == [7, 1, 4]
    draft = d.propose([1, 2, 3, 1, 2], 2, Warper(1.0, 0, 1.0), None)
    # a deterministic proposal carries no rows (each q is the point mass at its token), no [g, V] one-hot
    assert draft.tokens.tolist() == [3, 1] and draft.probs is None
    assert draft.q_at_tokens().tolist() == [1.0, 1.0] and draft.one_hot(50)[0, 3] == 1.0 == draft.one_hot(50).sum() / 2
    assert NgramDrafter("cpu", max_ngram=3, min_ngram=2).lookup([1, 2, 9, 2], 3) == []


def test_ngram_without_match_takes_plain_target_steps(eagle_pair):
    decoder = build_decoder("spd", *eagle_pair, drafter="ngram", temperature=0, gamma=4)
    out = decoder.generate([0, 1, 2, 3, 4, 5, 6, 7], max_new_tokens=1)
    assert out.steps == 1 and out.draft_steps == 0


def test_drafter_validation_before_any_model():
    pair = {"name": "p", "target": {"id": "t"}, "draft": {"id": "d"}}
    ctx = DrafterContext.of_pair(pair)
    assert check_method("spd", {}, drafters=ctx)["drafter"] == {"kind": "model"}
    assert check_method("spd", {"drafter": "ngram"}, has_draft=False)["drafter"] == {
        "kind": "ngram",
        "max_ngram": 3,
        "min_ngram": 1,
    }
    # the drafter's own scope, and the pre-plugin short form folded into it
    assert (
        check_method("spd", {"drafter": {"kind": "ngram", "max_ngram": 5}}, has_draft=False)["drafter"]["max_ngram"]
        == 5
    )
    assert check_method("block", {"drafter": "ngram", "max_ngram": 2}, has_draft=False)["drafter"]["max_ngram"] == 2
    with pytest.raises(ValueError, match="drafter model has no parameter"):
        check_method("spd", {"max_ngram": 2}, drafters=ctx)
    with pytest.raises(ValueError, match="drafter ngram has no parameter.*reach"):
        check_method("spd", {"drafter": {"kind": "ngram", "reach": 2}}, drafters=ctx)
    with pytest.raises(ValueError, match="eagle: models/"):
        check_method("block", {"drafter": "eagle"}, drafters=ctx)
    eagle_ctx = DrafterContext.of_pair({**pair, "eagle": "models/x", "drafter": "eagle"})
    assert check_method("spd", {}, drafters=eagle_ctx)["drafter"] == {
        "kind": "eagle",
        "path": None,
        "top_nodes": 4,
        "max_nodes": 0,
    }
    assert check_method("bild", {}, drafters=eagle_ctx)["drafter"] == {"kind": "model"}  # pair: the method's fallback
    assert check_method("specinfer", {}, drafters=eagle_ctx)["drafter"]["kind"] == "eagle"  # EAGLE trees
    for method in ("spectr", "specinfer", "mcss", "bild"):
        for kind in ("ngram",) if method in ("specinfer", "mcss", "spectr") else ("ngram", "eagle", "eagle3"):
            with pytest.raises(ValueError, match=f"cannot use drafter: {kind}"):
                check_method(method, {"drafter": kind}, drafters=eagle_ctx)
    for method in ("specinfer", "mcss", "spectr"):  # EAGLE trees (spectr: k chains)
        assert (
            check_method(method, {"drafter": "eagle"}, has_draft=False, drafters=eagle_ctx)["drafter"]["kind"]
            == "eagle"
        )
    # SpecTr's K-SEQ needs its k chains whole: a head's tree budget must not stop any of them
    with pytest.raises(ValueError, match="top_nodes=2 would stop 2 of the 4 chains"):
        check_method("spectr", {"drafter": {"kind": "eagle", "top_nodes": 2}}, has_draft=False, drafters=eagle_ctx)
    with pytest.raises(ValueError, match="max_nodes=10 would cut"):
        check_method("spectr", {"drafter": {"kind": "eagle", "max_nodes": 10}}, has_draft=False, drafters=eagle_ctx)
    assert (
        check_method(
            "spectr",
            {"drafter": {"kind": "eagle", "top_nodes": 0, "max_nodes": 16}, "num_drafts": 4, "gamma": 4},
            has_draft=False,
            drafters=eagle_ctx,
        )["drafter"]["max_nodes"]
        == 16
    )
    with pytest.raises(ValueError, match="needs a draft model"):
        check_method("spd", {"drafter": "model"}, has_draft=False)
    with pytest.raises(ValueError, match="min_ngram"):
        check_method("spd", {"drafter": "ngram", "min_ngram": 3, "max_ngram": 2})
    with pytest.raises(ValueError, match="drafter"):
        DrafterContext.of_pair({**pair, "drafter": "medusa"})
    with pytest.raises(ValueError, match="kind"):
        check_method("spd", {"drafter": {"max_ngram": 3}}, drafters=ctx)


@pytest.mark.parametrize("kind", [PAIR, DRAFT])
def test_no_plugin_may_take_a_pseudo_kind(kind):
    """``pair`` and ``draft`` are values of the ``drafter`` parameter that name no plugin (one constant each)."""
    plugin = type("Shadow", (NgramDrafter,), {"kind": kind})
    with pytest.raises(ValueError, match=f"a drafter plugin needs a kind other than pair/draft, got '{kind}'"):
        register_drafter(plugin)
    assert kind not in DRAFTERS
