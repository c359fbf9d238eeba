"""Tree methods at batch > 1 (pipeline/decoding/batched.py: the one loop, a request's tree in the packed target
step with its own tree mask; the draft model's trees drawn one packed forward per level, ``draft_trees``; EAGLE /
EAGLE-3 and Medusa heads one copy per slot): batch invariance on the bf16 kernels, the laws at batch 3, greedy
identity, requests finishing and starting, and the capabilities that let a sweep or the bench batch them."""

from __future__ import annotations

from collections import deque

import pytest
import torch

from helpers.exact import PROMPT, WARP, chi_square_pvalue, exact_law
from helpers.heads import eagle3_head_folder, eagle_head_folder, with_eagle
from helpers.marks import needs_kernels
from helpers.models import tiny_llama
from pipeline.decoding import build_decoder, check_method, cpu_kernels, make_generator, method_class
from pipeline.decoding.base import DrafterContext
from pipeline.decoding.batched import BatchedDecoder, BatchRequest, check_batch
from pipeline.decoding.divergence import batch_divergence
from pipeline.decoding.drafting import TreeAsk
from pipeline.decoding.eagle import load_eagle
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.medusa_heads import MedusaHeads, place_medusa_heads
from pipeline.decoding.packed import PackedCache
from pipeline.decoding.tree_verify import draft_trees, sample_token_tree
from pipeline.decoding.warping import Warper

# more prompts than slots, of different lengths, a one-token prompt among them (EAGLE: no feature yet, Medusa: no
# hidden row yet; their first step is the target's own)
PROMPTS = [[0], [5, 2, 6], [1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [7, 7, 7, 7, 7, 7], [3, 1]]  # tokens < 8: every model's

# every tree method over the draft model (typical's tree: the drafter's top-k children)
MODEL_TREES = [
    ("specinfer", {"k_config": [3, 2, 2]}),
    ("mcss", {"k_config": [3, 2]}),
    ("traversal", {"k_config": [2, 2, 2]}),
    ("spectr", {"num_drafts": 3, "gamma": 3}),
    ("typical", {"tree": True, "k_config": [3, 2]}),
]
# the tree methods over an EAGLE / EAGLE-3 head (EAGLE-2 dynamic trees)
HEAD_TREES = [
    ("specinfer", {"k_config": [3, 2, 2]}),
    ("mcss", {"k_config": [3, 2]}),
    ("traversal", {"k_config": [2, 2]}),
    ("typical", {"tree": True, "k_config": [3, 2]}),
]


def counters(g):
    return g.tokens, g.steps, g.draft_steps, g.accepted, g.drafted


def medusa_assets(target, hidden):
    """The assets a pair with Medusa heads passes beside its models: random (untrained) heads, so the trees differ
    from the LM head's top-k."""
    heads = MedusaHeads(hidden, 3)
    torch.manual_seed(5)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return {"medusa": place_medusa_heads(target, heads)}


def assert_batch_invariant(decoder, prompts, max_new, batch_sizes=(3,)):
    """Sampled or greedy (the decoder's warping): each request's tokens and counters at every batch size equal its
    own at batch 1 and ``Decoder.generate``'s with the same generator."""
    seeds = range(len(prompts))
    alone = [decoder.generate(p, max_new_tokens=max_new, generator=make_generator(s)) for p, s in zip(prompts, seeds)]
    assert any(n > 1 for a in alone for n in a.accepted)  # drafts are accepted: the counters compare something
    for b in (1, *batch_sizes):
        got = BatchedDecoder(decoder, b).generate(
            prompts, max_new_tokens=max_new, generators=[make_generator(s) for s in seeds]
        )
        assert [counters(g) for g in got] == [counters(a) for a in alone], b


@pytest.fixture(scope="module")
def bf16_pair():
    """A bf16 target (with Medusa heads) and draft large enough for the kernels' vector paths (head size 64), over
    32 tokens (their drafts are accepted often enough to count)."""
    target = tiny_llama(20, vocab=32, hidden=128, layers=2, heads=2, kv_heads=1).to(torch.bfloat16)
    draft = tiny_llama(21, vocab=32, hidden=128, layers=1, heads=2, kv_heads=1).to(torch.bfloat16)
    assert CachedModel(target).lean.kernel_path == f"bf16-{cpu_kernels.kernels_isa()}"
    return target, draft, medusa_assets(target, 128)


@needs_kernels
@pytest.mark.parametrize(
    "method,params",
    [*MODEL_TREES, ("medusa", {"k_config": [3, 2]}), ("medusa", {"acceptance": "exact", "k_config": [2, 2]})],
)
def test_a_trees_output_at_batch_three_is_identical_to_batch_one_on_the_bf16_kernels(bf16_pair, method, params):
    """The bf16 kernels' rows are batch-invariant, so a request's tree (drawn from its own packed draft rows), the
    target's rows over it (its own tree mask in the packed step) and so its tokens and counters are those it gets
    alone, bit for bit, sampled and greedy."""
    for warp in (WARP, {"temperature": 0.0}):
        decoder = build_decoder(method, *bf16_pair, **warp, **params)
        assert decoder.shape == "tree"
        assert_batch_invariant(decoder, PROMPTS, 20)


@pytest.fixture(scope="module")
def bf16_heads(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bf16heads")
    target1 = tiny_llama(3, layers=2).to(torch.bfloat16)
    target3 = tiny_llama(0, layers=7).to(torch.bfloat16)
    return {
        "eagle": (target1, load_eagle(eagle_head_folder(target1, folder / "eagle", seed=1), target1)),
        "eagle3": (target3, load_eagle(eagle3_head_folder(target3, folder / "eagle3", torch.arange(8)), target3)),
    }


@needs_kernels
@pytest.mark.parametrize("method,params", HEAD_TREES)
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_eagle_trees_at_batch_three_are_identical_to_batch_one_on_the_bf16_kernels(bf16_heads, kind, method, params):
    """EAGLE-2 dynamic trees from one head copy per slot, on the packed target steps' hidden rows (EAGLE-3: the
    three layers' inputs): each request's tokens and counters at batch 3 are those it gets alone."""
    target, head = bf16_heads[kind]
    assert CachedModel(target).lean.kernel_path == f"bf16-{cpu_kernels.kernels_isa()}"
    for warp in (WARP, {"temperature": 0.0}):
        decoder = build_decoder(method, target, None, assets={"eagle": head}, drafter=kind, **warp, **params)
        assert decoder.shape == "tree" and decoder.drafter_impl.kind == kind
        assert_batch_invariant(decoder, PROMPTS, 16)


# ------------------------------------------------------------------------------------------ the laws at batch 3


@pytest.fixture(scope="module")
def law2(tiny_pair):
    return exact_law(tiny_pair[0], PROMPT, 2, Warper(**WARP))


def batched_first_two(decoder, n, batch_size, seed):
    gens = [make_generator(seed + i) for i in range(n)]
    out = BatchedDecoder(decoder, batch_size).generate([PROMPT] * n, max_new_tokens=3, generators=gens)
    return [tuple(g.tokens[:2]) for g in out]


@pytest.mark.parametrize(
    "method,params",
    [
        ("specinfer", {"k_config": [3, 2]}),
        ("mcss", {"k_config": [3, 2]}),
        ("traversal", {"k_config": [2, 2]}),
        ("spectr", {"num_drafts": 2, "gamma": 2}),
        ("medusa", {"acceptance": "exact", "k_config": [2, 2]}),
    ],
)
def test_every_request_of_a_batch_of_trees_samples_the_target_law(tiny_pair, tiny_assets, law2, method, params):
    """The lossless walks at batch 3 as at batch 1: each request's first two tokens (a depth-2 tree in its first
    iteration, drawn with its own generator) follow the warped target's law."""
    decoder = build_decoder(method, *tiny_pair, tiny_assets, **WARP, **params)
    assert chi_square_pvalue(batched_first_two(decoder, 600, 3, 5000), law2) > 1e-3


@pytest.mark.parametrize("method", ["specinfer", "traversal"])
def test_every_request_of_a_batch_of_eagle_trees_samples_the_target_law(method):
    target, draft = with_eagle(tiny_llama(0)), tiny_llama(1)
    law = exact_law(target, PROMPT, 2, Warper(**WARP))
    decoder = build_decoder(method, target, draft, drafter="eagle", k_config=[2, 2], **WARP)
    assert chi_square_pvalue(batched_first_two(decoder, 600, 3, 7000), law) > 1e-3


def test_the_batched_tree_chi_square_catches_shared_randomness(tiny_pair, law2):
    """Negative control: requests that share one seed give one outcome whatever their companions, and fail."""
    decoder = build_decoder("specinfer", *tiny_pair, **WARP, k_config=[3, 2])
    out = BatchedDecoder(decoder, 3).generate(
        [PROMPT] * 300, max_new_tokens=3, generators=[make_generator(7) for _ in range(300)]
    )
    samples = [tuple(g.tokens[:2]) for g in out]
    assert len(set(samples)) == 1
    assert chi_square_pvalue(samples, law2) < 1e-3


# ------------------------------------------------------------------------------------------ the loop's lifecycle


@pytest.fixture(scope="module")
def greedy_pair():
    target = tiny_llama(10, vocab=64, hidden=32, layers=2)
    return target, tiny_llama(11, vocab=64, hidden=32, layers=1), medusa_assets(target, 32)


@pytest.mark.parametrize(
    "method,params",
    [
        *MODEL_TREES,
        ("specinfer", {"k_config": [1]}),
        ("typical", {"drafter": "medusa"}),
        ("medusa", {}),
    ],
)
def test_greedy_trees_at_batch_three_equal_greedy_ar(greedy_pair, method, params):
    ar = build_decoder("ar", greedy_pair[0], temperature=0)
    decoder = build_decoder(method, *greedy_pair, temperature=0, **params)
    got = BatchedDecoder(decoder, 3).generate(PROMPTS, max_new_tokens=24)
    for prompt, gen in zip(PROMPTS, got):
        assert gen.tokens == ar.generate(prompt, max_new_tokens=24).tokens
        assert sum(gen.accepted) == len(gen.tokens) == 24 and gen.steps == len(gen.accepted)
        assert max(gen.drafted) >= 1


def test_tree_requests_finish_at_their_own_limits_and_eos_and_free_their_slots(greedy_pair):
    """B = 2 over five tree requests with their own limits and one EOS: each gets what it gets alone, cut where
    it is cut alone; the short ones pass through a slot while the long one decodes."""
    decoder = build_decoder("specinfer", *greedy_pair, temperature=0, k_config=[2, 2])
    ar = build_decoder("ar", greedy_pair[0], temperature=0)
    free = [ar.generate(p, max_new_tokens=30).tokens for p in PROMPTS]
    eos = free[2][5]
    limits = [30, 2, 30, 1, 5]
    queue = deque(BatchRequest(p, m, tag=i) for i, (p, m) in enumerate(zip(PROMPTS, limits)))
    done = {}
    BatchedDecoder(decoder, 2).run(queue, eos_token_ids=[eos], on_finish=lambda r, g: done.__setitem__(r.tag, g))
    for i, ref in enumerate(free):
        cut = ref[: ref.index(eos) + 1] if eos in ref else ref
        assert done[i].tokens == cut[: limits[i]]
        alone = decoder.generate(PROMPTS[i], max_new_tokens=limits[i], eos_token_ids=[eos])
        assert counters(done[i]) == counters(alone)
    assert done[2].tokens[-1] == eos and len(done[2].tokens) == 6
    events = sorted([(g.admitted_at, 1) for g in done.values()] + [(g.finished_at, -1) for g in done.values()])
    assert max(sum(e for _, e in events[: k + 1]) for k in range(len(events))) <= 2


def test_packed_draft_trees_are_each_requests_tree_alone(tiny_pair):
    """``draft_trees`` over three sequences packed in one draft cache (a second round after a kept path
    included): each request's tree, tokens, parents and draft rows, is the one ``sample_token_tree`` draws alone
    with the same generator, and the packed cache keeps what the model's own cache keeps."""
    draft = tiny_pair[1]
    packed_model = CachedModel(draft)
    packed = PackedCache(packed_model)
    warper = Warper(**WARP)
    contexts = [[1, 2, 3], [4], [5, 6, 7, 0, 1]]
    shapes = [[3, 2], [2, 2, 2], [4]]
    for children in ("iid", "distinct", "top"):
        packed.close()
        asks = [TreeAsk(i, c, s, make_generator(10 + i)) for i, (c, s) in enumerate(zip(contexts, shapes))]
        trees = draft_trees(packed_model, packed, asks, warper, children)
        for i, (c, s) in enumerate(zip(contexts, shapes)):
            alone = CachedModel(draft)
            ref = sample_token_tree(alone, c, s, warper, make_generator(10 + i), children)
            assert (trees[i].tokens, trees[i].parents) == (ref.tokens, ref.parents)
            assert set(trees[i].q_rows) == set(ref.q_rows)
            for k, q in ref.q_rows.items():
                assert torch.allclose(trees[i].q_rows[k], q, atol=1e-5)
            assert packed.length(i) == alone.length == len(c) + ref.fed


def test_tree_methods_accept_batch_size_above_one_before_any_model_loads():
    """The capabilities of a configured tree method say it batches (a sweep entry and the bench read them)."""
    eagle2 = DrafterContext(has_eagle=True, eagle_version=1, has_medusa=True)
    eagle3 = DrafterContext(has_eagle=True, eagle_version=3)
    for method, params, ctx in [
        *[(m, p, None) for m, p in MODEL_TREES],
        ("specinfer", {"drafter": "eagle"}, eagle2),
        ("traversal", {"drafter": "eagle3"}, eagle3),
        ("typical", {"tree": True, "drafter": "eagle"}, eagle2),
        ("typical", {"drafter": "medusa"}, eagle2),
        ("medusa", {}, eagle2),
    ]:
        values = check_method(method, params, drafters=ctx)
        cls = method_class(method)
        assert cls.capabilities_of(values).draft_shape == "tree"
        assert cls.capabilities_of(values).batchable, (method, params)
        check_batch(cls, values, 8)


def test_batch_divergence_of_a_tree_method_on_float32_is_measured(greedy_pair):
    decoder = build_decoder("mcss", *greedy_pair, **WARP, k_config=[2, 2])
    div = batch_divergence(decoder, PROMPTS, batch_size=3, max_new_tokens=8, seeds=range(len(PROMPTS)))
    assert div["requests"] == len(PROMPTS) and 0 <= div["fraction"] <= 1
