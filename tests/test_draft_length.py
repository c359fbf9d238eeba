"""Draft lengths that adapt (``draft_stop``, pipeline/decoding/draft_length.py): lossless rules stay lossless, greedy
stays the target's greedy, the stop shortens chains as it says, its parameters leave existing cell keys alone."""

from __future__ import annotations

import pytest

from helpers.exact import PROMPT, WARP, chi_square_pvalue, exact_law, first_tokens
from pipeline.decoding import build_decoder, check_method, make_generator, method_args, method_class
from pipeline.decoding.draft_length import DraftLength, tokens_per_cost
from pipeline.decoding.warping import Warper
from pipeline.measure.bounds import hindsight_bound, hindsight_gamma, leviathan_bound


@pytest.fixture(scope="module")
def law2(tiny_pair):
    return exact_law(tiny_pair[0], PROMPT, 2, Warper(**WARP))


@pytest.mark.parametrize(
    "method,params",
    [
        ("spd", {"draft_stop": "confidence", "draft_threshold": 0.15}),
        ("block", {"draft_stop": "confidence", "draft_threshold": 0.15}),
        ("hsd", {"draft_stop": "confidence", "draft_threshold": 0.15}),
        ("block", {"draft_stop": "acceptance", "draft_cost": 0.3}),
    ],
)
def test_adaptive_lengths_keep_lossless_rules_exact(tiny_pair, law2, method, params):
    decoder = build_decoder(method, *tiny_pair, **WARP, gamma=3, **params)
    gen = decoder.generate(PROMPT, max_new_tokens=40, generator=make_generator(7))
    assert len(set(gen.drafted[:-2])) > 1, gen.drafted  # the lengths do vary here (the test tests something)
    samples = first_tokens(decoder, 2000, 2, max_new=4)
    assert chi_square_pvalue(samples, law2) > 1e-3


@pytest.mark.parametrize("method", ["spd", "block", "hsd", "typical", "mtad"])
@pytest.mark.parametrize("params", [{"draft_stop": "confidence", "draft_threshold": 1.0}, {"draft_stop": "acceptance"}])
def test_greedy_is_still_the_targets_greedy(tiny_pair, method, params):
    want = build_decoder("ar", tiny_pair[0], temperature=0.0).generate(PROMPT, max_new_tokens=24).tokens
    got = build_decoder(method, *tiny_pair, temperature=0.0, gamma=3, **params).generate(PROMPT, max_new_tokens=24)
    assert got.tokens == want


def _drafted(decoder, seed=3, max_new=30):
    gen = decoder.generate(PROMPT, max_new_tokens=max_new, generator=make_generator(seed))
    return gen, gen.drafted


def test_threshold_one_drafts_one_token_and_zero_drafts_gamma(tiny_pair):
    """Threshold 1: every sampled draft is uncertain, so each chain ends after its first draft; 0: never."""
    gen, one = _drafted(build_decoder("spd", *tiny_pair, **WARP, gamma=4, draft_stop="confidence", draft_threshold=1.0))
    assert set(one[:-1]) == {1} and len(one) == gen.steps  # the recorded per-iteration lengths (the last: room)
    _, full = _drafted(build_decoder("spd", *tiny_pair, **WARP, gamma=4, draft_stop="confidence", draft_threshold=0.0))
    _, fixed = _drafted(build_decoder("spd", *tiny_pair, **WARP, gamma=4))
    assert full == fixed and set(full[:-2]) == {4}  # threshold 0 is fixed gamma, draw for draw


def test_a_drafter_that_ignores_the_stop_is_cut_after_the_fact(tiny_pair):
    """A drafter that draws the whole chain in one call (here the draft model with its ``stop`` hook removed, as the
    fused C++ chain, n-gram lookup and EAGLE do): the decoder keeps the chain up to the stop, the caches follow."""
    decoder = build_decoder("block", *tiny_pair, **WARP, gamma=4, draft_stop="confidence", draft_threshold=1.0)
    decoder.drafter_impl.stop = None
    gen, drafted = _drafted(decoder)
    assert set(drafted[:-1]) == {1} and len(gen.tokens) == 30


def test_confidence_is_a_no_op_for_a_deterministic_draft(tiny_pair):
    """n-gram lookup's rows are one-hot: every draft is certain, so the confidence stop never shortens its chains."""
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    run = lambda **p: build_decoder("spd", *tiny_pair, **WARP, gamma=3, drafter="ngram", **p).generate(  # noqa: E731
        prompt, max_new_tokens=12, generator=make_generator(0)
    )
    assert run(draft_stop="confidence", draft_threshold=1.0).drafted == run().drafted


def test_the_acceptance_policy_follows_the_running_estimate():
    policy = DraftLength("acceptance", cost=0.05)
    assert policy.budget(6) == 3  # the prior alpha 1/2 at c 0.05
    for _ in range(20):
        policy.observe(6, 6)  # every draft accepted
    assert policy.alpha > 0.9 and policy.budget(6) == 6
    policy.start()
    for _ in range(20):
        policy.observe(3, 0)  # the first draft rejected every time
    assert policy.alpha < 0.1 and policy.budget(6) == 1
    assert DraftLength("none").budget(6) == 6 and DraftLength("confidence").budget(6) == 6
    for alpha, g, c in [(0.0, 1, 0.1), (0.6, 3, 0.05), (0.9, 5, 0.3), (1.0, 4, 0.2)]:
        assert tokens_per_cost(alpha, g, c) == pytest.approx(leviathan_bound(alpha, g, c))  # the one arithmetic


def test_a_verification_that_grows_with_its_rows_shortens_the_chain():
    """verify_cost v: each draft adds v target steps to the pass (compute-bound rows), so the best g falls."""
    free, dear = DraftLength("acceptance", cost=0.09), DraftLength("acceptance", cost=0.09, verify=0.35)
    for policy in (free, dear):
        for _ in range(30):
            policy.observe(4, 3)  # alpha about 0.75
    a = dear.alpha
    assert 0.7 < a < 0.8
    assert free.budget(6) == 5 and dear.budget(6) == 2
    # the chosen g maximises (1 - a^(g+1)) / ((1 - a)(g (c + v) + 1)), written out here
    best = max(range(1, 7), key=lambda g: (1 - a ** (g + 1)) / ((1 - a) * (g * (0.09 + 0.35) + 1)))
    assert dear.budget(6) == best
    assert tokens_per_cost(a, 3, 0.09, 0.0) == pytest.approx(tokens_per_cost(a, 3, 0.09))
    assert tokens_per_cost(0.5, 2, 0.1, 0.3) == pytest.approx(1.75 / 1.8)


def test_the_cut_keeps_the_first_uncertain_draft():
    import torch  # noqa: PLC0415

    policy = DraftLength("confidence", threshold=0.5)
    assert policy.cut(torch.tensor([0.9, 0.6, 0.4, 0.9])) == 3
    assert policy.cut(torch.tensor([0.2, 0.9])) == 1 and policy.cut(torch.tensor([0.7, 0.8])) == 2
    assert DraftLength("none").cut(torch.tensor([0.1, 0.1])) == 2


def test_defaults_leave_the_resolved_parameters_and_keys_alone():
    """At their defaults the three parameters are not in check_method's result (a cell's params: its key)."""
    for method in ("spd", "block", "hsd", "hsd_ref", "typical", "mtad"):
        values = check_method(method, {})
        assert not {"draft_stop", "draft_threshold", "draft_cost", "verify_cost"} & set(values), method
        args = method_args(method, values)  # the cell's parameters rebuild the Args, defaults filled
        assert (args.draft_stop, args.draft_threshold, args.draft_cost, args.verify_cost) == ("none", 0.5, 0.05, 0.0)
    values = check_method("spd", {"draft_stop": "confidence", "draft_threshold": 0.4})
    assert values["draft_stop"] == "confidence" and values["draft_threshold"] == 0.4 and "draft_cost" not in values


@pytest.mark.parametrize(
    "params,fix",
    [
        ({"draft_stop": "always"}, "must be one of ['none', 'confidence', 'acceptance']"),
        ({"draft_threshold": 0.3}, "set draft_stop: confidence, or leave draft_threshold at its default"),
        ({"draft_stop": "confidence", "draft_cost": 0.2}, "set draft_stop: acceptance"),
        ({"verify_cost": 0.3}, "set draft_stop: acceptance, or leave verify_cost at its default"),
        ({"draft_stop": "confidence", "draft_threshold": 1.5}, "must be a number in [0.0, 1.0]"),
    ],
)
def test_bad_values_name_the_fix(params, fix):
    with pytest.raises(ValueError, match="draft_|verify_") as err:
        check_method("spd", params)
    assert fix in str(err.value)


def test_the_batched_engine_refuses_an_adaptive_length():
    values = check_method("spd", {"draft_stop": "acceptance"})
    assert "draft_stop: acceptance" in method_class("spd").batch_refusal({**values})
    assert method_class("spd").batch_refusal(check_method("spd", {})) is None


def test_the_hindsight_oracle_reads_the_first_rejections():
    """Recorded at gamma 4: (drafted, accepted) per iteration; a shorter gamma' keeps min(n, gamma') of each."""
    its = [(4, 0), (4, 0), (4, 1), (0, 0)]  # early rejections (the plain step is left out)
    assert hindsight_bound(its, 1, 0.1) == pytest.approx((1 + 1 + 2) / 3 / 1.1)
    assert hindsight_gamma(its, 4, 0.1) == (1, pytest.approx(hindsight_bound(its, 1, 0.1)))
    assert hindsight_gamma([(4, 4)] * 3, 4, 0.1)[0] == 4  # every draft accepted: the longest recorded
    assert hindsight_gamma([(0, 0)], 4, 0.1)[0] == 0  # nothing drafted: no oracle


def test_the_hindsight_oracle_costs_the_rows_it_verifies():
    """v: each verified draft's share of a step; dear rows favour the shorter fixed gamma, v = 0 is Leviathan's."""
    its = [(3, 3), (3, 1), (3, 2), (3, 0)]  # n = 3, 1, 2, 0 of 3
    assert hindsight_bound(its, 2, 0.1, 0.0) == pytest.approx(hindsight_bound(its, 2, 0.1))
    assert hindsight_bound(its, 2, 0.1, 0.3) == pytest.approx((3 + 2 + 3 + 1) / 4 / (2 * 0.4 + 1))
    assert hindsight_gamma(its, 3, 0.05)[0] == 3 and hindsight_gamma(its, 3, 0.05, 0.4)[0] == 1
