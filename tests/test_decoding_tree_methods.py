"""spectr, specinfer, mcss, bild, typical and medusa on tiny random models: exactness, greedy identity,
limiting cases, tree attention, KV use and parameter validation."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from helpers.exact import PROMPT, WARP, chi_square_pvalue, count_forwards, exact_law, first_tokens
from helpers.models import tiny_llama
from pipeline.decoding import build_decoder, check_method, make_generator
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.medusa_heads import MedusaHeads, place_medusa_heads
from pipeline.decoding.tree import TokenTree
from pipeline.decoding.tree_verify import sample_token_tree, tree_verify_forward
from pipeline.decoding.warping import Warper


@pytest.fixture(scope="module")
def law2(tiny_pair):
    return exact_law(tiny_pair[0], PROMPT, 2, Warper(**WARP))


@pytest.mark.parametrize(
    "method,params,n",
    [
        ("specinfer", {"k_config": [4, 2, 2]}, 2000),
        ("mcss", {"k_config": [4, 2, 2]}, 1200),  # top-k 6 / top-p 0.95: some nodes have < 4 tokens
        ("spectr", {"num_drafts": 3, "gamma": 3}, 1200),
    ],
)
def test_lossless_tree_methods_match_the_target_distribution(tiny_pair, law2, method, params, n):
    decoder = build_decoder(method, *tiny_pair, **WARP, **params)
    samples = first_tokens(decoder, n, 2, max_new=3)  # a depth-2 tree in the first iteration
    assert chi_square_pvalue(samples, law2) > 1e-3


@pytest.mark.parametrize(
    "method,params",
    [
        ("bild", {"rollback": 0.0}),  # every small-model token is rolled back: the target samples
        ("typical", {"epsilon": 1.0, "delta": 100.0}),  # nothing passes: the target samples
    ],
)
def test_lossy_methods_limiting_cases_sample_like_the_target(tiny_pair, law2, method, params):
    decoder = build_decoder(method, *tiny_pair, **WARP, **params)
    samples = first_tokens(decoder, 1200, 2, max_new=3)
    assert chi_square_pvalue(samples, law2) > 1e-3
    out = decoder.generate(PROMPT, max_new_tokens=10, generator=make_generator(0))
    assert out.accepted == [1] * 10


def test_bild_with_fallback_one_never_uses_a_small_token(tiny_pair):
    """The small model is never confident enough: one small forward and one large token per step."""
    decoder = build_decoder("bild", *tiny_pair, **WARP, fallback=1.0)
    out = decoder.generate(PROMPT, max_new_tokens=10, generator=make_generator(0))
    assert out.accepted == [1] * 10 and out.draft_steps == 9  # the last step has no budget for the small model


def test_bild_without_fallback_or_rollback_takes_every_small_token(tiny_pair):
    decoder = build_decoder("bild", *tiny_pair, **WARP, fallback=0.0, rollback=1e9, max_small_steps=4)
    out = decoder.generate(PROMPT, max_new_tokens=17, generator=make_generator(0))
    assert out.accepted == [5, 5, 5, 2] and out.steps == 4


def test_typical_with_epsilon_zero_and_a_self_draft_accepts_every_draft_token(tiny_pair):
    target = tiny_pair[0]
    decoder = build_decoder("typical", target, target, **WARP, epsilon=0.0, gamma=3)
    out = decoder.generate(PROMPT, max_new_tokens=16, generator=make_generator(0))
    assert out.accepted == [4, 4, 4, 4]


@pytest.fixture(scope="module")
def greedy_pair():
    target = tiny_llama(10, vocab=64, hidden=32, layers=2)
    heads = MedusaHeads(32, 3)
    torch.manual_seed(5)
    for p in heads.parameters():  # random (untrained) heads, so the trees differ from the LM head's top-k
        torch.nn.init.normal_(p, std=0.3)
    # (target, draft, assets): the heads passed beside the models as a pair's `medusa:` passes them
    return target, tiny_llama(11, vocab=64, hidden=32, layers=1), {"medusa": place_medusa_heads(target, heads)}


@pytest.mark.parametrize(
    "method,params",
    [
        ("spectr", {}),
        ("spectr", {"num_drafts": 1, "gamma": 2}),
        ("specinfer", {}),
        ("specinfer", {"k_config": [1]}),
        ("specinfer", {"k_config": [2, 1, 3, 1, 1]}),
        ("mcss", {}),
        ("mcss", {"k_config": [3, 3]}),
        ("typical", {}),
        ("typical", {"drafter": "medusa"}),
        ("medusa", {}),
        ("medusa", {"acceptance": "exact", "k_config": [2, 2, 2]}),
        ("bild", {"rollback": 0.0}),
    ],
)
def test_greedy_identity_on_tiny_models(greedy_pair, method, params):
    ar = build_decoder("ar", greedy_pair[0], temperature=0)
    other = build_decoder(method, *greedy_pair, temperature=0, **params)
    for prompt in ([0], [5, 9, 2], list(range(1, 20))):
        ref = ar.generate(prompt, max_new_tokens=40).tokens
        got = other.generate(prompt, max_new_tokens=40)
        assert got.tokens == ref
        assert sum(got.accepted) == len(got.tokens) == 40 and len(got.accepted) == got.steps


def test_typical_over_medusa_heads_is_the_tree_loop_with_the_medusa_drafter(greedy_pair):
    """No decoder nested in another: typical's tree walk runs in its own loop over the medusa drafter."""
    decoder = build_decoder("typical", *greedy_pair, temperature=0, drafter="medusa")
    out = decoder.generate([5, 9, 2], max_new_tokens=8)
    assert decoder.shape == "tree" and decoder.drafter_impl.kind == "medusa" and decoder.draft is None
    assert decoder.target.length > 0 and max(out.drafted) >= 1  # the cache that generated; trees were verified


def test_self_drafted_trees_accept_whole_paths_at_temperature_zero(greedy_pair):
    target = greedy_pair[0]
    out = build_decoder("specinfer", target, target, temperature=0, k_config=[2, 2, 2]).generate(
        [1, 2, 3], max_new_tokens=16
    )
    assert out.accepted == [4, 4, 4, 4]
    out = build_decoder("spectr", target, target, temperature=0, num_drafts=2, gamma=3).generate(
        [1, 2, 3], max_new_tokens=16
    )
    assert out.accepted == [4, 4, 4, 4]


def test_tree_attention_matches_plain_forwards_and_compaction_keeps_the_path():
    """Every node of a sampled draft tree, scored in one target pass, equals a plain forward over its path."""
    target_model = tiny_llama(3, vocab=32, hidden=32, layers=2)
    draft_model = tiny_llama(4, vocab=32, hidden=32, layers=1)
    context = [1, 7, 3, 9, 4]
    target, draft = CachedModel(target_model), CachedModel(draft_model)
    target.prefill(context[:-1])
    warper = Warper(1.0, 0, 1.0)
    tree = sample_token_tree(draft, context, [3, 2, 2], warper, make_generator(0), children="iid")
    assert len(tree) == 3 + 6 + 12 and tree.fed == 9
    logits = tree_verify_forward(target, context, tree)
    assert logits.shape[0] == 1 + len(tree)
    with torch.no_grad():
        ref0 = target_model(torch.tensor([context])).logits[0, -1]
        assert torch.allclose(logits[0], ref0, atol=1e-4)
        for node in range(len(tree)):
            path = [tree.tokens[i] for i in tree.path(node)]
            ref = target_model(torch.tensor([context + path])).logits[0, -1]
            assert torch.allclose(logits[1 + node], ref, atol=1e-4), node
            if node < tree.fed:  # the draft's rows, also computed with tree attention
                q = warper(draft_model(torch.tensor([context + path])).logits[0, -1])
                assert torch.allclose(tree.q_rows[node + 1], q, atol=1e-5), node
        # keep the path to a leaf and continue as a chain: the cache must equal a plain prefix
        leaf = len(tree) - 1
        path = tree.path(leaf)
        target.compact(len(context), path)
        assert target.length == len(context) + len(path)
        got = target.forward([5], keep=1)[-1]
        ref = target_model(torch.tensor([context + [tree.tokens[i] for i in path] + [5]])).logits[0, -1]
        assert torch.allclose(got, ref, atol=1e-4)


@pytest.mark.parametrize(
    "method,params,max_fed",
    [
        ("specinfer", {"k_config": [2, 2, 2]}, 1 + 2 + 4 + 8),
        ("mcss", {"k_config": [3, 2]}, 1 + 3 + 6),
        ("spectr", {"num_drafts": 2, "gamma": 3}, 1 + 6),
        ("medusa", {"k_config": [2, 2]}, 1 + 2 + 4),
        ("typical", {"gamma": 3}, 4),
        ("bild", {"max_small_steps": 3, "fallback": 0.0, "rollback": 1.0}, 4),
    ],
)
def test_target_forwards_are_steps_plus_prefill_and_never_recompute_the_prefix(
    tiny_pair, tiny_assets, method, params, max_fed
):
    target, draft = tiny_pair
    calls, handle = count_forwards(target)
    try:
        decoder = build_decoder(method, target, draft, tiny_assets, **WARP, **params)
        prompt = list(range(8)) * 4
        out = decoder.generate(prompt, max_new_tokens=60, generator=make_generator(3))
    finally:
        handle.remove()
    assert len(calls) == out.steps + 1 == len(out.accepted) + 1
    assert calls[0] == len(prompt) - 1
    assert max(calls[1:]) <= max_fed
    assert sum(out.accepted) == len(out.tokens) == 60


def test_mcss_is_not_significantly_below_specinfer_in_realised_tokens_per_step(tiny_pair):
    """Realised tokens per target step over the same prompts and seeds: MCSS's mean is not below SpecInfer's by
    more than two standard errors of the difference (sampling noise: about 0.06 tokens here). That MCSS accepts at
    least as many tokens is asserted exactly, per instance, in test_decoding_multi_candidate."""
    accepted = {}
    for method in ("specinfer", "mcss"):
        dec = build_decoder(method, *tiny_pair, **WARP, k_config=[3, 2])
        gen = make_generator(11)
        accepted[method] = []
        for prompt in ([0], [1, 2], [3, 4, 5], [6, 7]):
            for _ in range(10):
                accepted[method] += dec.generate(prompt, max_new_tokens=20, generator=gen).accepted
    means = {m: statistics.fmean(a) for m, a in accepted.items()}
    se_diff = math.sqrt(sum(statistics.pvariance(a) / len(a) for a in accepted.values()))
    assert 0 < se_diff < 0.1 and means["mcss"] >= means["specinfer"] - 2 * se_diff, (means, se_diff)


def test_medusa_exact_acceptance_is_lossless(tiny_pair, tiny_assets, law2):
    decoder = build_decoder("medusa", tiny_pair[0], None, tiny_assets, **WARP, acceptance="exact", k_config=[3, 2])
    samples = first_tokens(decoder, 1200, 2, max_new=3)
    assert chi_square_pvalue(samples, law2) > 1e-3


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda t, d: build_decoder("specinfer", t, d, k_config=[]),
            "k_config=[] must be a non-empty list of integers >= 1",
        ),
        (lambda t, d: build_decoder("mcss", t, d, k_config=[2, 0]), "k_config=[2, 0]"),
        (lambda t, d: build_decoder("mcss", t, d, k_config=3), "must be a non-empty list"),
        (lambda t, d: build_decoder("spectr", t, d, num_drafts=0), "num_drafts=0 must be an integer >= 1"),
        (lambda t, d: build_decoder("spectr", t, None), "needs a draft model"),
        (lambda t, d: build_decoder("typical", t, d, epsilon=1.5), "epsilon=1.5 must be a number in [0.0, 1.0]"),
        (lambda t, d: build_decoder("typical", t, d, delta=-1), "delta=-1 must be a number >= 0"),
        (lambda t, d: build_decoder("typical", t, None), "drafter: model needs a draft model"),
        (lambda t, d: build_decoder("typical", tiny_llama(0), d, drafter="medusa"), "train_medusa"),
        (lambda t, d: build_decoder("medusa", tiny_llama(0), None), "add `medusa: models/<dir>` to the pair"),
        (lambda t, d: build_decoder("medusa", t, None, acceptance="exact", recovery="argmax"), "recovery=sample"),
        (lambda t, d: build_decoder("bild", t, d, fallback=1.5), "fallback=1.5"),
        (lambda t, d: build_decoder("bild", t, d, max_small_steps=0), "max_small_steps=0"),
    ],
)
def test_bad_parameters_fail_with_a_clear_message(tiny_pair, call, message):
    with pytest.raises(ValueError) as err:
        call(*tiny_pair)
    assert message in str(err.value)


def test_check_method_fills_defaults():
    assert check_method("specinfer", {})["k_config"] == [4, 2, 2]
    assert check_method("spectr", {})["num_drafts"] == 4
    assert check_method("typical", {"drafter": "medusa"}, has_draft=False)["epsilon"] == 0.09
    with pytest.raises(
        ValueError, match="drafter: model needs a draft model.*set drafter: eagle \\| eagle3 \\| ngram \\| medusa"
    ):
        check_method("typical", {}, has_draft=False)  # before any model is loaded
    assert check_method("bild", {})["rollback"] == 2.0


def test_greedy_children_are_distinct_and_sampled_children_follow_the_draft():
    draft_model = tiny_llama(4, vocab=32, hidden=32, layers=1)
    draft = CachedModel(draft_model)
    tree = sample_token_tree(draft, [1, 2, 3], [4, 3], Warper(0, 10, 0.9), None)
    for kids in tree.children:
        toks = [tree.tokens[c] for c in kids]
        assert len(set(toks)) == len(toks)
    draft.reset()
    tree = sample_token_tree(draft, [1, 2, 3], [40], Warper(1.0, 3, 1.0), make_generator(0), children="distinct")
    assert len(tree) == 3  # without replacement: never more children than the warped support
    assert isinstance(tree, TokenTree)


def test_verification_inputs_do_not_depend_on_what_the_draft_has_fed():
    """``with_root`` reuses the ancestor rows of the fed nodes: the same mask and positions as a tree never fed."""
    shape = [(5, -1), (6, -1), (7, 0), (8, 0), (9, 1), (10, 2), (11, 4)]
    fresh, fed = TokenTree(4), TokenTree(4)
    for tree in (fresh, fed):
        tree.extend([t for t, _ in shape[:2]], [p for _, p in shape[:2]])
    fed.feed()
    for tree in (fresh, fed):
        tree.extend([t for t, _ in shape[2:5]], [p for _, p in shape[2:5]])
    fed.feed()
    for tree in (fresh, fed):
        tree.extend([t for t, _ in shape[5:]], [p for _, p in shape[5:]])
    ids, positions, mask = fed.with_root(3)
    for got, want in zip((ids, positions, mask), fresh.with_root(3)):
        assert torch.equal(got, want)
    assert ids.tolist() == [3, 5, 6, 7, 8, 9, 10, 11]
    assert positions.tolist() == [3, 4, 4, 5, 5, 5, 6, 6]
    assert mask[0].tolist() == [True] + [False] * 7  # the root sees only itself among the tree slots
    assert mask[1 + 6].nonzero().flatten().tolist() == [0, 2, 5, 7]  # node 6: root, node 1, node 4, itself
    with pytest.raises(ValueError, match="parent must be added before it"):
        fresh.add(1, len(fresh))
