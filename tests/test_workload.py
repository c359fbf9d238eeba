"""Workloads (pipeline/measure/workload.py): the arrival process, its replay into a queue, the refusals, the
percentiles and the serving metrics. No model and no wall clock: the replay runs on a simulated clock against a toy
engine with known service times."""

from __future__ import annotations

import math
import re
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from helpers.paths import REPO
from pipeline.bench.plan import bench_workload, check_settings
from pipeline.measure.workload import Arrivals, Workload, latency_metrics, percentiles, serving_metrics


class Clock:
    """A simulated clock: ``sleep`` advances it."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.t += seconds


def poisson(**kw) -> Workload:
    return Workload.from_config({"kind": "poisson", **kw})


def serve(source: Arrivals, clock: Clock, service: float, slots: int) -> tuple[list[float], int]:
    """A toy engine with ``slots`` slots whose every request takes ``service`` seconds, admitting from the queue as
    ``BatchedDecoder.run`` does (``feed`` before each event); returns each request's wait and the most in flight."""
    queue: deque = deque()
    live: list[float] = []  # finish times
    waits: list[float] = []
    most = 0
    while source.feed(queue, idle=not queue and not live) or queue or live:
        while queue and len(live) < slots:
            request = queue.popleft()
            waits.append(clock() - source.arrival_of(request))
            live.append(clock() + service)
        most = max(most, len(live) + len(queue))
        if not live:
            continue
        # the next event: the earliest finish, or an arrival before it (the engine polls between iterations)
        end = min(live)
        upcoming = source.due[source.next] if source.pending else None
        admissible = len(live) < slots and (source.limit is None or source.open < source.limit)
        if upcoming is not None and upcoming < end and admissible:
            clock.sleep(upcoming - clock())
            continue
        clock.sleep(end - clock())
        live.remove(end)
        source.finished()
    return waits, most


# ------------------------------------------------------------------------------------------ the arrival process


def test_arrivals_are_seeded_and_the_same_for_every_method():
    w = poisson(rate=4.0, burstiness=1.0)
    a, b = w.arrival_times(50, seed=3), w.arrival_times(50, seed=3)
    assert np.array_equal(a, b) and a[0] == 0.0 and np.all(np.diff(a) > 0)
    assert not np.array_equal(a, w.arrival_times(50, seed=4))
    # the times depend on the seed and the spec, never on the requests (the methods of a cell group share them)
    for_ar = w.arrivals([object() for _ in range(50)], seed=3, clock=Clock(), sleep=lambda s: None)
    for_spd = w.arrivals([f"spd request {i}" for i in range(50)], seed=3, clock=Clock(), sleep=lambda s: None)
    assert for_ar.times == for_spd.times == list(a)
    # the same spec read again draws the same times
    assert np.array_equal(poisson(rate=4.0).arrival_times(50, 3), a)


@pytest.mark.parametrize("rate,burstiness", [(4.0, 1.0), (0.5, 0.25), (10.0, 4.0)])
def test_arrival_rate_and_burstiness_are_what_the_spec_claims(rate, burstiness):
    """Over many draws the gaps have mean 1 / rate and squared coefficient of variation 1 / burstiness (a gamma of
    shape k: CV^2 = 1 / k; 1: exponential gaps, a Poisson process)."""
    n = 200_000
    gaps = np.diff(poisson(rate=rate, burstiness=burstiness).arrival_times(n + 1, seed=11))
    assert gaps.mean() == pytest.approx(1.0 / rate, rel=0.02)
    cv2 = gaps.var() / gaps.mean() ** 2
    assert cv2 == pytest.approx(1.0 / burstiness, rel=0.05)
    if burstiness == 1.0:  # a Poisson process: counts per unit time have variance = mean
        times = np.cumsum(gaps)
        counts = np.bincount(times.astype(int))[:-1]
        assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.05)


def test_replay_releases_requests_at_their_arrival_and_sleeps_only_when_idle():
    clock = Clock()
    src = Arrivals(["a", "b", "c"], [0.0, 0.5, 2.0], None, clock=clock, sleep=clock.sleep)
    queue: deque = deque()
    assert src.feed(queue, idle=True) and list(queue) == ["a"] and clock.t == 100.0
    queue.clear()
    assert src.feed(queue, idle=False) and not queue and clock.t == 100.0  # busy: no sleep, nothing due yet
    clock.sleep(0.7)
    assert src.feed(queue, idle=False) and list(queue) == ["b"]
    queue.clear()
    assert not src.feed(queue, idle=True) and list(queue) == ["c"] and clock.t == pytest.approx(102.0)
    assert src.arrived_at == [100.0, 100.5, 102.0]


def test_max_concurrency_holds_requests_back():
    clock = Clock()
    w = poisson(rate=1000.0, max_concurrency=2)
    src = w.arrivals(list(range(40)), seed=0, clock=clock, sleep=clock.sleep)
    waits, most = serve(src, clock, service=0.1, slots=8)
    assert len(waits) == 40 and most <= 2
    assert max(waits) > 1.0  # 40 requests at ~1000/s through 2 at a time of 0.1 s each queue for up to ~2 s


def test_closed_workload_keeps_its_clients_busy():
    clock = Clock()
    w = Workload.from_config({"kind": "closed", "clients": 3, "requests": 12})
    src = w.arrivals(list(range(12)), seed=0, clock=clock, sleep=clock.sleep)
    waits, most = serve(src, clock, service=0.5, slots=4)
    assert waits == [0.0] * 12 and most == 3
    assert clock.t - 100.0 == pytest.approx(12 / 3 * 0.5)  # throughput: clients / service time


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_mean_wait_matches_pollaczek_khinchine(rho):
    """Poisson arrivals into one slot with a deterministic service time D (M/D/1): the mean wait in the queue is
    lambda D^2 / (2 (1 - rho)) (Pollaczek-Khinchine, the service variance 0)."""
    service, n = 0.01, 60_000
    rate = rho / service
    clock = Clock()
    src = poisson(rate=rate).arrivals(list(range(n)), seed=7, clock=clock, sleep=clock.sleep)
    waits, _ = serve(src, clock, service=service, slots=1)
    expected = rate * service**2 / (2 * (1 - rho))
    assert np.mean(waits[n // 10 :]) == pytest.approx(expected, rel=0.08)


# ------------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    "cfg,slo,fix",
    [
        ({"kind": "poisson", "rate": -1}, None, "workload.rate=-1"),
        ({"kind": "poisson", "rate": float("nan")}, None, "workload.rate=nan"),
        ({"kind": "poisson", "rate": float("inf")}, None, "workload=offline"),
        ({"kind": "poisson", "rate": 0}, None, "> 0"),
        ({"kind": "poisson", "rate": 2, "burstiness": 0}, None, "workload.burstiness=0"),
        ({"kind": "poisson", "rate": 2, "burstiness": -0.5}, None, "workload.burstiness"),
        ({"kind": "poisson", "rate": 2, "requests": 0}, None, "workload.requests=0"),
        ({"kind": "poisson", "rate": 2, "max_concurrency": 0}, None, "workload.max_concurrency=0"),
        ({"kind": "closed"}, None, "workload.clients"),
        ({"kind": "closed", "clients": 2, "rate": 3}, None, "clients and requests only"),
        ({"kind": "offline", "rate": 3}, None, "workload=poisson"),
        ({"kind": "burst"}, None, "workload.kind='burst'"),
        ({"kind": "poisson", "rate": 2, "speed": 1}, None, "unknown key"),
        ({"kind": "poisson", "rate": 2}, {"tpot_ms": 0}, "slo.tpot_ms=0"),
        ({"kind": "poisson", "rate": 2}, {"ttft_s": -1}, "slo.ttft_s=-1"),
        ({"kind": "poisson", "rate": 2}, {"ttft_s": float("nan")}, "slo.ttft_s=nan"),
        ({"kind": "poisson", "rate": 2}, {"ttft_s": "fast"}, "positive number"),
        ({"kind": "poisson", "rate": 2}, {"e2e_s": 1}, "unknown key"),
    ],
)
def test_bad_workloads_are_refused_naming_the_fix(cfg, slo, fix):
    with pytest.raises(ValueError) as err:
        Workload.from_config(cfg, slo)
    assert fix in str(err.value) and "\n" not in str(err.value)


def test_concurrency_above_the_largest_batch_is_refused():
    w = poisson(rate=2, max_concurrency=16)
    w.check_slots(16)
    with pytest.raises(ValueError, match=r"workload.max_concurrency=16 exceeds .* \(8\): lower"):
        w.check_slots(8)
    with pytest.raises(ValueError, match="workload.clients=9"):
        Workload.from_config({"kind": "closed", "clients": 9}).check_slots(8)
    with pytest.raises(ValueError, match="workload.requests=9 exceeds the slice's 4 samples"):
        poisson(rate=2, requests=9).count(4)
    assert poisson(rate=2).count(4) == 4 and poisson(rate=2, requests=3).count(4) == 3


def test_offline_is_the_default_and_has_no_identity():
    w = Workload.from_config(None)
    assert w.offline and w.identity() is None and Workload.from_config({"kind": "offline"}) == w
    assert poisson(rate=2).identity()["rate"] == 2


# ------------------------------------------------------------------------------------------ percentiles, metrics


def test_percentiles_interpolate_between_order_statistics():
    values = list(range(1, 101))
    got = percentiles(values, name="x")
    assert got == {"x_p50": 50.5, "x_p90": pytest.approx(90.1), "x_p99": pytest.approx(99.01)}
    assert percentiles([3.0, None, float("nan"), 1.0], (0, 50, 100), "y") == {"y_p0": 1.0, "y_p50": 2.0, "y_p100": 3.0}
    assert math.isnan(percentiles([], name="z")["z_p50"]) and percentiles([7.0], name="z")["z_p99"] == 7.0
    rng = np.random.default_rng(0)
    for _ in range(20):
        p = percentiles(rng.exponential(size=int(rng.integers(1, 50))), name="t")
        assert p["t_p50"] <= p["t_p90"] <= p["t_p99"]


def request(arrival, queue, ttft, decode, tokens):
    return SimpleNamespace(arrival_s=arrival, queue_s=queue, ttft_s=ttft, decode_s=decode, new_tokens=tokens)


def test_serving_metrics_of_known_requests():
    # two requests: arrive at 0 and 1; wait 0 and 0.5; first token 0.2 after admission; 2 s and 1.2 s in a slot
    reqs = [request(0.0, 0.0, 0.2, 2.0, 11), request(1.0, 0.5, 0.2, 1.2, 5)]
    w = Workload.from_config({"kind": "poisson", "rate": 1.0}, {"tpot_ms": 190.0, "ttft_s": 1.0})
    m = serving_metrics(reqs, w)
    assert m["rate"] == 1.0 and m["requests"] == 2
    assert m["ttft_s_p50"] == pytest.approx((0.2 + 0.7) / 2)  # from arrival: the wait included
    assert m["e2e_s_p99"] == pytest.approx(1.7 + 0.99 * 0.3)  # e2e 2.0 and 0.5 + 1.2
    assert m["tpot_ms_p50"] == pytest.approx((180.0 + 250.0) / 2)  # (2.0 - 0.2) / 10, (1.2 - 0.2) / 4
    assert m["queue_s_p99"] == pytest.approx(0.495)
    assert m["serving_span_s"] == pytest.approx(2.7)  # first arrival 0, last token 1 + 0.5 + 1.2
    assert m["throughput_tok_s"] == pytest.approx(16 / 2.7)
    assert m["request_throughput_rps"] == pytest.approx(2 / 2.7)
    assert m["goodput_rps"] == pytest.approx(1 / 2.7)  # the second misses the TPOT objective (250 > 190 ms)
    assert m["mean_batch_occupancy"] == pytest.approx(3.2 / 2.7)
    assert set(latency_metrics(reqs)) < set(m)
    unbounded = serving_metrics(reqs, Workload.from_config({"kind": "poisson", "rate": 1.0}))
    assert unbounded["goodput_rps"] == unbounded["request_throughput_rps"]


# ------------------------------------------------------------------------------------------ the bench's refusals


def _bench_cfg(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="bench", overrides=list(overrides))


@pytest.mark.parametrize(
    "overrides,fix",
    [
        (["workload=poisson", "workload.rate=-2"], "workload.rate=-2"),
        (["workload=poisson", "workload.rate=nan"], "workload.rate=nan"),
        (["workload=poisson", "workload.burstiness=0"], "workload.burstiness=0"),
        (["workload=poisson", "workload.requests=0"], "workload.requests=0"),
        (["workload=poisson", "workload.max_concurrency=257"], "workload.max_concurrency=257 exceeds"),
        (["workload=poisson", "slo.ttft_s=-1"], "slo.ttft_s=-1"),
        (["workload=closed", "workload.clients=0"], "workload.clients=0"),
        (["workload=poisson", "batch_sizes=[1,2]"], "drop batch_sizes"),
    ],
)
def test_the_bench_refuses_a_bad_workload_before_any_model_loads(overrides, fix):
    with pytest.raises(ValueError, match=re.escape(fix)):
        check_settings(_bench_cfg(*overrides))


def test_the_bench_takes_the_shipped_workloads():
    for name in ("offline", "poisson", "closed"):
        cfg = _bench_cfg(f"workload={name}")
        check_settings(cfg)
        assert bench_workload(cfg).kind == name


def test_more_offered_load_shows_more_queueing():
    """The toy engine (4 slots, 1 s per request) under 0.5 and 4 requests/s: more load, longer waits, and the
    window's percentiles ordered."""
    got = {}
    for rate in (0.5, 4.0):
        clock = Clock()
        src = poisson(rate=rate).arrivals(list(range(400)), seed=1, clock=clock, sleep=clock.sleep)
        waits, _ = serve(src, clock, service=1.0, slots=4)
        got[rate] = percentiles(waits, name="queue_s")
    assert got[4.0]["queue_s_p50"] > got[0.5]["queue_s_p50"] and got[4.0]["queue_s_p99"] > got[0.5]["queue_s_p99"]
    for p in got.values():
        assert p["queue_s_p50"] <= p["queue_s_p90"] <= p["queue_s_p99"]
