"""BiLD at batch > 1 (pipeline/decoding/bild.py): the small model's runs of every request in one packed draft forward
per position (``ModelDrafter.propose_chains`` over ``drafting.draft_chain`` with BiLD's confidence as ``admit`` and
EOS as ``stop``): batch invariance with fallbacks, rollbacks and EOS inside runs, the limiting cases' law at batch 3,
and the capabilities that let a sweep and the bench batch it. MTJD at batch > 1 (pipeline/decoding/mtjd.py: the
target beam-samples every request's tokens in one packed forward per depth): batch invariance, the same capabilities."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from helpers.exact import PROMPT, WARP, chi_square_pvalue, exact_law
from helpers.marks import needs_kernels, require_kernels
from helpers.models import tiny_llama
from helpers.paths import CONF, DATA
from pipeline import sweep
from pipeline.bench import plan as bench_plan
from pipeline.decoding import build_decoder, check_method, cpu_kernels, make_generator, method_class
from pipeline.decoding.batched import BatchedDecoder, check_batch
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.warping import Warper

PROMPTS = [[0], [5, 2, 6], [1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [7, 7, 7, 7, 7, 7], [3, 1]]
MAX_NEW = 24


def counters(g):
    return g.tokens, g.steps, g.draft_steps, g.accepted, g.drafted


def record_runs(decoder):
    """The small-model runs ``decoder`` proposes (its ``propose_chains``, wrapped on the instance)."""
    runs: list[list[int]] = []
    propose = decoder.propose_chains

    def recording(asks):
        out = propose(asks)
        runs.extend(p[0].tolist() for p in out if p is not None)
        return out

    decoder.propose_chains = recording
    return runs


def assert_bild_batch_invariant(decoder, eos):
    """Each request's tokens and counters at batch 1 and 3 equal ``Decoder.generate``'s with the same generator,
    with EOS ``eos``; the settings make the small model fall back, the large one roll back, and runs end at EOS
    (each counted on the requests alone)."""
    seeds = range(len(PROMPTS))
    runs = record_runs(decoder)
    alone = [
        decoder.generate(p, max_new_tokens=MAX_NEW, eos_token_ids=[eos], generator=make_generator(s))
        for p, s in zip(PROMPTS, seeds)
    ]
    del decoder.propose_chains
    # a fallback: a run's draft forward whose row was too unsure to draw from (one forward more than tokens drafted)
    fallbacks = sum(a.draft_steps - sum(a.drafted) for a in alone)
    # a rollback: an iteration that kept fewer small tokens than it put to the large model (a request's last
    # iteration left out: EOS or the limit may cut what it emits)
    rollbacks = sum(n - 1 < g for a in alone for n, g in zip(a.accepted[:-1], a.drafted[:-1]))
    assert fallbacks > 0 and rollbacks > 0, (fallbacks, rollbacks)
    assert any(n > 1 for a in alone for n in a.accepted)  # small tokens are kept too
    assert all(eos not in run[:-1] for run in runs)  # a run ends after its EOS ...
    assert any(run[-1] == eos for run in runs)  # ... which happens here
    assert any(a.tokens and a.tokens[-1] == eos for a in alone)
    for b in (1, 3):
        got = BatchedDecoder(decoder, b).generate(
            PROMPTS, max_new_tokens=MAX_NEW, eos_token_ids=[eos], generators=[make_generator(s) for s in seeds]
        )
        assert [counters(g) for g in got] == [counters(a) for a in alone], b


def near_copy(model, std=0.01):
    """``model`` with every weight nudged by N(0, std) noise: a small model that mostly agrees with the large one, so
    that on these flat random models BiLD keeps small tokens as well as falling back and rolling back."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) * std)
    return out


def large(dtype):
    """A target large enough for the bf16 kernels' vector paths (head size 64), over 32 tokens."""
    return tiny_llama(20, vocab=32, hidden=128, layers=2, heads=2, kv_heads=1).to(dtype)


# (warping, BiLD's parameters, EOS): fallbacks, rollbacks, kept small tokens and runs ending at EOS all occur on
# these pairs (sampled: confidence from the warped row's max; greedy: from the raw softmax's)
SETTINGS = [
    (WARP, {"fallback": 0.25, "rollback": 2.5, "max_small_steps": 4}, 10),
    ({"temperature": 0.0}, {"fallback": 0.1, "rollback": 2.0, "max_small_steps": 4}, 17),
]


@needs_kernels
@pytest.mark.parametrize("warp,params,eos", SETTINGS, ids=["sampled", "greedy"])
def test_bild_at_batch_three_is_identical_to_batch_one_on_the_bf16_kernels(warp, params, eos):
    """Batch-invariant rows on the bf16 kernels: a request's runs (drawn from its packed draft rows), the large
    model's rows over them and so its tokens and counters are those it gets alone, bit for bit."""
    target = large(torch.bfloat16)
    assert CachedModel(target).lean.kernel_path == f"bf16-{cpu_kernels.kernels_isa()}"
    assert_bild_batch_invariant(build_decoder("bild", target, near_copy(target), **warp, **params), eos)


@pytest.mark.parametrize("warp,params,eos", SETTINGS, ids=["sampled", "greedy"])
def test_bild_at_batch_three_is_identical_to_batch_one_in_float32(warp, params, eos):
    """The float32 path (its packed rows agree with the solo ones on these tiny models)."""
    target = large(torch.float32)
    assert_bild_batch_invariant(build_decoder("bild", target, near_copy(target), **warp, **params), eos)


@pytest.mark.parametrize(
    "params",
    [{"rollback": 0.0}, {"fallback": 1.0}],
    ids=["rollback-0", "fallback-1"],
)
def test_bilds_limiting_cases_sample_like_the_target_at_batch_three(tiny_pair, params):
    """``rollback: 0`` (every small token rolled back) and ``fallback: 1`` (the small model never draws) give the
    target's own sampling at batch 3 as at batch 1: each request's first two tokens follow the warped target's law."""
    law = exact_law(tiny_pair[0], PROMPT, 2, Warper(**WARP))
    decoder = build_decoder("bild", *tiny_pair, **WARP, **params)
    n = 600
    out = BatchedDecoder(decoder, 3).generate(
        [PROMPT] * n, max_new_tokens=3, generators=[make_generator(9000 + i) for i in range(n)]
    )
    assert all(g.accepted == [1, 1, 1] for g in out)  # every iteration emits the large model's token alone
    assert chi_square_pvalue([tuple(g.tokens[:2]) for g in out], law) > 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "float32"])
@pytest.mark.parametrize(
    "warp,params",
    [(WARP, {}), ({"temperature": 0.0}, {"num_tokens": 3, "num_beams": 3}), (WARP, {"replacement": True})],
    ids=["sampled", "greedy", "replacement"],
)
def test_mtjd_at_batch_three_is_identical_to_batch_one(dtype, warp, params):
    """Every request's beams on the target's packed sequences (one forward per depth over all requests): its tokens
    and counters (steps: target forwards) at batch 1 and 3 are ``Decoder.generate``'s, EOS cutting some requests."""
    if dtype == torch.bfloat16:
        require_kernels()
    decoder = build_decoder("mtjd", large(dtype), **warp, **params)
    seeds = range(len(PROMPTS))
    free = [decoder.generate(p, max_new_tokens=MAX_NEW, generator=make_generator(s)) for p, s in zip(PROMPTS, seeds)]
    eos = free[2].tokens[5]  # request 2 ends at its sixth token
    alone = [
        decoder.generate(p, max_new_tokens=MAX_NEW, eos_token_ids=[eos], generator=make_generator(s))
        for p, s in zip(PROMPTS, seeds)
    ]
    assert len(alone[2].tokens) <= 6 and alone[2].tokens[-1] == eos
    assert all(a.steps == len(a.tokens) for a in alone if a.tokens[-1] != eos)  # one target forward per token
    for b in (1, 3):
        got = BatchedDecoder(decoder, b).generate(
            PROMPTS, max_new_tokens=MAX_NEW, eos_token_ids=[eos], generators=[make_generator(s) for s in seeds]
        )
        assert [counters(g) for g in got] == [counters(a) for a in alone], b


def test_bild_and_mtjd_batch_in_a_sweep_and_in_the_bench_before_any_model_loads(tmp_path):
    """The configured methods' capabilities say they batch: a sweep entry plans each at batch 2, and the bench's
    batch-size table runs them (no refusal row)."""
    for method in ("bild", "mtjd"):
        values = check_method(method, {})
        cls = method_class(method)
        assert cls.capabilities_of(values).batch_refusal is None
        check_batch(cls, values, 2)
    (tmp_path / "data").symlink_to(DATA, target_is_directory=True)
    plan = sweep.expand(
        sweep.compose(
            ["sweep=batching", "data_root=data", "seeds=[0]", "sweep.batch_sizes=[1,2]", "sweep.methods=[ar,bild,mtjd]"]
        ),
        Path(tmp_path),
    )
    assert {(c.label, c.batch_size) for c in plan.cells} >= {
        ("bild", 1),
        ("bild (batch 2)", 2),
        ("mtjd", 1),
        ("mtjd (batch 2)", 2),
    }
    GlobalHydra.instance().clear()  # pipeline.sweep.compose leaves Hydra initialised
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="bench", overrides=["methods=[ar,bild,mtjd]", "batch_sizes=[1,2]"])
    assert bench_plan.BenchPlan(cfg).batch_skipped == {}
