"""The load-aware draft length (``draft_stop: load``, pipeline/decoding/draft_length.py): the length chosen from the
batch's occupancy and the costs at it, tested with injected numbers, and the loop telling each request's policy how
full the batch is."""

from __future__ import annotations

from collections import deque

import pytest

from helpers.exact import PROMPT, WARP
from pipeline.decoding import build_decoder, check_method, make_generator
from pipeline.decoding.batched import BatchedDecoder, BatchRequest
from pipeline.decoding.draft_length import DraftLength, load_aware_length, tokens_per_cost


def test_the_length_follows_the_costs_at_the_occupancy():
    costs = {0.0: (0.05, 0.0), 0.5: (0.05, 0.3), 1.0: (0.05, 1.0)}  # injected: a row dearer as the batch fills
    lengths = {o: load_aware_length(0.8, 4, o, costs.__getitem__) for o in costs}
    assert lengths[0.0] == 4  # alone on a memory-bound pass: every draft pays
    assert lengths[1.0] == 0  # full and compute-bound: (1 - .8^2) / .2 / 2.05 = 0.88 < 1, a plain step
    assert lengths[0.0] >= lengths[0.5] >= lengths[1.0]
    for occupancy, g in lengths.items():  # the best of the formula at those costs
        c, v = costs[occupancy]
        assert all(tokens_per_cost(0.8, g, c, v) >= tokens_per_cost(0.8, k, c, v) for k in range(5))
    assert load_aware_length(0.8, 4, 1.0, costs.__getitem__, minimum=1) == 1  # draft_min 1: at least one draft


def test_the_policy_reads_occupancy_and_interpolates_its_verify_cost():
    policy = DraftLength("load", cost=0.1, verify=0.2, minimum=0, full=1.0)  # numbers: v interpolated to `full`
    policy.observe_load(1, 4)
    assert policy.occupancy == 0.0 and policy.costs_at(policy.occupancy) == (0.1, 0.2)
    policy.observe_load(4, 4)
    assert policy.occupancy == 1.0 and policy.costs_at(1.0) == (0.1, 1.0)
    assert policy.costs_at(0.5) == pytest.approx((0.1, 0.6))
    policy.observe_load(1, 1)
    assert policy.occupancy == 0.0  # batch 1: alone
    policy.accepted, policy.examined = 40, 48  # a running estimate of ~0.82
    policy.observe_load(1, 8)
    alone = policy.best(4)
    policy.observe_load(8, 8)
    assert alone >= 2 and policy.best(4) == 0
    fresh = policy.fresh()
    assert (fresh.stop, fresh.full, fresh.cost, fresh.verify) == ("load", 1.0, 0.1, 0.2)


@pytest.mark.parametrize(
    "params,fix",
    [
        ({"verify_cost_full": 0.5}, "set draft_stop: load, or leave verify_cost_full at its default"),
        ({"draft_stop": "acceptance", "verify_cost_full": 0.5}, "read only with draft_stop: load"),
        ({"draft_stop": "load", "verify_cost_full": 1.5}, "must be a number in [0.0, 1.0]"),
    ],
)
def test_bad_load_settings_name_the_fix(params, fix):
    with pytest.raises(ValueError) as err:
        check_method("spd", params)
    assert fix in str(err.value)


def test_the_costs_of_acceptance_are_read_by_load_too():
    values = check_method("spd", {"draft_stop": "load", "draft_cost": 0.1, "verify_cost": 0.2, "draft_min": 0})
    assert values["draft_stop"] == "load" and values["draft_cost"] == 0.1


def _drafted(decoder, batch: int) -> list[list[int]]:
    engine = BatchedDecoder(decoder, batch)
    got: list[list[int]] = []
    queue = deque(BatchRequest(PROMPT, 24, make_generator(i, "cpu")) for i in range(batch))
    engine.run(queue, on_finish=lambda r, g: got.append(list(g.drafted)))
    return got


def test_the_loop_tells_each_policy_how_full_the_batch_is(tiny_pair):
    """With a verified row free alone and as dear as a step's own row at a full batch, a request alone drafts and the
    same requests together take plain steps, but for the policy's probes (every 8th)."""
    params = dict(WARP, gamma=3, draft_stop="load", draft_cost=0.05, verify_cost=0.0, verify_cost_full=1.0, draft_min=0)
    alone = _drafted(build_decoder("spd", *tiny_pair, **params), 1)[0]
    together = _drafted(build_decoder("spd", *tiny_pair, **params), 4)
    assert sum(alone) / len(alone) > 1.0
    first = [d[:6] for d in together]  # while all four are live: 0 drafts (probes come later)
    assert all(x == 0 for d in first for x in d), first
