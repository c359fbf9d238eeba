"""The loop's own clock (pipeline/decoding/phase_clock.py): phases that sum to the wall time, a live cost model that
tracks injected costs and drives the draft length, and the cell's cost model and drift read off its iterations."""

from __future__ import annotations

import math
import time
from collections import deque

import pytest
import torch

from helpers.exact import WARP
from helpers.models import tiny_llama
from pipeline.decoding import build_decoder, make_generator
from pipeline.decoding.batched import BatchedDecoder, BatchRequest
from pipeline.decoding.fast_forward import lean_forward_for
from pipeline.decoding.phase_clock import PHASES, Iteration, LiveCosts, PhaseClock
from pipeline.measure.costs import DISTURBED_DRIFT, cost_model, step_drift


def _prompts(n, length=6):
    return [[1 + (i + j) % 7 for j in range(length)] for i in range(n)]


@pytest.mark.parametrize(
    "method,params,batch",
    [
        ("ar", {}, 1),
        ("spd", {"gamma": 3}, 1),
        ("spd", {"gamma": 3}, 3),
        ("mtad", {"gamma": 3, "num_beams": 2}, 2),
        ("specinfer", {}, 2),
        ("mtjd", {}, 2),
        ("bild", {"fallback": 0.0}, 2),
        ("beam", {}, 1),
    ],
)
def test_phases_sum_to_the_loops_wall_time(tiny_pair, method, params, batch):
    """Every method, chains, beams, trees, its own draw (mtjd), its admit hook (bild) and its own loop (beam): the
    four phases cover the loop's wall time less the caller's callbacks, and each iteration says what it did."""
    target, draft = tiny_pair
    if method == "beam":
        decoder = build_decoder(method, target, num_beams=2)
    else:
        warp = {} if method == "mtjd" else WARP
        decoder = build_decoder(method, target, None if method in ("ar", "mtjd") else draft, **warp, **params)
    engine = BatchedDecoder(decoder, batch)
    paused = []

    def slow_callback(request, gen):  # the caller's time: on no phase
        t0 = time.perf_counter()
        time.sleep(0.01)
        paused.append(time.perf_counter() - t0)

    queue = deque(BatchRequest(p, 12, make_generator(i)) for i, p in enumerate(_prompts(4)))
    t0 = time.perf_counter()
    engine.run(queue, on_finish=slow_callback)
    wall = time.perf_counter() - t0 - sum(paused)
    totals = engine.clock.totals()
    assert set(totals) == set(PHASES)
    assert sum(totals.values()) == pytest.approx(wall, rel=0.03, abs=0.005)  # a preemption between the reads: 5 ms
    records = engine.clock.records()
    assert sum(it.emitted for it in records) == 4 * 12
    if method not in ("ar", "mtjd", "beam"):
        assert totals["draft"] > 0 and any(it.positions > 0 for it in records)
    assert totals["verify"] > 0
    if method == "ar":
        assert totals["draft"] == 0 and all(it.rows == it.requests for it in records if it.prefill_rows == 0)


def test_cpu_fallback_of_the_cuda_clock():
    """Asked for CUDA where there is none, the clock reads ``perf_counter`` (the same records)."""
    clock = PhaseClock("cuda" if not torch.cuda.is_available() else "cpu")
    assert not clock.cuda
    clock.start()
    clock.enter("verify")
    clock.end_iteration(rows=1, requests=1, emitted=1)
    clock.stop()
    (it,) = clock.records()
    assert it.verify_s >= 0 and it.rows == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_events_clock_sums_to_the_wall_time():
    """On CUDA the clock records events (no synchronisation per iteration) and reads them once at the end."""
    model = tiny_llama(0, vocab=64, hidden=64, layers=2).cuda()
    decoder = build_decoder("spd", model, tiny_llama(1, vocab=64, hidden=64).cuda(), **WARP, gamma=3)
    engine = BatchedDecoder(decoder, 2)
    assert engine.clock.cuda
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    engine.generate(_prompts(4), max_new_tokens=16, generators=[make_generator(i, "cuda") for i in range(4)])
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    totals = engine.clock.totals()
    assert sum(totals.values()) == pytest.approx(wall, rel=0.05) and totals["verify"] > 0 and totals["draft"] > 0


class _InjectedTime:
    """A clock advanced only by the costs a test injects: a draft position costs ``draft``, a target pass
    ``step + row * (rows - 1)``; nothing else takes time."""

    def __init__(self, step=1.0, row=0.02, draft=0.01):
        self.t, self.step, self.row, self.draft = 0.0, step, row, draft

    def __call__(self):
        return self.t


def _inject(engine: BatchedDecoder, decoder, fake: _InjectedTime):
    engine.clock.now = fake
    propose, step = decoder.propose_chains, engine.target.step

    def timed_propose(asks):
        out = propose(asks)
        fake.t += fake.draft * max(a.gamma for a in asks)
        return out

    def timed_step(groups):
        rows = sum(int(g.tokens.shape[0]) for g in groups)
        fake.t += fake.step + fake.row * (rows - 1)
        return step(groups)

    decoder.propose_chains, engine.target.step = timed_propose, timed_step


def test_live_costs_track_an_injected_draft_cost_and_the_rule_shortens_drafts_when_it_rises():
    """The draft model is the target (every draft accepted): with cheap drafts the acceptance rule drafts gamma;
    when a draft position costs more than a target step mid-run, the live c follows within 10% and the drafts
    shorten to the minimum."""
    model = tiny_llama(0)
    decoder = build_decoder(
        "spd", model, model, **WARP, gamma=4, draft_stop="acceptance", draft_cost="auto", verify_cost="auto"
    )
    live = decoder.length_policy.live
    engine = BatchedDecoder(decoder, 1)
    fake = _InjectedTime(step=1.0, row=0.02, draft=0.01)
    _inject(engine, decoder, fake)
    gens = engine.generate(_prompts(6), max_new_tokens=40, generators=[make_generator(i) for i in range(6)])
    assert live.ready
    assert live.c() == pytest.approx(0.01, rel=0.10)
    assert live.v() == pytest.approx(0.02, rel=0.10)
    cheap = [g for gen in gens[2:] for g in gen.drafted[:-2]]
    assert cheap and max(cheap) == 4 and sum(cheap) / len(cheap) > 3.5
    fake.draft = 3.0  # a draft position now costs three target steps
    gens = engine.generate(_prompts(8), max_new_tokens=40, generators=[make_generator(i) for i in range(8)])
    assert live.c() == pytest.approx(3.0, rel=0.10)
    late = [g for gen in gens[4:] for g in gen.drafted[:-2]]
    assert late and set(late) == {1}


def test_live_costs_calibrate_before_reading_and_at_the_batchs_occupancy():
    live = LiveCosts()
    assert not live.ready and math.isnan(live.c())
    for rows in (4, 3, 2, 1, 4, 3, 2, 1):  # a pass of 0.5 + 0.1 per row, one request; a draft position 0.05
        live.observe(Iteration(draft_s=0.05 * (rows - 1), verify_s=0.5 + 0.1 * rows, rows=rows, positions=rows - 1))
    assert live.ready
    assert live.slope() == pytest.approx(0.1) and live.t_step(1) == pytest.approx(0.6)
    assert live.c(1) == pytest.approx(0.05 / 0.6) and live.v(1) == pytest.approx(0.1 / 0.6)
    assert live.t_step(3) == pytest.approx(0.8) and live.v(3) == pytest.approx(0.3 / 0.8)  # at batch 3, 3 rows a step


def _window(scale=1.0, slow_after=None, n=64, rows=4, batch=1, jitter=0.0):
    out = []
    for i in range(n):
        k = scale * (2.0 if slow_after is not None and i >= slow_after else 1.0) * (1.0 + jitter * (i % 3))
        out.append(
            Iteration(
                draft_s=k * 0.3,
                verify_s=k * (1.0 + 0.05 * (rows - 1)),
                rule_s=k * 0.01,
                other_s=k * 0.02,
                rows=rows,
                positions=rows - 1,
                drafted=rows - 1,
                emitted=3,
                context=100,
                requests=batch,
            )
        )
    return out


def _calibration(scale=1.0):
    return [Iteration(verify_s=scale * (1.0 + 0.05 * (r - 1)), rows=r, requests=1) for r in (4, 3, 2, 1) * 3]


def test_cost_model_reads_the_step_c_and_v_off_the_iterations():
    m = cost_model(_window(), 1, _calibration())
    assert m["t_target_step_ms"] == pytest.approx(1000.0)
    assert m["cost_ratio_c"] == pytest.approx(0.1) and m["row_cost_v"] == pytest.approx(0.05)
    assert m["t_draft_step_ms"] == pytest.approx(100.0) and m["t_verify_ms"] == pytest.approx(1150.0)
    total = sum(m[f"time_{p}_s"] for p in PHASES)
    assert total == pytest.approx(64 * (0.3 + 1.15 + 0.03))
    assert sum(m[f"phase_share_{p}"] for p in PHASES) == pytest.approx(1.0)
    # 3 tokens per iteration of draft 0.3 + verify 1.15 against one token per step of 1.0
    assert m["speedup_bound"] == pytest.approx(3 / 1.45)


def test_a_slowdown_inside_the_window_is_flagged_and_a_uniformly_slower_machine_is_not():
    steady = cost_model(_window(jitter=0.01), 1, _calibration())
    assert step_drift(_window(jitter=0.01), steady["row_slope_ms"], 1)["disturbed"] == 0.0
    slow = step_drift(_window(slow_after=40, jitter=0.01), steady["row_slope_ms"], 1)
    assert slow["disturbed"] == 1.0 and slow["step_drift"] >= DISTURBED_DRIFT
    moved = step_drift(_window(jitter=0.01), steady["row_slope_ms"], 1, [10.0, 16.0])  # the probes moved
    assert moved["disturbed"] == 1.0
    # the whole machine 1.7x slower (every step scaled): not disturbed, and its speed in own steps unchanged
    slower = cost_model(_window(scale=1.7, jitter=0.01), 1, _calibration(1.7))
    assert step_drift(_window(scale=1.7, jitter=0.01), slower["row_slope_ms"], 1)["disturbed"] == 0.0
    tokens = 64 * 3
    fast_rate = tokens / sum(it.wall_s for it in _window(jitter=0.01))
    slow_rate = tokens / sum(it.wall_s for it in _window(scale=1.7, jitter=0.01))
    assert fast_rate * steady["t_target_step_ms"] == pytest.approx(slow_rate * slower["t_target_step_ms"])
    assert slower["cost_ratio_c"] == pytest.approx(steady["cost_ratio_c"])


class _Spaced:
    """Arrivals ``gap`` seconds apart after the previous one joined (``Arrivals.feed``'s contract): the engine, idle
    between them, sleeps until the next; ``slept`` adds up the idle calls as they lasted (a loaded machine oversleeps
    what was asked)."""

    def __init__(self, requests, gap):
        self.pending, self.gap, self.slept, self.due = deque(requests), gap, 0.0, time.perf_counter()

    def feed(self, queue, idle):
        t0 = time.perf_counter()
        wait = self.due - t0
        if self.pending and idle and wait > 0:
            time.sleep(wait)
        if self.pending and time.perf_counter() >= self.due:
            queue.append(self.pending.popleft())
            self.due = time.perf_counter() + self.gap
        if idle:
            self.slept += time.perf_counter() - t0
        return bool(self.pending)


def test_the_wait_for_the_next_arrival_is_on_no_phase(tiny_pair):
    """Under a workload the engine waits with nothing to decode until the next request arrives: that wait is the
    workload's, not the method's `other` (where it went, a quarter of a token's time at 0.5 requests/s on the CPU in
    the serving sweep of 2026-11-29); the phases cover the loop's wall time less it."""
    engine = BatchedDecoder(build_decoder("spd", *tiny_pair, **WARP, gamma=2), 2)
    arrivals = _Spaced([BatchRequest(p, 4, make_generator(i)) for i, p in enumerate(_prompts(4))], 0.25)
    t0 = time.perf_counter()
    engine.run(deque(), arrivals=arrivals)
    wall = time.perf_counter() - t0
    assert arrivals.slept > 0.1  # the engine was idle between the arrivals (3 gaps of 0.25 s, less their decodes)
    assert sum(engine.clock.totals().values()) == pytest.approx(wall - arrivals.slept, rel=0.05, abs=0.005)
    assert sum(it.emitted for it in engine.clock.records()) == 4 * 4


def test_a_partly_filled_batch_reads_the_same_step_and_is_not_disturbed():
    """Under a workload a batch of 4 slots runs 1 to 4 requests as they arrive and finish: each pass brought to a
    plain step of 4 rows by the slope (not scaled by 4 / rows, which made every one-request pass 4 steps) gives one
    step, and the occupancy's ramp up and down is not a drift (the serving sweep of 2026-11-29 flagged 27 of 60 cells
    of a quiet machine before this)."""
    ramp = [1] * 20 + [2] * 10 + [4] * 20 + [3] * 10 + [1] * 20  # arrivals fill the batch, then it drains
    window = [
        Iteration(verify_s=(1.0 + 0.05 * r) * (1.0 + 0.01 * ((i * 7) % 5 - 2)), rows=r, requests=r)
        for i, r in enumerate(ramp)
    ]
    m = cost_model(window, 4)
    assert m["row_slope_ms"] == pytest.approx(50.0, rel=0.05)
    assert m["t_target_step_ms"] == pytest.approx(1200.0, rel=0.02)  # 1 + 0.05 x 4 at every occupancy
    drift = step_drift(window, m["row_slope_ms"], 4)
    assert drift["disturbed"] == 0.0 and drift["step_drift"] < 1.05


def test_mtads_c_is_its_beams_cost():
    """MTAD drafts ``num_beams`` beams a position: its c (the draft phase per position over a step, read by the loop's
    own clock) counts every beam. Time is injected: each model forward costs its rows (the draft's 0.01 a row, the
    target's 1 + 0.01 a row), so the clock's c is what the loop really ran, counted, not a race on a loaded machine."""
    target, draft = tiny_llama(0), tiny_llama(1)

    def c_of(beams):
        decoder = build_decoder("mtad", target, draft, **WARP, gamma=3, num_beams=beams)
        engine = BatchedDecoder(decoder, 1)
        fake = _InjectedTime()
        engine.clock.now = fake

        def cost(base, per_row):
            def hook(module, args, kwargs, output):
                ids = kwargs.get("input_ids", args[0] if args else None)
                fake.t += base + per_row * int(ids.numel())

            return hook

        handles = [  # the engine runs the models through their lean forwards (hooks on them, as the bench's)
            lean_forward_for(draft).register_forward_hook(cost(0.0, 0.01), with_kwargs=True),
            lean_forward_for(target).register_forward_hook(cost(1.0, 0.01), with_kwargs=True),
        ]
        try:
            engine.calibrate = True  # as a cell's warm-up: every length, so the pass is seen at several row counts
            engine.generate(_prompts(2), max_new_tokens=24, generators=[make_generator(i) for i in range(2)])
            calibration = engine.clock.records()
            engine.calibrate = False
            engine.clock.reset()
            engine.generate(_prompts(3), max_new_tokens=24, generators=[make_generator(i) for i in range(3)])
        finally:
            for h in handles:
                h.remove()
        return cost_model(engine.clock.records(), 1, calibration)["cost_ratio_c"]

    one, four = c_of(1), c_of(4)
    assert 0 < one < four
    # beam sampling runs the root's row, then num_beams rows a position: 1 + 4 + 4 rows for gamma 3, against 3
    assert four > 2.5 * one


def test_a_preempted_iteration_moves_neither_the_slope_nor_a_step_below_zero():
    """Robust against a loaded machine: the slope goes through per-row-count medians (one iteration preempted for 50
    steps' time moves it little) and a plain step is never below its rows' share of its pass (the claims sweep of
    2026-11-28 logged a negative step before this)."""
    calibration = _calibration()
    calibration[0] = Iteration(verify_s=50.0, rows=4, requests=1)  # one preempted pass
    window = _window()
    m = cost_model(window, 1, calibration)
    assert m["row_slope_ms"] == pytest.approx(50.0) and m["t_target_step_ms"] == pytest.approx(1000.0)
    wild = [Iteration(verify_s=1.0, rows=5, requests=1), Iteration(verify_s=1.0, rows=5, requests=1)]
    steep = [Iteration(verify_s=0.1, rows=1, requests=1), Iteration(verify_s=9.0, rows=5, requests=1)] * 2
    assert cost_model(wild, 1, steep)["t_target_step_ms"] == pytest.approx(200.0)  # 1.0 x 1/5, not 1 - 4 x 2.2
