"""Batch > 1 (pipeline/decoding/batched.py): per-request exactness, greedy identity, batch invariance, slots, EOS."""

from __future__ import annotations

from collections import deque

import pytest
import torch

from helpers.exact import PROMPT, WARP, chi_square_pvalue, exact_law
from helpers.marks import needs_kernels
from helpers.models import tiny_llama
from pipeline.decoding import build_decoder, check_method, cpu_kernels, make_generator, method_class
from pipeline.decoding.base import DRAFTERS
from pipeline.decoding.batched import (
    BatchedDecoder,
    BatchRequest,
    PackedCache,
    PackedRows,
    check_batch,
)
from pipeline.decoding.divergence import batch_divergence
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.warping import Warper

BATCHABLE = [
    ("ar", {}),
    ("spd", {"gamma": 3}),
    ("block", {"gamma": 3}),
    ("mtad", {"gamma": 2, "num_beams": 3}),
    ("typical", {"gamma": 3}),
    ("spd", {"gamma": 3, "drafter": "ngram"}),
    ("block", {"gamma": 2, "drafter": "ngram"}),
    ("mtad", {"gamma": 3, "drafter": "ngram"}),
    ("hsd", {"gamma": 3}),
    ("hsd_ref", {"gamma": 2, "drafter": "ngram"}),
    # draft_stop at batch > 1: each request's own confidence stop and running acceptance estimate
    ("spd", {"gamma": 4, "draft_stop": "confidence", "draft_threshold": 0.5}),
    ("block", {"gamma": 4, "draft_stop": "acceptance", "draft_cost": 0.3}),
    ("mtad", {"gamma": 3, "num_beams": 2, "draft_stop": "confidence", "draft_threshold": 0.4}),
    ("typical", {"gamma": 3, "drafter": "ngram", "draft_stop": "acceptance"}),
]
PROMPTS = [[0], [5, 9, 2], list(range(1, 20)), [7, 7, 7, 7, 7, 7], [3, 1]]


@pytest.fixture(scope="module")
def law2(tiny_pair):
    return exact_law(tiny_pair[0], PROMPT, 2, Warper(**WARP))


@pytest.fixture(scope="module")
def greedy_pair():
    return tiny_llama(10, vocab=64, hidden=32, layers=2), tiny_llama(11, vocab=64, hidden=32, layers=1)


def batched_first_tokens(decoder, n, length, batch_size, max_new):
    gens = [make_generator(1000 + i) for i in range(n)]
    out = BatchedDecoder(decoder, batch_size).generate([PROMPT] * n, max_new_tokens=max_new, generators=gens)
    return [tuple(g.tokens[:length]) for g in out]


@pytest.mark.parametrize(
    "method,params",
    [
        ("ar", {}),
        ("spd", {"gamma": 2}),
        ("block", {"gamma": 3}),
        ("hsd", {"gamma": 2}),
        ("mtad", {"tau": 1.0, "gamma": 2, "num_beams": 2}),
        ("spd", {"gamma": 3, "draft_stop": "confidence", "draft_threshold": 0.3}),
        ("block", {"gamma": 3, "draft_stop": "acceptance", "draft_cost": 0.2}),
    ],
)
def test_every_request_of_a_batch_samples_the_target_law(tiny_pair, law2, method, params):
    """Per-request exactness at B = 4: each request's first two tokens follow the warped target's law
    (mtad at tau = 1 keeps no draft token: plain sampling; draft_stop keeps the lossless rules lossless)."""
    decoder = build_decoder(method, *tiny_pair, **WARP, **params)
    samples = batched_first_tokens(decoder, 1000, 2, 4, max_new=3)
    assert chi_square_pvalue(samples, law2) > 1e-3


def test_the_per_request_chi_square_catches_shared_randomness(tiny_pair, law2):
    """Negative control: requests that share one generator's draws are not independent samples of the law."""
    decoder = build_decoder("spd", *tiny_pair, **WARP, gamma=2)
    out = BatchedDecoder(decoder, 4).generate(
        [PROMPT] * 400, max_new_tokens=3, generators=[make_generator(7) for _ in range(400)]
    )
    samples = [tuple(g.tokens[:2]) for g in out]
    assert len(set(samples)) == 1  # the same seed for every request: one outcome, whatever its companions
    assert chi_square_pvalue(samples, law2) < 1e-3


@pytest.mark.parametrize("method,params", BATCHABLE)
def test_greedy_batch_of_four_equals_greedy_ar(greedy_pair, method, params):
    ar = build_decoder("ar", greedy_pair[0], temperature=0)
    decoder = build_decoder(method, *greedy_pair, temperature=0, **params)
    got = BatchedDecoder(decoder, 4).generate(PROMPTS, max_new_tokens=24)
    for prompt, gen in zip(PROMPTS, got):
        assert gen.tokens == ar.generate(prompt, max_new_tokens=24).tokens
        assert sum(gen.accepted) == len(gen.tokens) == 24
        assert gen.steps == len(gen.accepted)


@pytest.mark.parametrize("method,params", BATCHABLE)
def test_a_requests_output_does_not_depend_on_its_companions(greedy_pair, method, params):
    """Sampling at B = 4 with per-request generators: every request gets what it gets alone (batch 1) and what
    ``Decoder.generate`` gives it, with the same counters (tiny float32 models: their rows agree here)."""
    decoder = build_decoder(method, *greedy_pair, **WARP, **params)
    gens = lambda: [make_generator(50 + i) for i in range(len(PROMPTS))]  # noqa: E731 - fresh generators per run
    alone = [decoder.generate(p, max_new_tokens=20, generator=g) for p, g in zip(PROMPTS, gens())]
    for b in (1, 4):
        got = BatchedDecoder(decoder, b).generate(PROMPTS, max_new_tokens=20, generators=gens())
        for a, g in zip(alone, got):
            assert (g.tokens, g.steps, g.draft_steps, g.accepted, g.drafted) == (
                a.tokens,
                a.steps,
                a.draft_steps,
                a.accepted,
                a.drafted,
            )


@needs_kernels
@pytest.mark.parametrize("method,params", BATCHABLE)
def test_output_at_batch_b_is_identical_to_batch_one_on_the_bf16_kernels(method, params):
    """The bf16 kernels' rows are batch-invariant, so a request's tokens at B = 1, 3, 8 are the same, bit for bit
    (a model large enough for the kernels' vector paths: head size 64)."""
    target = tiny_llama(20, vocab=256, hidden=128, layers=2, heads=2, kv_heads=1, torch_dtype=torch.bfloat16).to(
        torch.bfloat16
    )
    draft = tiny_llama(21, vocab=256, hidden=128, layers=1, heads=2, kv_heads=1).to(torch.bfloat16)
    decoder = build_decoder(method, target, draft, **WARP, **params)
    assert CachedModel(target).lean.kernel_path == f"bf16-{cpu_kernels.kernels_isa()}"
    prompts = PROMPTS * 2
    for warp in (WARP, {"temperature": 0.0}):
        decoder = build_decoder(method, target, draft, **warp, **params)
        seeds = list(range(len(prompts)))
        for b in (3, 8):
            div = batch_divergence(decoder, prompts, batch_size=b, max_new_tokens=24, seeds=seeds)
            assert div["differing"] == 0, div
        gens = [make_generator(s) for s in seeds]
        got = BatchedDecoder(decoder, 4).generate(prompts, max_new_tokens=24, generators=gens)
        alone = [decoder.generate(p, max_new_tokens=24, generator=make_generator(s)) for p, s in zip(prompts, seeds)]
        assert [g.tokens for g in got] == [a.tokens for a in alone]


def test_batch_divergence_reports_fraction_and_first_difference(greedy_pair):
    decoder = build_decoder("spd", *greedy_pair, **WARP, gamma=2)
    div = batch_divergence(decoder, PROMPTS, batch_size=3, max_new_tokens=8, seeds=range(len(PROMPTS)))
    assert div["requests"] == len(PROMPTS) and 0 <= div["fraction"] <= 1


def test_early_finishing_requests_free_their_slot(greedy_pair):
    """B = 2, one long request and four short ones: the short ones pass through the second slot while the
    long one still decodes; at most two requests are ever in flight."""
    decoder = build_decoder("spd", *greedy_pair, **WARP, gamma=2)
    limits = [40, 2, 3, 2, 4]
    queue = deque(BatchRequest(p, m, make_generator(i), tag=i) for i, (p, m) in enumerate(zip(PROMPTS, limits)))
    done = {}
    BatchedDecoder(decoder, 2).run(queue, on_finish=lambda req, gen: done.__setitem__(req.tag, gen))
    assert sorted(done) == [0, 1, 2, 3, 4]
    long = done[0]
    for i in (1, 2, 3, 4):
        assert len(done[i].tokens) == limits[i]
        assert long.admitted_at <= done[i].admitted_at and done[i].finished_at < long.finished_at
    events = sorted([(g.admitted_at, 1) for g in done.values()] + [(g.finished_at, -1) for g in done.values()])
    inflight = [sum(e for _, e in events[: k + 1]) for k in range(len(events))]
    assert max(inflight) <= 2
    assert len(long.tokens) == 40


def test_a_finished_request_can_queue_the_next_turn(greedy_pair):
    decoder = build_decoder("ar", greedy_pair[0], temperature=0)
    queue = deque([BatchRequest([1, 2], 3, tag=0)])
    seen = []

    def finish(req, gen):
        seen.append(req.tag)
        if req.tag < 2:
            queue.append(BatchRequest(list(req.prompt) + gen.tokens + [4], 3, tag=req.tag + 1))

    assert BatchedDecoder(decoder, 2).run(queue, on_finish=finish) == 3
    assert seen == [0, 1, 2]


@pytest.mark.parametrize("method,params", [("ar", {}), ("spd", {"gamma": 3}), ("mtad", {"gamma": 3})])
def test_eos_and_max_new_tokens_apply_per_request(greedy_pair, method, params):
    ar = build_decoder("ar", greedy_pair[0], temperature=0)
    free = [ar.generate(p, max_new_tokens=30).tokens for p in PROMPTS]
    eos = free[2][5]  # request 2 stops at its sixth token; the others at their first occurrence of it, if any
    decoder = build_decoder(method, *greedy_pair, temperature=0, **params)
    limits = [5, 30, 30, 1, 17]
    queue = deque(BatchRequest(p, m, tag=i) for i, (p, m) in enumerate(zip(PROMPTS, limits)))
    done = {}
    BatchedDecoder(decoder, 3).run(
        queue, eos_token_ids=[eos], on_finish=lambda req, gen: done.__setitem__(req.tag, gen)
    )
    for i, ref in enumerate(free):
        cut = ref[: ref.index(eos) + 1] if eos in ref else ref
        assert done[i].tokens == cut[: limits[i]]
    assert done[2].tokens[-1] == eos and len(done[2].tokens) == 6


def test_packed_cache_rows_see_only_their_own_sequence(greedy_pair):
    """Two sequences packed in one cache: each row's logits are those of its sequence decoded alone."""
    model = CachedModel(greedy_pair[0])
    packed = PackedCache(model)
    a, b = [1, 2, 3, 4], [9, 8]
    rows = packed.step([PackedRows(0, torch.tensor(a), [3]), PackedRows(1, torch.tensor(b), [0, 1])])
    rows2 = packed.step([PackedRows(1, torch.tensor([7]), [0]), PackedRows(0, torch.tensor([5]), [0])])
    alone = CachedModel(greedy_pair[0])
    assert torch.allclose(model.logits(rows[0])[0], alone.forward(a, keep=1)[-1], atol=1e-5)
    assert torch.allclose(model.logits(rows2[1])[0], alone.forward([5], keep=1)[-1], atol=1e-5)
    alone.reset()
    assert torch.allclose(model.logits(rows[1]), alone.forward(b, keep=2), atol=1e-5)
    assert torch.allclose(model.logits(rows2[0])[0], alone.forward([7], keep=1)[-1], atol=1e-5)
    packed.rollback(0, 2)
    assert packed.length(0) == 2 and int((packed.owner == 0).sum()) == 2


@pytest.mark.parametrize(
    "method,params,needle",
    [
        ("beam", {}, "one sequence at a time"),
    ],
)
def test_methods_that_cannot_batch_refuse_before_any_model_loads(method, params, needle):
    values = check_method(method, params)
    with pytest.raises(ValueError, match=f"batch_size 2.*{needle}.*use batch_size: 1"):
        check_batch(method_class(method), values, 2)
    check_batch(method_class(method), values, 1)  # batch 1 is every method's


def refusal(cls, values):
    """Why ``cls`` with these parameters (the others at their defaults) cannot batch: its capabilities."""
    return cls.capabilities_of({**{k: p.default for k, p in cls.all_params().items()}, **values}).batch_refusal


def test_only_drafters_that_draft_one_sequence_at_a_time_refuse_batching(monkeypatch):
    """Chains and trees batch over every registered drafter (tests/test_decoding_batched_tree.py); a drafter that
    declares ``batchable = False`` is refused above batch 1, by the chain and the tree methods alike."""
    typical = method_class("typical")
    assert refusal(typical, {"tree": True, "drafter": {"kind": "eagle"}}) is None
    assert refusal(typical, {"tree": False, "drafter": {"kind": "medusa"}}) is None
    assert refusal(method_class("spd"), {"drafter": {"kind": "eagle"}}) is None  # test_decoding_batched_eagle.py
    assert refusal(method_class("spd"), {"drafter": {"kind": "ngram"}}) is None
    monkeypatch.setattr(DRAFTERS["model"], "batchable", False)
    for method, values in [("spd", {"drafter": {"kind": "model"}}), ("specinfer", {"drafter": {"kind": "model"}})]:
        why = refusal(method_class(method), values)
        assert why is not None and "drafter model drafts one sequence at a time" in why
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        check_batch(method_class("ar"), {}, 0)


def test_a_method_with_a_loop_of_its_own_runs_its_generate_at_batch_one(tiny_pair):
    """Batch 1 of a method with a loop of its own (beam sampling): the engine calls its generate, request by
    request."""
    decoder = build_decoder("beam", tiny_pair[0], **WARP, sample=True, num_beams=2)
    got = BatchedDecoder(decoder, 1).generate(
        [PROMPT, [1, 2]], max_new_tokens=6, generators=[make_generator(2), make_generator(3)]
    )
    alone = decoder.generate([1, 2], max_new_tokens=6, generator=make_generator(3))
    assert (got[1].tokens, got[1].steps, got[1].accepted) == (alone.tokens, alone.steps, alone.accepted)
    assert got[1].admitted_at < got[1].first_token_at < got[1].finished_at
