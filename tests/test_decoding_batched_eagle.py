"""EAGLE-1/2 and EAGLE-3 drafters at batch > 1 (pipeline/decoding/batched.py: one drafter copy per slot, the
packed target steps' hidden rows): greedy identity with ``ar``, per-request exactness, the same counters as
batch 1, and the hidden rows a packed step returns."""

from __future__ import annotations

import pytest
import torch

from helpers.exact import PROMPT, WARP, chi_square_pvalue, exact_law
from helpers.heads import eagle3_head_folder, eagle_head_folder, with_eagle
from helpers.marks import needs_kernels
from helpers.models import tiny_llama
from pipeline.decoding import build_decoder, cpu_kernels, make_generator, method_class
from pipeline.decoding.base import DRAFTERS
from pipeline.decoding.batched import BatchedDecoder
from pipeline.decoding.eagle import load_eagle
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.packed import PackedCache, PackedRows
from pipeline.decoding.warping import Warper

# more prompts than slots (continuous batching), of different lengths, a one-token prompt among them (no
# feature yet: its first step is the target's own)
PROMPTS = [[0], [5, 2, 6], [1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [7, 7, 7, 7, 7, 7], [3, 1], [4, 4, 6, 1, 4, 4, 6]]


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """``{kind: (target, head)}``: an EAGLE-1/2 head and an EAGLE-3 head, each made by the project's own
    code and loaded from its folder (vocabulary 8: the tiny heads' drafts are accepted often enough to count)."""
    folder = tmp_path_factory.mktemp("heads")
    target1 = tiny_llama(3, layers=2)
    target3 = tiny_llama(0, layers=7)  # EAGLE-3 taps the inputs of layers 2, 3, 4
    return {
        "eagle": (target1, load_eagle(eagle_head_folder(target1, folder / "eagle", seed=1), target1)),
        "eagle3": (target3, load_eagle(eagle3_head_folder(target3, folder / "eagle3", torch.arange(8)), target3)),
    }


def decoder_of(heads, kind, method, **params):
    target, head = heads[kind]
    return build_decoder(method, target, None, assets={"eagle": head}, drafter=kind, **params)


def counters(g):
    return g.tokens, g.steps, g.draft_steps, g.accepted, g.drafted


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("method", ["spd", "block"])
def test_greedy_batched_eagle_equals_greedy_ar_and_batch_one(heads, kind, method):
    """Temperature 0 at B = 2 and 3: every request's tokens are the target's greedy ones, and its acceptance
    (accepted per step, drafts per step, steps, head forwards) is what it gets alone (``Decoder.generate``)."""
    target = heads[kind][0]
    ar = build_decoder("ar", target, temperature=0)
    decoder = decoder_of(heads, kind, method, temperature=0, gamma=3)
    assert decoder.args.drafter["kind"] == kind
    refs = [ar.generate(p, max_new_tokens=20).tokens for p in PROMPTS]
    alone = [decoder.generate(p, max_new_tokens=20) for p in PROMPTS]
    assert [a.tokens for a in alone] == refs
    assert any(n > 1 for a in alone for n in a.accepted)  # drafts are accepted: the counters compare something
    for b in (2, 3):
        got = BatchedDecoder(decoder, b).generate(PROMPTS, max_new_tokens=20)
        for ref, a, g in zip(refs, alone, got):
            assert g.tokens == ref
            assert counters(g) == counters(a)
            assert sum(g.accepted) == 20 and g.steps == len(g.accepted)


@pytest.mark.parametrize("method", ["mtad", "typical"])
def test_other_chain_methods_batch_over_eagle(heads, method):
    target = heads["eagle"][0]
    ar = build_decoder("ar", target, temperature=0)
    decoder = decoder_of(heads, "eagle", method, temperature=0, gamma=3)
    got = BatchedDecoder(decoder, 3).generate(PROMPTS, max_new_tokens=16)
    assert [g.tokens for g in got] == [ar.generate(p, max_new_tokens=16).tokens for p in PROMPTS]


@pytest.fixture(scope="module")
def eagle_pair():
    return with_eagle(tiny_llama(0)), tiny_llama(1)


@pytest.fixture(scope="module")
def law2(eagle_pair):
    return exact_law(eagle_pair[0], PROMPT, 2, Warper(**WARP))


@pytest.mark.parametrize("method", ["spd", "block"])
def test_every_request_samples_the_target_law_over_eagle_at_batch_two(eagle_pair, law2, method):
    """Per-request exactness at B = 2 with an EAGLE head: each request's first two tokens follow the warped
    target's law."""
    decoder = build_decoder(method, *eagle_pair, drafter="eagle", gamma=2, **WARP)
    n = 600
    gens = [make_generator(3000 + i) for i in range(n)]
    out = BatchedDecoder(decoder, 2).generate([PROMPT] * n, max_new_tokens=3, generators=gens)
    assert chi_square_pvalue([tuple(g.tokens[:2]) for g in out], law2) > 1e-3


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_sampled_requests_over_eagle_do_not_depend_on_their_companions(heads, kind):
    """Sampling at B = 3 with per-request generators: every request gets what it gets alone, counters included
    (tiny float32 models: their rows agree here)."""
    decoder = decoder_of(heads, kind, "spd", gamma=3, **WARP)
    gens = lambda: [make_generator(70 + i) for i in range(len(PROMPTS))]  # noqa: E731 - fresh generators per run
    alone = [decoder.generate(p, max_new_tokens=16, generator=g) for p, g in zip(PROMPTS, gens())]
    got = BatchedDecoder(decoder, 3).generate(PROMPTS, max_new_tokens=16, generators=gens())
    assert [counters(g) for g in got] == [counters(a) for a in alone]


@pytest.mark.parametrize("layers", [(), (2, 3, 4)])
def test_a_packed_step_returns_each_sequences_hidden_rows(layers):
    """``PackedCache.step_hidden``: per sequence the hidden rows it gets alone: the LM head's input (the lean
    forward) or, with ``capture_layers`` (EAGLE-3), the inputs of those decoder layers."""
    model = tiny_llama(0, layers=7)
    packed_model, alone = CachedModel(model), CachedModel(model)
    packed_model.capture_layers = alone.capture_layers = layers
    packed = PackedCache(packed_model)
    a, b = [1, 2, 3, 4], [6, 5]
    logits, hidden = packed.step_hidden([PackedRows(0, torch.tensor(a), [3]), PackedRows(1, torch.tensor(b), [])])
    assert [h.shape[0] for h in hidden] == [4, 2] and logits[1].shape[0] == 0
    assert hidden[0].shape[1] == model.config.hidden_size * max(1, len(layers))
    _, hidden2 = packed.step_hidden([PackedRows(1, torch.tensor([7]), [0])])
    assert torch.allclose(hidden[0], alone.prefill_hidden(a), atol=1e-5)
    alone.reset()
    assert torch.allclose(torch.cat([hidden[1], hidden2[0]]), alone.prefill_hidden(b + [7]), atol=1e-5)
    assert not packed_model.capture_hidden  # the flag is the model's own again


def test_only_drafters_that_cannot_batch_are_refused(monkeypatch):
    for method in ("spd", "specinfer", "traversal"):
        for kind in ("eagle", "eagle3", "model"):
            assert method_class(method).capabilities_of({"drafter": {"kind": kind}}).batch_refusal is None
    monkeypatch.setattr(DRAFTERS["eagle"], "batchable", False)
    why = method_class("mcss").capabilities_of({"drafter": {"kind": "eagle"}}).batch_refusal
    assert "drafter eagle drafts one sequence at a time" in why and "'ngram'" in why  # the batchable ones


@needs_kernels
@pytest.mark.parametrize(
    "method,params",
    [
        ("spd", {}),
        ("block", {"draft_stop": "acceptance", "draft_cost": 0.2}),
        ("spd", {"draft_stop": "confidence", "draft_threshold": 0.5}),
        ("mtad", {}),
        ("typical", {}),
    ],
)
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_output_at_batch_b_is_identical_to_batch_one_on_the_bf16_kernels(tmp_path, kind, method, params):
    """A bf16 target on the CPU kernels (batch-invariant rows, bf16-avx512 or bf16-avx2): sampled and greedy,
    each request's tokens and counters at B = 2 and 4 are those it gets alone, bit for bit: the packed steps'
    hidden rows (EAGLE-3: the three layers' inputs, tapped inside the kernels' forward), hence the heads'
    drafts, do not depend on the companions; with every chain method, and with draft_stop (each request its
    own policy)."""
    if kind == "eagle":
        target = tiny_llama(3, layers=2).to(torch.bfloat16)
        head = load_eagle(eagle_head_folder(target, tmp_path / kind, seed=1), target)
    else:
        target = tiny_llama(0, layers=7).to(torch.bfloat16)
        head = load_eagle(eagle3_head_folder(target, tmp_path / kind, torch.arange(8)), target)
    assert CachedModel(target).lean.kernel_path == f"bf16-{cpu_kernels.kernels_isa()}"
    seeds = range(len(PROMPTS))
    for warp in (WARP, {"temperature": 0.0}):
        decoder = build_decoder(method, target, None, assets={"eagle": head}, drafter=kind, gamma=3, **warp, **params)
        alone = [decoder.generate(p, max_new_tokens=16, generator=make_generator(s)) for p, s in zip(PROMPTS, seeds)]
        assert any(n > 1 for a in alone for n in a.accepted)
        for b in (2, 4):
            gens = [make_generator(s) for s in seeds]
            got = BatchedDecoder(decoder, b).generate(PROMPTS, max_new_tokens=16, generators=gens)
            assert [counters(g) for g in got] == [counters(a) for a in alone]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_forward_taps_the_layer_inputs_transformers_hooks_see(dtype):
    """``capture_layers`` on the lean forward (and, in bf16 on a CPU with them, the kernels): the inputs of the
    tapped layers equal what hooks on transformers' layers capture, for a prefill, a causal chain and a masked
    packed step (two sequences in one cache), and the LM head's rows come with them (``final_hidden``)."""
    target = tiny_llama(0, layers=7).to(dtype)
    lean, ref = CachedModel(target), CachedModel(target, lean=False)
    assert lean.lean is not None and ref.lean is None
    tol = {"rtol": 0, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for cm in (lean, ref):
        cm.capture_layers = (2, 3, 5)
    got, want = lean.prefill_hidden([1, 2, 3, 4]), ref.prefill_hidden([1, 2, 3, 4])
    assert got.shape == want.shape == (4, 3 * target.config.hidden_size)
    torch.testing.assert_close(got, want, **tol)
    for cm in (lean, ref):
        cm.capture_hidden = True
    torch.testing.assert_close(lean.forward([5, 6], keep=2), ref.forward([5, 6], keep=2), **tol)
    torch.testing.assert_close(lean.captured(), ref.captured(), **tol)
    assert lean.final_hidden is not None and lean.final_hidden.shape == (2, target.config.hidden_size)
    # a packed step: rows of two sequences, each seeing its own (the first the cache and itself, the second itself)
    tokens, positions = torch.tensor([7, 1, 2]), torch.tensor([6, 0, 1])
    allowed = torch.zeros(3, 9, dtype=torch.bool)
    allowed[0, :7] = True
    allowed[1, 7] = allowed[2, 7:9] = True
    rows = torch.tensor([0, 2])
    got = lean.forward_masked_rows(tokens, positions, allowed, rows)
    want = ref.forward_masked_rows(tokens, positions, allowed, rows)
    torch.testing.assert_close(got.float(), want.float(), **tol)
    torch.testing.assert_close(lean.captured(), ref.captured(), **tol)
