"""The bench under a workload: ``python -m pipeline.bench workload=poisson workload.rate=4 ...`` (the serving table).

    python -m pipeline.bench workload=poisson workload.rate=4 workload.requests=8 workload.max_concurrency=4 \\
        'methods=[ar,spd]' 'modes=[sample]' max_new_tokens=32 name=x

The bench's prompts, cycled to ``workload.requests`` (null: one each), arrive as the workload says
(``pipeline.measure.workload``: poisson arrivals drawn from ``seed + pass``, the same for every method of a pass, or
closed-loop clients) and wait for one of the engine's slots (``workload.max_concurrency``, or the clients; null: one
slot per request); every method of ``methods`` decodes them through the batched loop (``decoding/batched.py``,
``BatchedDecoder.run(arrivals=...)``), request i with its own generator. Per mode and method, after ``warmup``
untimed passes, ``repeats`` timed passes interleaved method by method; each row holds the median over passes of each
pass's serving metrics (``serving_metrics``: ``ttft_s_p50/p90/p99``, ``tpot_ms_p50/p90/p99``, ``e2e_s_p50/p90/p99``,
``queue_s_p50/p90/p99`` from each request's arrival, ``throughput_tok_s``, ``request_throughput_rps``,
``goodput_rps`` under ``slo``, ``mean_batch_occupancy``), the offered ``rate`` and ``speedup``: ar's TPOT p50 over
the row's in the same pass (the per-token latency a user sees, at the same offered load), median over passes.
Results go to ``benchmarks/<name>.md|json``. Speeds belong here and in benchmarks/, never in timed tests.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import deque
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any

from omegaconf import DictConfig

from pipeline.decoding import build_decoder, check_method, method_args
from pipeline.decoding.batched import BatchedDecoder, BatchRequest
from pipeline.decoding.warping import make_generator
from pipeline.device import synchronize
from pipeline.measure.workload import Workload, serving_metrics
from pipeline.sweep.checks import MAX_BATCH_SIZE


@dataclass
class ServingRow:
    method: str
    mode: str
    workload: str  # poisson | closed
    rate: float | None = None  # offered requests/s (poisson)
    burstiness: float | None = None
    clients: int | None = None  # closed
    requests: int = 0
    max_concurrency: int = 0  # the engine's slots
    ttft_s_p50: float | None = None
    ttft_s_p90: float | None = None
    ttft_s_p99: float | None = None
    tpot_ms_p50: float | None = None
    tpot_ms_p90: float | None = None
    tpot_ms_p99: float | None = None
    e2e_s_p50: float | None = None
    e2e_s_p90: float | None = None
    e2e_s_p99: float | None = None
    queue_s_p50: float | None = None
    queue_s_p90: float | None = None
    queue_s_p99: float | None = None
    throughput_tok_s: float | None = None
    request_throughput_rps: float | None = None
    goodput_rps: float | None = None
    mean_batch_occupancy: float | None = None
    accepted_per_step: float | None = None  # new tokens / target steps over the requests of the passes
    speedup: float | None = None  # ar's tpot_ms_p50 / this row's, same pass (median over passes)
    tokens_per_s: float | None = None  # = throughput_tok_s (the bench's refusal check reads it)
    note: str | None = None  # why a row was not run


METRICS = [f.name for f in fields(ServingRow) if f.name.split("_p")[0] in ("ttft_s", "tpot_ms", "e2e_s", "queue_s")] + [
    "throughput_tok_s",
    "request_throughput_rps",
    "goodput_rps",
    "mean_batch_occupancy",
]


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(values) if values else None


class ServingBench:
    """The serving table of one pair (``runners.Bench`` loads the pair and the prompts)."""

    def __init__(self, bench: Any, cfg: DictConfig, workload: Workload) -> None:
        self.bench, self.cfg, self.workload = bench, cfg, workload
        self.n = workload.requests or len(bench.prompts)
        self.prompts = [bench.prompts[i % len(bench.prompts)] for i in range(self.n)]
        self.slots = min(workload.concurrency or self.n, MAX_BATCH_SIZE)

    def _engine(self, method: str, mode: str) -> BatchedDecoder | str:
        """The method's engine over ``slots`` slots, or why it cannot run (a method that decodes one at a time)."""
        bench = self.bench
        params = bench.method_params(method, mode)
        if self.slots > 1:
            reason = method_args(method, check_method(method, params, drafters=bench.ctx)).capabilities.batch_refusal
            if reason:
                return f"cannot serve {self.slots} requests together: {reason}; set workload.max_concurrency=1"
        draft = bench.pair.draft if method != "ar" else None
        dec = build_decoder(method, bench.pair.target, draft, assets=bench.pair.assets, **params)
        return BatchedDecoder(dec, self.slots)

    def _pass(self, engine: BatchedDecoder, p: int) -> tuple[dict[str, float], int, int]:
        """One replay of the workload (arrivals of ``seed + p``): its serving metrics, tokens and target steps."""
        bench, cfg = self.bench, self.cfg
        requests = [
            BatchRequest(
                list(prompt), int(cfg.max_new_tokens), make_generator(int(cfg.seed) + p * self.n + i, bench.device), i
            )
            for i, prompt in enumerate(self.prompts)
        ]
        source = self.workload.arrivals(requests, int(cfg.seed) + p)
        done: list[Any] = []

        def finish(request: BatchRequest, gen: Any) -> None:
            arrived, t0 = source.arrival_of(request), source.t0
            if arrived is None or t0 is None:  # every request of the run came from ``source``
                raise RuntimeError(f"request {request.tag} finished without having arrived")
            done.append(
                SimpleNamespace(
                    arrival_s=arrived - t0,
                    queue_s=gen.admitted_at - arrived,
                    ttft_s=gen.first_token_at - gen.admitted_at,
                    decode_s=gen.finished_at - gen.admitted_at,
                    new_tokens=len(gen.tokens),
                    steps=gen.steps,
                )
            )
            source.finished()

        synchronize(bench.device)
        source.start()
        engine.run(deque(), eos_token_ids=bench.eos, on_finish=finish, arrivals=source)
        synchronize(bench.device)
        return serving_metrics(done, self.workload), sum(r.new_tokens for r in done), sum(r.steps for r in done)

    def run(self) -> list[ServingRow]:
        rows: list[ServingRow] = []
        w = self.workload
        for mode in self.cfg.modes:
            engines: dict[str, BatchedDecoder] = {}
            for method in self.cfg.methods:
                got = self._engine(method, mode)
                if isinstance(got, str):
                    rows.append(self._row(method, mode, note=got))
                else:
                    engines[method] = got
            for engine in engines.values():  # untimed: the prompts once through the engine, per warm-up pass
                for _ in range(int(self.cfg.warmup)):
                    engine.generate(self.prompts[: self.slots], max_new_tokens=int(self.cfg.max_new_tokens))
            passes: dict[str, list[tuple[dict[str, float], int, int]]] = {m: [] for m in engines}
            for p in range(int(self.cfg.repeats)):
                for method, engine in engines.items():
                    passes[method].append(self._pass(engine, p + 1))
                    m = passes[method][-1][0]
                    print(
                        f"[bench] {w.kind} rate {m['rate']:g} {mode} pass {p + 1} {method}: TTFT p50 "
                        f"{m['ttft_s_p50']:.3f} s, TPOT p50 {m['tpot_ms_p50']:.1f} ms, {m['throughput_tok_s']:.2f} "
                        "tokens/s",
                        file=sys.stderr,
                    )
            for method, ps in passes.items():
                row = self._row(method, mode)
                for key in METRICS:
                    setattr(row, key, _median([m[key] for m, _, _ in ps]))
                row.tokens_per_s = row.throughput_tok_s
                tokens, steps = sum(t for _, t, _ in ps), sum(s for _, _, s in ps)
                row.accepted_per_step = tokens / steps if steps else None
                if "ar" in passes:
                    row.speedup = _median(
                        [a["tpot_ms_p50"] / m["tpot_ms_p50"] for (m, _, _), (a, _, _) in zip(ps, passes["ar"])]
                    )
                rows.append(row)
        return rows

    def _row(self, method: str, mode: str, note: str | None = None) -> ServingRow:
        w = self.workload
        return ServingRow(
            method,
            mode,
            w.kind,
            rate=w.rate,
            burstiness=w.burstiness if w.kind == "poisson" else None,
            clients=w.clients,
            requests=self.n,
            max_concurrency=self.slots,
            note=note,
        )


def serving_markdown(name: str, rows: list[ServingRow], cfg: DictConfig, command: str, info: dict[str, Any]) -> str:
    """The serving table of ``rows`` with its command, machine and settings."""
    f = lambda v, d=3: "–" if v is None or not math.isfinite(v) else f"{v:.{d}f}"  # noqa: E731
    w = rows[0] if rows else None
    load = (
        f"poisson at {w.rate:g} requests/s (burstiness {w.burstiness:g})"
        if w and w.workload == "poisson"
        else f"closed, {w.clients} clients"
        if w
        else ""
    )
    lines = [
        f"# Serving: {name}",
        "",
        f"`{command}`",
        "",
        f"Machine: {info.get('host_cpu') or info.get('platform', '?')}, {info.get('device', '?')}, commit "
        f"{str(info.get('git_commit', '?'))[:10]}; {load}; "
        f"{w.requests if w else 0} requests, {w.max_concurrency if w else 0} slots, max_new_tokens "
        f"{cfg.max_new_tokens}; median over {cfg.repeats} passes. Latencies from each request's arrival; speedup: "
        "ar's TPOT p50 over the row's at the same offered load.",
        "",
        "| method | mode | TTFT p50 / p99 s | TPOT p50 / p99 ms | e2e p50 / p99 s | queue p50 / p99 s | tokens/s "
        "| requests/s | goodput/s | occupancy | tokens/step | speedup | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.method} | {r.mode} | {f(r.ttft_s_p50)} / {f(r.ttft_s_p99)} | {f(r.tpot_ms_p50, 1)} / "
            f"{f(r.tpot_ms_p99, 1)} | {f(r.e2e_s_p50)} / {f(r.e2e_s_p99)} | {f(r.queue_s_p50)} / {f(r.queue_s_p99)} | "
            f"{f(r.throughput_tok_s, 2)} | {f(r.request_throughput_rps)} | {f(r.goodput_rps)} | "
            f"{f(r.mean_batch_occupancy, 2)} | {f(r.accepted_per_step, 2)} | {f(r.speedup, 2)} | {r.note or ''} |"
        )
    return "\n".join(lines) + "\n"
