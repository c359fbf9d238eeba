"""Workloads: how requests reach the engine, as a server sees them (``workload:``, conf/workload/*.yaml).

    spec = Workload.from_config({"kind": "poisson", "rate": 4, "burstiness": 1, "requests": 8, "max_concurrency": 4})
    times = spec.arrival_times(8, seed=0)          # seconds after the window opens, drawn from the cell's seed
    source = spec.arrivals(requests, seed=0)       # replays them on the wall clock: BatchedDecoder.run(arrivals=source)

Kinds:

- ``offline`` (the default): every request is in the queue when the window opens (an offline batch), today's path;
- ``poisson``: open loop at ``rate`` requests/s; the inter-arrival times are gamma-distributed with shape
  ``burstiness`` and mean ``1 / rate`` (``vllm bench serve``'s ``--burstiness``: 1 is a Poisson process, below 1
  burstier, above 1 more regular); ``requests`` of them (null: the slice's; the bench's prompts cycled), at most
  ``max_concurrency`` in flight (null: the engine's slots; the others wait for one to finish);
- ``closed``: ``clients`` clients, each sending its next request when its last one returns (no think time).

Arrivals are drawn from the cell's seed alone (``numpy.random.Generator`` seeded with ``(seed, ARRIVAL_STREAM)``),
so the methods of a cell group see the same arrivals and their latencies pair request by request. Requests are
released in the slice's order.

Per request (``latency_metrics``): ``queue_s`` from its arrival to taking a slot (a wait for ``max_concurrency``
included: the user waits either way), ``ttft_s`` from its arrival to its first token, ``tpot_ms`` per output token
after the first, ``e2e_s`` from its arrival to its last token. Per window (``serving_metrics``): their p50 / p90 /
p99 (``percentiles``), ``throughput_tok_s`` and ``request_throughput_rps`` over the span from the first arrival to
the last token, ``goodput_rps`` (requests meeting every objective of ``slo``: ``tpot_ms``, ``ttft_s``, per
second of that span) and ``mean_batch_occupancy`` (the time-averaged number of requests in a slot).

A bad spec is refused (``ValueError``, one line naming the fix) before any model loads: the bench's
``check_settings`` and the sweep's planner call ``Workload.from_config``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

KINDS = ("offline", "poisson", "closed")
PERCENTILES = (50, 90, 99)
ARRIVAL_STREAM = 0x5E4F  # the arrival process's stream of the cell seed (apart from every sampling generator)
SLO_KEYS = ("tpot_ms", "ttft_s")
KEYS = ("kind", "rate", "burstiness", "requests", "max_concurrency", "clients")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class Workload:
    """A validated workload (``from_config``); ``slo``: the latency objectives of goodput (null: none set)."""

    kind: str = "offline"
    rate: float | None = None  # poisson: offered requests/s
    burstiness: float = 1.0  # poisson: gamma shape of the inter-arrival times (1: Poisson)
    requests: int | None = None  # poisson, closed: how many (null: the slice's, or the bench's prompts)
    max_concurrency: int | None = None  # poisson: requests in flight at most (null: the engine's slots)
    clients: int | None = None  # closed: clients, each with one request in flight
    slo_tpot_ms: float | None = None
    slo_ttft_s: float | None = None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None, slo: Mapping[str, Any] | None = None) -> "Workload":
        """The workload of a ``workload:`` mapping (``None``: offline) and an ``slo:`` mapping; refuses a bad one."""
        cfg = dict(cfg or {})
        unknown = sorted(set(cfg) - set(KEYS))
        if unknown:
            raise ValueError(f"workload: unknown key(s) {unknown}; valid keys: {list(KEYS)} (conf/workload/*.yaml)")
        kind = cfg.get("kind", "offline")
        if kind not in KINDS:
            raise ValueError(f"workload.kind={kind!r}: use one of {list(KINDS)} (workload=poisson, ...)")
        slo = dict(slo or {})
        bad_slo = sorted(set(slo) - set(SLO_KEYS))
        if bad_slo:
            raise ValueError(f"slo: unknown key(s) {bad_slo}; valid keys: {list(SLO_KEYS)}")
        for key in SLO_KEYS:
            v = slo.get(key)
            if v is not None and not (_number(v) and math.isfinite(v) and v > 0):
                raise ValueError(f"slo.{key}={v!r}: a latency objective is a positive number (or null for none)")
        spec = cls(
            kind=str(kind),
            rate=cfg.get("rate"),
            burstiness=cfg.get("burstiness", 1.0) if cfg.get("burstiness") is not None else 1.0,
            requests=cfg.get("requests"),
            max_concurrency=cfg.get("max_concurrency"),
            clients=cfg.get("clients"),
            slo_tpot_ms=slo.get("tpot_ms"),
            slo_ttft_s=slo.get("ttft_s"),
        )
        spec._check()
        return spec

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "Workload":
        """A workload from its ``to_dict`` (a cell's, a window's settings), checked again."""
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"workload: unknown field(s) {unknown}; valid: {sorted(cls.__dataclass_fields__)}")
        slo = {k: values.get(f"slo_{k}") for k in SLO_KEYS}
        return cls.from_config({k: values[k] for k in KEYS if k in values}, slo)

    def _check(self) -> None:
        k = self.kind
        for key in ("requests", "max_concurrency", "clients"):
            v = getattr(self, key)
            if v is not None and not _count(v):
                raise ValueError(f"workload.{key}={v!r}: must be an integer >= 1 (or null)")
        if k == "poisson":
            r = self.rate
            if r is None or not _number(r) or not math.isfinite(r) or r <= 0:
                raise ValueError(
                    f"workload.rate={r!r}: the offered load is a finite number of requests/s > 0 (e.g. "
                    "workload.rate=4; every request at once is workload=offline)"
                )
            b = self.burstiness
            if not _number(b) or not math.isfinite(b) or b <= 0:
                raise ValueError(
                    f"workload.burstiness={b!r}: the gamma shape of the inter-arrival times is a finite number > 0 "
                    "(1: Poisson)"
                )
            if self.clients is not None:
                raise ValueError("workload.clients is read only with workload=closed: leave it null for poisson")
        elif k == "closed":
            if self.clients is None:
                raise ValueError("workload=closed needs workload.clients (an integer >= 1)")
            if self.rate is not None or self.max_concurrency is not None or self.burstiness != 1.0:
                raise ValueError(
                    "workload=closed takes clients and requests only: leave rate, burstiness and max_concurrency at "
                    "null / 1 (the clients are the concurrency)"
                )
        elif any(getattr(self, key) is not None for key in ("rate", "requests", "max_concurrency", "clients")):
            raise ValueError(
                "workload=offline takes no rate, requests, max_concurrency or clients: choose workload=poisson or "
                "workload=closed"
            )

    @property
    def offline(self) -> bool:
        return self.kind == "offline"

    @property
    def concurrency(self) -> int | None:
        """Requests in flight at most (``max_concurrency``, a closed workload's ``clients``), None: the slots."""
        return self.clients if self.kind == "closed" else self.max_concurrency

    def check_slots(self, largest_batch: int, where: str = "the sweep's largest batch size") -> None:
        """Refuse a concurrency the engine cannot hold: above ``largest_batch`` slots, requests could never all
        be in flight."""
        c = self.concurrency
        if c is not None and c > largest_batch:
            key = "clients" if self.kind == "closed" else "max_concurrency"
            raise ValueError(
                f"workload.{key}={c} exceeds {where} ({largest_batch}): lower workload.{key} to at most "
                f"{largest_batch} or raise the batch size"
            )

    def count(self, available: int) -> int:
        """How many requests a window of ``available`` samples decodes (``requests``, refused above the slice)."""
        if self.offline or self.requests is None:
            return available
        if self.requests > available:
            raise ValueError(
                f"workload.requests={self.requests} exceeds the slice's {available} samples: lower "
                "workload.requests or raise dataset.limit"
            )
        return self.requests

    def identity(self) -> dict[str, Any] | None:
        """What a cell's key holds of its workload: None offline (so an offline cell keeps its key)."""
        return None if self.offline else asdict(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # ------------------------------------------------------------------------------------------ arrivals

    def arrival_times(self, n: int, seed: int) -> np.ndarray:
        """The ``n`` arrival times (seconds after the window opens) of a poisson workload: 0 for the first, then
        gamma inter-arrival gaps of shape ``burstiness`` and mean ``1 / rate``, from the cell's ``seed`` alone."""
        if self.kind != "poisson":
            raise ValueError(f"workload {self.kind!r} has no arrival times (poisson only)")
        if n <= 0:
            return np.zeros(0)
        rng = np.random.default_rng([int(seed), ARRIVAL_STREAM])
        gaps = rng.gamma(shape=self.burstiness, scale=1.0 / (self.rate * self.burstiness), size=n - 1)  # type: ignore[operator]
        return np.concatenate([[0.0], np.cumsum(gaps)])

    def arrivals(
        self,
        requests: Sequence[Any],
        seed: int,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> "Arrivals":
        """The source that replays this workload's arrivals of ``requests`` (in order) into an engine's queue."""
        if self.offline:
            raise ValueError("an offline workload has no arrivals: every request is queued when the window opens")
        times = self.arrival_times(len(requests), seed).tolist() if self.kind == "poisson" else None
        return Arrivals(requests, times, self.concurrency, clients=self.clients, clock=clock, sleep=sleep)


class Arrivals:
    """Requests released into an engine's queue when their time has come (``feed``, polled by
    ``BatchedDecoder.run`` before each iteration), at most ``limit`` in flight (``finished`` frees one).

    ``times``: seconds after ``start`` (an open workload); None: a closed one, whose first ``clients`` requests
    arrive at ``start`` and each later one when a request finishes. ``arrived_at[i]``: request i's arrival on
    ``clock`` (its scheduled time, a wait for ``limit`` after it included)."""

    def __init__(
        self,
        requests: Sequence[Any],
        times: Sequence[float] | None,
        limit: int | None,
        *,
        clients: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.requests = list(requests)
        self.times = None if times is None else [float(t) for t in times]
        self.limit = limit
        self.clients = clients
        self.clock, self.sleep = clock, sleep
        self.t0: float | None = None
        self.due: list[float | None] = []
        self.arrived_at: list[float | None] = [None] * len(self.requests)
        self.index = {id(r): i for i, r in enumerate(self.requests)}
        self.next = 0  # the next request to release
        self.open = 0  # released, not finished

    def start(self, t0: float | None = None) -> None:
        """The window opens (``t0``: on ``clock``, default now)."""
        self.t0 = self.clock() if t0 is None else t0
        if self.times is not None:
            self.due = [self.t0 + t for t in self.times]
        else:
            n = min(self.clients or len(self.requests), len(self.requests))
            self.due = [self.t0] * n + [None] * (len(self.requests) - n)

    @property
    def pending(self) -> bool:
        return self.next < len(self.requests)

    def arrival_of(self, request: Any) -> float | None:
        """When ``request`` arrived (None: not one of these requests)."""
        i = self.index.get(id(request))
        return None if i is None else self.arrived_at[i]

    def _release(self, queue: Any, now: float) -> None:
        while self.pending and (self.limit is None or self.open < self.limit):
            due = self.due[self.next]
            if due is None or due > now:
                return
            self.arrived_at[self.next] = due
            queue.append(self.requests[self.next])
            self.next += 1
            self.open += 1

    def feed(self, queue: Any, idle: bool) -> bool:
        """Append the requests whose time has come to ``queue``; ``idle`` (nothing queued or decoding): sleep until
        the next arrival first. Returns whether requests are still to come."""
        if self.t0 is None:
            self.start()
        self._release(queue, self.clock())
        if idle and not queue and self.pending:
            due = self.due[self.next]
            if due is None:  # a closed workload with nothing in flight cannot go on
                raise RuntimeError("a closed workload's next request waits for a finish, but nothing is in flight")
            self.sleep(max(0.0, due - self.clock()))
            self._release(queue, max(self.clock(), due))
        return self.pending

    def finished(self) -> None:
        """A request (or conversation) finished: its slot in ``limit`` frees; a closed client sends its next one."""
        self.open = max(0, self.open - 1)
        if self.times is None and None in self.due:
            self.due[self.due.index(None)] = self.clock()


# ---------------------------------------------------------------------------------------------- metrics


def percentiles(values: Iterable[float | None], qs: Sequence[float] = PERCENTILES, name: str = "") -> dict[str, float]:
    """The ``q``-th percentiles of the finite ``values`` (linear interpolation between order statistics, numpy's
    default and ``vllm bench serve``'s), as ``{name}_p{q}``; NaN where no value is finite."""
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    return {f"{name}_p{q:g}": float(np.percentile(arr, q)) if arr.size else math.nan for q in qs}


def _latencies(requests: Sequence[Any]) -> dict[str, list[float]]:
    """Per request, from its record's timing (``arrival_s``, ``queue_s``, ``ttft_s`` from admission, ``decode_s``,
    ``new_tokens``): the wait, TTFT and e2e from its arrival, TPOT after its first token, and its finish."""
    out: dict[str, list[float]] = {"queue": [], "ttft": [], "tpot": [], "e2e": [], "arrival": [], "finish": []}
    for r in requests:
        wait = float(r.queue_s or 0.0)
        out["queue"].append(wait)
        out["ttft"].append(wait + float(r.ttft_s))
        out["e2e"].append(wait + float(r.decode_s))
        out["tpot"].append(
            1e3 * (float(r.decode_s) - float(r.ttft_s)) / (r.new_tokens - 1) if r.new_tokens > 1 else math.nan
        )
        arrival = float(r.arrival_s or 0.0)
        out["arrival"].append(arrival)
        out["finish"].append(arrival + wait + float(r.decode_s))
    return out


def latency_metrics(requests: Sequence[Any]) -> dict[str, float]:
    """The per-request latency percentiles of a workload's window: ``queue_s``, ``ttft_s``, ``e2e_s`` (from each
    request's arrival, seconds) and ``tpot_ms``, at p50 / p90 / p99."""
    lat = _latencies(requests)
    return {
        **percentiles(lat["ttft"], name="ttft_s"),
        **percentiles(lat["tpot"], name="tpot_ms"),
        **percentiles(lat["e2e"], name="e2e_s"),
        **percentiles(lat["queue"], name="queue_s"),
    }


def serving_metrics(requests: Sequence[Any], workload: Workload) -> dict[str, float]:
    """A workload window's cell metrics (module doc): the latency percentiles, the offered ``rate``, throughput,
    request throughput, goodput under ``workload``'s objectives and the mean batch occupancy."""
    lat = _latencies(requests)
    span = (max(lat["finish"]) - min(lat["arrival"])) if requests else math.nan
    per_s = (lambda x: x / span) if span and span > 0 else (lambda x: math.nan)

    def good(i: int) -> bool:  # a one-token answer has no TPOT: only its TTFT is held to account
        tpot, ttft = lat["tpot"][i], lat["ttft"][i]
        if workload.slo_tpot_ms is not None and math.isfinite(tpot) and tpot > workload.slo_tpot_ms:
            return False
        return workload.slo_ttft_s is None or ttft <= workload.slo_ttft_s

    return {
        **latency_metrics(requests),
        "rate": float(workload.rate) if workload.rate is not None else math.nan,
        "burstiness": float(workload.burstiness) if workload.kind == "poisson" else math.nan,
        "clients": float(workload.clients) if workload.clients is not None else math.nan,
        "requests": float(len(requests)),
        "serving_span_s": span,
        "throughput_tok_s": per_s(float(sum(r.new_tokens for r in requests))),
        "request_throughput_rps": per_s(float(len(requests))),
        "goodput_rps": per_s(float(sum(good(i) for i in range(len(requests))))),
        "mean_batch_occupancy": per_s(float(sum(float(r.decode_s) for r in requests))),
        "slo_tpot_ms": float(workload.slo_tpot_ms) if workload.slo_tpot_ms is not None else math.nan,
        "slo_ttft_s": float(workload.slo_ttft_s) if workload.slo_ttft_s is not None else math.nan,
    }
