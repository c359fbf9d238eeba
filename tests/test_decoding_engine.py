"""The decoding engine on tiny random models: exactness, greedy identity, limiting cases, KV use."""

from __future__ import annotations

import pytest
import torch

from helpers.exact import PROMPT, WARP, chi_square_pvalue, count_forwards, exact_law, first_tokens
from helpers.models import tiny_llama
from pipeline.decoding import METHODS, build_decoder, check_method, make_generator
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.spd import SpeculativeDecoder
from pipeline.decoding.tree import TokenTree
from pipeline.decoding.verification import block_expected_accepted, block_weights, token_acceptance
from pipeline.decoding.warping import Warper, sample


@pytest.fixture(scope="module")
def law2(tiny_pair):
    return exact_law(tiny_pair[0], PROMPT, 2, Warper(**WARP))


class WrongResidual(SpeculativeDecoder):
    """Negative control: after a rejection, samples from p instead of norm(relu(p - q))."""

    def verify(self, logits, tokens, probs, generator):
        P = self.warper(logits)
        u = torch.rand(tokens.shape[0], generator=generator)
        a = (u * probs[torch.arange(len(tokens)), tokens] <= P[torch.arange(len(tokens)), tokens]).long()
        n = int(a.cumprod(0).sum())
        return n, int(sample(P[n], generator))


@pytest.mark.parametrize(
    "method,params",
    [
        ("ar", {}),
        ("spd", {"gamma": 2}),
        ("block", {"gamma": 2}),
        pytest.param("block", {"gamma": 4}, marks=pytest.mark.slow),
    ],
)
def test_lossless_methods_match_the_target_distribution(tiny_pair, law2, method, params):
    decoder = build_decoder(method, *tiny_pair, **WARP, **params)
    samples = first_tokens(decoder, 2500, 2, max_new=3 if params.get("gamma", 0) < 3 else 5)
    assert chi_square_pvalue(samples, law2) > 1e-3


def test_chi_square_catches_a_wrong_residual(tiny_pair, law2):
    decoder = WrongResidual(*tiny_pair, gamma=2, **WARP)
    samples = first_tokens(decoder, 2500, 2, max_new=3)
    assert chi_square_pvalue(samples, law2) < 1e-3


def test_mtad_tau_one_samples_like_ar(tiny_pair, law2):
    decoder = build_decoder("mtad", *tiny_pair, tau=1.0, gamma=2, num_beams=2, **WARP)
    samples = first_tokens(decoder, 2000, 2, max_new=3)
    assert chi_square_pvalue(samples, law2) > 1e-3
    out = decoder.generate(PROMPT, max_new_tokens=10, generator=make_generator(0))
    assert out.accepted == [1] * 10  # never keeps a draft token


def test_mtad_tau_zero_accepts_every_draft_token(tiny_pair):
    decoder = build_decoder("mtad", *tiny_pair, tau=0.0, gamma=3, **WARP)
    out = decoder.generate(PROMPT, max_new_tokens=17, generator=make_generator(0))
    assert out.accepted == [4, 4, 4, 4, 1]
    assert out.steps == 5 and out.draft_steps == 4 * 3


@pytest.fixture(scope="module")
def greedy_pair():
    return tiny_llama(10, vocab=64, hidden=32, layers=2), tiny_llama(11, vocab=64, hidden=32, layers=1)


@pytest.mark.parametrize("method", ["spd", "block", "mtad"])
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_identity_on_tiny_models(greedy_pair, method, gamma):
    ar = build_decoder("ar", greedy_pair[0], temperature=0)
    other = build_decoder(method, *greedy_pair, temperature=0, gamma=gamma)
    for prompt in ([0], [5, 9, 2], list(range(1, 20))):
        ref = ar.generate(prompt, max_new_tokens=40).tokens
        got = other.generate(prompt, max_new_tokens=40)
        assert got.tokens == ref
        assert sum(got.accepted) == len(got.tokens) == 40


def test_greedy_identity_with_self_draft_accepts_everything(greedy_pair):
    """A draft identical to the target must have every greedy draft token accepted."""
    decoder = build_decoder("spd", greedy_pair[0], greedy_pair[0], temperature=0, gamma=3)
    out = decoder.generate([1, 2, 3], max_new_tokens=16)
    assert out.accepted == [4, 4, 4, 4]


def test_block_accepts_at_least_as_many_tokens_as_token_verification(tiny_pair):
    """Over the drafts met while decoding, block's exact expected acceptance >= token verification's."""
    records = []

    class Recording(SpeculativeDecoder):
        def verify(self, logits, tokens, probs, generator):
            P = self.warper(logits)
            a = token_acceptance(P, probs, tokens)
            records.append(
                (
                    float(sum(torch.prod(a[: j + 1]) for j in range(len(tokens)))),
                    float(block_expected_accepted(block_weights(P, probs, tokens)[0])),
                )
            )
            return super().verify(logits, tokens, probs, generator)

    decoder = Recording(*tiny_pair, gamma=4, **WARP)
    gen = make_generator(7)
    for prompt in ([0], [1, 2], [3, 4, 5], [6, 7]):
        for _ in range(12):
            decoder.generate(prompt, max_new_tokens=20, generator=gen)
    token_mean = sum(r[0] for r in records) / len(records)
    block_mean = sum(r[1] for r in records) / len(records)
    assert len(records) > 150
    assert block_mean >= token_mean


@pytest.mark.parametrize("method", ["spd", "block", "mtad"])
def test_target_forwards_are_steps_plus_prefill_and_never_recompute_the_prefix(tiny_pair, method):
    target, draft = tiny_pair
    calls, handle = count_forwards(target)
    try:
        decoder = build_decoder(method, target, draft, gamma=3, **WARP)
        prompt = list(range(8)) * 4  # 32 tokens
        out = decoder.generate(prompt, max_new_tokens=60, generator=make_generator(3))
    finally:
        handle.remove()
    assert len(calls) == out.steps + 1 == len(out.accepted) + 1
    assert calls[0] == len(prompt) - 1  # prefill
    assert max(calls[1:]) <= 3 + 1  # each step feeds at most gamma + 1 tokens, whatever the length
    assert sum(out.accepted) == len(out.tokens) == 60


def test_same_seed_same_output(tiny_pair, tiny_assets):
    for method in METHODS:
        dec = build_decoder(method, *tiny_pair, tiny_assets, **WARP)
        a = dec.generate(PROMPT, max_new_tokens=12, generator=make_generator(5)).tokens
        b = dec.generate(PROMPT, max_new_tokens=12, generator=make_generator(5)).tokens
        assert a == b, method


def test_eos_cuts_output(tiny_pair, tiny_assets):
    for method in METHODS:
        dec = build_decoder(method, *tiny_pair, tiny_assets, temperature=0)
        ref = build_decoder(method, *tiny_pair, tiny_assets, temperature=0).generate(PROMPT, max_new_tokens=12).tokens
        eos = ref[2]
        out = dec.generate(PROMPT, max_new_tokens=12, eos_token_ids=[eos])
        assert out.tokens[-1] == eos and eos not in out.tokens[:-1], method
        assert len(out.tokens) <= 3


def test_mtjd_and_beam_emit_the_requested_length(tiny_pair):
    out = build_decoder("mtjd", tiny_pair[0], **WARP).generate(PROMPT, max_new_tokens=10, generator=make_generator(0))
    assert len(out.tokens) == 10 and out.accepted == [4, 4, 2] and out.steps == 10
    out = build_decoder("beam", tiny_pair[0], num_beams=3).generate(PROMPT, max_new_tokens=10)
    assert len(out.tokens) == 10


def test_deterministic_beam_search_matches_transformers(greedy_pair):
    model = greedy_pair[0]
    prompt = [5, 9, 2]
    ours = build_decoder("beam", model, num_beams=3, temperature=0).generate(prompt, max_new_tokens=8).tokens
    ref = model.generate(
        torch.tensor([prompt]),
        num_beams=3,
        do_sample=False,
        max_new_tokens=8,
        min_new_tokens=8,
        early_stopping=False,
        length_penalty=1.0,
        pad_token_id=0,
        eos_token_id=None,
    )[0, len(prompt) :].tolist()
    assert ours == ref


def test_tree_attention_matches_plain_forwards():
    model = tiny_llama(3, vocab=32, hidden=32, layers=2)
    context = [1, 7, 3, 9, 4]
    cm = CachedModel(model)
    cm.prefill(context)
    tree = TokenTree(len(context))
    levels = [([2, 5, 2], [-1, -1, -1]), ([8, 1, 6, 3], [0, 0, 1, 2]), ([11, 12], [3, 5])]
    node_logits = []
    for tokens, parents in levels:
        tree.extend(tokens, parents)
        ids, pos, mask = tree.feed()
        node_logits.append(cm.forward_tree(ids, pos, mask, len(context)))
    node_logits = torch.cat(node_logits)
    with torch.no_grad():
        for node in range(len(tree)):
            path = [tree.tokens[i] for i in tree.path(node)]
            ref = model(torch.tensor([context + path])).logits[0, -1]
            assert torch.allclose(node_logits[node], ref, atol=1e-4), node
        # compaction: keep the path to node 7 (tokens 2 -> 3 -> 12) and continue as a chain
        path = tree.path(8)
        cm.compact(len(context), path)
        assert cm.length == len(context) + len(path)
        got = cm.forward([4], keep=1)[-1]
        ref = model(torch.tensor([context + [tree.tokens[i] for i in path] + [4]])).logits[0, -1]
        assert torch.allclose(got, ref, atol=1e-4)


def test_rollback_then_extend_matches_plain_forward():
    model = tiny_llama(4, vocab=32, hidden=32, layers=2)
    cm = CachedModel(model)
    cm.prefill(list(range(300)) and [i % 32 for i in range(300)])  # grows past the initial capacity
    cm.forward([1, 2, 3, 4], keep=4)
    cm.rollback(302)
    got = cm.forward([9], keep=1)[-1]
    with torch.no_grad():
        ref = model(torch.tensor([[i % 32 for i in range(300)] + [1, 2, 9]])).logits[0, -1]
    assert torch.allclose(got, ref, atol=1e-4)


def test_the_preallocated_cache_is_allocated_once_not_per_generation(tiny_pair):
    """A second generation writes into the buffers the first one grew (no reallocation) and decodes the same."""
    target, draft = tiny_pair
    dec = build_decoder("spd", target, draft, gamma=3)
    first = dec.generate(PROMPT, max_new_tokens=12, eos_token_ids=[], generator=make_generator(7))
    layers = dec.target.cache.layers
    buffers = [(layer._k.data_ptr(), layer._v.data_ptr()) for layer in layers]
    again = dec.generate(PROMPT, max_new_tokens=12, eos_token_ids=[], generator=make_generator(7))
    assert dec.target.cache.layers is layers
    assert [(layer._k.data_ptr(), layer._v.data_ptr()) for layer in layers] == buffers
    assert again.tokens == first.tokens and again.steps == first.steps


def test_buffers_made_under_inference_mode_are_made_anew_outside_it(tiny_pair):
    """Generations run under torch.inference_mode; a caller that then prefills outside it (a probe, a drafter's
    own use) meets kept buffers that are inference tensors and cannot be written there, so the cache is made anew
    instead of failing."""
    target, draft = tiny_pair
    dec = build_decoder("spd", target, draft, gamma=3)
    first = dec.generate(PROMPT, max_new_tokens=12, eos_token_ids=[], generator=make_generator(7))
    assert dec.target.cache.layers[0]._k.is_inference()
    with torch.no_grad():
        dec.target.reset()
        dec.target.prefill(PROMPT)
    assert not dec.target.cache.layers[0]._k.is_inference()
    again = dec.generate(PROMPT, max_new_tokens=12, eos_token_ids=[], generator=make_generator(7))
    assert again.tokens == first.tokens


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda t, d: build_decoder("nope", t, d), "valid methods"),
        (lambda t, d: build_decoder("spd", t, d, gamma=0), "gamma=0 must be an integer >= 1"),
        (lambda t, d: build_decoder("mtad", t, d, tau=2), "tau=2 must be a number in [0.0, 1.0]"),
        (lambda t, d: build_decoder("ar", t, d, top_p=0), "top_p=0 must be a number in (0.0, 1.0]"),
        (lambda t, d: build_decoder("ar", t, d, top_p=1.5), "top_p=1.5"),
        (lambda t, d: build_decoder("ar", t, d, temperature=-1), "temperature=-1"),
        (lambda t, d: build_decoder("spd", t, None), "needs a draft model"),
        (lambda t, d: build_decoder("block", t, d, gama=3), "unknown parameter(s) ['gama']"),
        (lambda t, d: build_decoder("mtad", t, d, beam_weights="x"), "must be one of ['paper', 'reference_code']"),
    ],
)
def test_bad_parameters_fail_with_a_clear_message(tiny_pair, call, message):
    with pytest.raises(ValueError) as err:
        call(*tiny_pair)
    assert message in str(err.value)


def test_check_method_needs_no_model():
    assert check_method("mtad", {"tau": 0.3})["num_beams"] == 4
    with pytest.raises(ValueError, match="valid parameters"):
        check_method("ar", {"gamma": 3})


def test_prompt_longer_than_context_is_refused(tiny_pair):
    model = tiny_llama(0, max_positions=16)
    dec = build_decoder("ar", model)
    with pytest.raises(ValueError, match="exceeds the target's context of 16"):
        dec.generate(list(range(8)) + list(range(6)), max_new_tokens=4)
