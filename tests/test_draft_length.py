"""Draft lengths that adapt (``draft_stop``, pipeline/decoding/draft_length.py): lossless rules stay lossless, greedy
stays the target's greedy, the stop shortens chains as it says, its parameters leave existing cell keys alone."""

from __future__ import annotations

import pytest

from helpers.exact import PROMPT, WARP, chi_square_pvalue, exact_law, first_tokens
from pipeline.decoding import build_decoder, check_method, make_generator, method_args, method_class
from pipeline.decoding.draft_length import PROBE_EVERY, DraftLength, calibration_length, tokens_per_cost
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
        ({"draft_stop": "always"}, "must be one of ['none', 'confidence', 'acceptance', 'load']"),
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


def test_an_adaptive_length_batches():
    """Each request keeps its own draft-length policy in the chain loop, so draft_stop works at every batch size
    (tests/test_decoding_batched.py checks batch invariance and the laws with it)."""
    for stop in ("confidence", "acceptance"):
        assert method_class("spd").capabilities_of(check_method("spd", {"draft_stop": stop})).batch_refusal is None


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


# ----------------------------------------------------------------------- calibrated costs and plain steps (issue 44)


def _settle(policy, proposed, kept, times=30):
    for _ in range(times):
        policy.observe(proposed, kept)
    return policy


def test_the_calibrated_length_is_ar_like_when_rows_are_dear_and_longer_when_cheap():
    """The same acceptance (about 0.4, what the offline pair measures) under two machines' measured costs: rows that
    cost a third of a step each (AVX2) make any draft lose, so the rule takes plain steps (draft_min 0) or one draft
    (draft_min 1); nearly free rows (AVX512-BF16, a GPU) make it draft longer."""
    dear, cheap, floor = (
        DraftLength("acceptance", cost=0.08, verify=0.35, minimum=0),
        DraftLength("acceptance", cost=0.02, verify=0.01, minimum=0),
        DraftLength("acceptance", cost=0.08, verify=0.35, minimum=1),
    )
    for policy in (dear, cheap, floor):
        _settle(policy, 3, 0, times=18)  # mixed verdicts: alpha 13 / 32, about 0.4
        _settle(policy, 3, 3, times=4)
    assert 0.35 < dear.alpha < 0.5
    assert dear.best(4) == 0 and floor.best(4) == 1  # a plain step beats every length here
    assert cheap.best(4) >= 2  # cheap rows: longer drafts
    # the choice is the arithmetic written out: the g (0 a plain step) that maximises tokens per unit cost
    a = dear.alpha
    assert max(tokens_per_cost(a, g, 0.08, 0.35) for g in range(1, 5)) < 1.0 == tokens_per_cost(a, 0, 0.08, 0.35)


def test_plain_steps_probe_now_and_then_and_return_to_drafting():
    policy = DraftLength("acceptance", cost=0.2, verify=0.3, minimum=0)
    _settle(policy, 2, 0, times=10)  # alpha 1/12: drafting loses
    budgets = [policy.budget(3) for _ in range(24)]
    assert budgets.count(1) == 3 and set(budgets) == {0, 1}  # every PROBE_EVERY-th plain decision drafts one
    assert [i for i, b in enumerate(budgets) if b] == [PROBE_EVERY - 1, 2 * PROBE_EVERY - 1, 3 * PROBE_EVERY - 1]
    _settle(policy, 1, 1, times=40)  # the probes keep passing: the estimate rises and drafting pays again
    assert policy.budget(3) >= 1 and policy.plain == 0
    policy.start()
    assert policy.plain == 0 and policy.alpha == 0.5


def test_auto_costs_draft_the_calibration_schedule_until_the_clock_has_measured_them(tiny_pair):
    """``auto`` outside a cell (no warm-up): the request's first iterations draft gamma, gamma - 1, ..., 0 in turn
    (``calibration_length``), so the loop's clock sees the pass at several row counts; then the rule decides."""
    decoder = build_decoder("spd", *tiny_pair, **WARP, gamma=3, draft_stop="acceptance", draft_cost="auto")
    live = decoder.length_policy.live
    assert live is not None and not live.ready
    gen = decoder.generate(PROMPT, max_new_tokens=40, generator=make_generator(0))
    assert gen.drafted[:5] == [calibration_length(k, 3) for k in range(5)] == [3, 2, 1, 0, 3]
    assert live.ready and len(gen.tokens) == 40
    assert decoder.length_policy.costs() is not None  # c from the clock, v the number set (0)
    assert build_decoder("spd", *tiny_pair, **WARP, gamma=3).length_policy.live is None  # nothing auto: no live costs


@pytest.mark.parametrize("method", ["spd", "block", "mtad"])
def test_auto_costs_are_the_loops_clock_and_the_rule_reads_them(tiny_pair, method):
    params = {"draft_stop": "acceptance", "draft_cost": "auto", "verify_cost": "auto", "draft_min": 0}
    values = check_method(method, params)
    assert {k: values[k] for k in params} == params  # set, so keyed
    decoder = build_decoder(method, *tiny_pair, **WARP, gamma=3, **params)
    gen = decoder.generate(PROMPT, max_new_tokens=24, generator=make_generator(1))
    assert len(gen.tokens) == 24 and len(gen.drafted) == gen.steps
    live = decoder.length_policy.live
    c, v = decoder.length_policy.costs()
    assert live.ready and c == pytest.approx(max(live.c(), 1e-9)) and v == max(0.0, live.v()) and c > 0
    # dear rows: the request decodes with plain steps (drafted 0) apart from the probes; cheap rows: it drafts
    decoder.length_policy.cost, decoder.length_policy.verify = 0.5, 0.5  # numbers set by hand win over the clock
    gen = decoder.generate(PROMPT, max_new_tokens=24, generator=make_generator(1))
    assert gen.drafted.count(0) >= len(gen.drafted) - 24 // PROBE_EVERY - 1 and gen.draft_steps < 24
    decoder.length_policy.cost, decoder.length_policy.verify = 0.01, 0.0
    gen = decoder.generate(PROMPT, max_new_tokens=24, generator=make_generator(1))
    assert 0 not in gen.drafted[:-1] and max(gen.drafted) >= 2


def test_draft_min_zero_with_greedy_is_the_targets_greedy(tiny_pair):
    want = build_decoder("ar", tiny_pair[0], temperature=0.0).generate(PROMPT, max_new_tokens=24).tokens
    decoder = build_decoder(
        "spd",
        *tiny_pair,
        temperature=0.0,
        gamma=3,
        draft_stop="acceptance",
        draft_cost=0.2,
        verify_cost=0.2,
        draft_min=0,
    )
    got = decoder.generate(PROMPT, max_new_tokens=24)
    assert got.tokens == want and 0 in got.drafted


@pytest.mark.parametrize("method", ["spd", "block"])
def test_plain_steps_keep_lossless_rules_exact(tiny_pair, law2, method):
    """c + v = 0.4: at the prior (1/2) one draft pays, after a rejection (1/3) it does not, so a request mixes
    drafted iterations and plain target steps; its first two tokens still follow the target's law."""
    decoder = build_decoder(
        method, *tiny_pair, **WARP, gamma=3, draft_stop="acceptance", draft_cost=0.2, verify_cost=0.2, draft_min=0
    )
    gen = decoder.generate(PROMPT, max_new_tokens=40, generator=make_generator(7))
    assert 0 in gen.drafted[:-1] and max(gen.drafted) >= 1, gen.drafted  # both kinds of iteration happen
    samples = first_tokens(decoder, 2000, 2, max_new=4)
    assert chi_square_pvalue(samples, law2) > 1e-3


@pytest.mark.parametrize(
    "params,fix",
    [
        ({"draft_stop": "acceptance", "draft_cost": "measured"}, "or auto (measured live by the loop's clock)"),
        ({"draft_stop": "acceptance", "draft_min": 2}, "must be 0 or 1"),
        ({"draft_min": 0}, "set draft_stop: acceptance, or leave draft_min at its default"),
        ({"draft_stop": "confidence", "verify_cost": "auto"}, "set draft_stop: acceptance"),
    ],
)
def test_bad_calibration_values_name_the_fix(params, fix):
    with pytest.raises(ValueError) as err:
        check_method("spd", params)
    assert fix in str(err.value)
