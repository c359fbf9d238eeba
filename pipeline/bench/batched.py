"""The bench at batch sizes above 1: ``python -m pipeline.bench batch_sizes=[1,2,4,8,16]``.

For every batch size B and mode (greedy, sample) it decodes the same request set (``batch_requests`` requests:
the bench's prompts cycled, request i with its own generator seeded ``seed + i``) with every batchable method of
``methods`` (the chain and tree loop of ``decoding/batched.py``: B requests together, continuous batching; B = 1 is the
loop ``Decoder.generate`` runs, one request at a time), and with transformers' batched ``generate()`` as the peer of
``ar`` (left-padded batches of B prompts, static batching, the pair's dtype). Per row:

- throughput: output tokens over all requests / the pass's wall time (median over ``repeats`` passes; the runners
  of one batch size are interleaved pass by pass);
- per request: TPOT (time per output token after the first) and latency (time in a slot) percentiles, and
  acceptance (tokens per target step, the mean over requests);
- ``x batch 1``: the row's throughput over the same method's at batch 1; ``speedup vs ar``: over our ``ar`` at
  the same batch size (per pass, median); ``x transformers``: our ``ar`` over transformers' batched generate().

Speeds belong here and in benchmarks/, never in timed tests.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from omegaconf import DictConfig

from pipeline.bench.plan import generate_kwargs
from pipeline.decoding import build_decoder
from pipeline.decoding.batched import BatchedDecoder
from pipeline.decoding.warping import make_generator
from pipeline.device import synchronize
from pipeline.measure.energy import energy_summary


@dataclass
class BatchRow:
    impl: str  # ours | transformers
    method: str
    mode: str
    batch_size: int
    tokens_per_s: float | None = None
    tokens: int = 0
    requests: int = 0
    x_batch1: float | None = None
    speedup_vs_ar: float | None = None
    x_transformers: float | None = None
    tpot_ms_p50: float | None = None
    tpot_ms_p90: float | None = None
    latency_s_p50: float | None = None
    latency_s_p90: float | None = None
    latency_s_p99: float | None = None
    accepted_per_step: float | None = None
    j_per_token: float | None = None  # the bench's energy meter over each pass, median over passes
    dynamic_j_per_token: float | None = None  # the same less idle power x pass time
    reference_j_per_token: float | None = None  # the reference meter's (energy_meter: nvml+zeus), same windows
    note: str | None = None


Pass = tuple[int, float, list[dict[str, float]]]  # tokens, seconds, per-request {tokens, steps, latency, first}


def _pct(values: list[float], q: float) -> float | None:
    values = [v for v in values if math.isfinite(v)]
    return float(np.percentile(values, q)) if values else None


def _median_of(summaries: list[dict[str, Any]], key: str) -> float | None:
    values = [float(s[key]) for s in summaries if s.get(key) is not None]
    return statistics.median(values) if values else None


class BatchBench:
    """The batch-size table of one pair (``runners.Bench`` loads the pair and the prompts)."""

    def __init__(self, bench: Any, cfg: DictConfig) -> None:
        self.bench, self.cfg = bench, cfg
        self.batch_sizes = [int(b) for b in cfg.batch_sizes]
        self.n = int(cfg.get("batch_requests") or 2 * max(self.batch_sizes))
        self.prompts = [bench.prompts[i % len(bench.prompts)] for i in range(self.n)]
        self.skipped: dict[str, str] = dict(bench.batch_skipped)

    def _ours(self, method: str, mode: str, b: int) -> Callable[[int], Pass]:
        bench = self.bench
        params = bench.method_params(method, mode)
        dec = build_decoder(
            method, bench.pair.target, bench.pair.draft if method != "ar" else None, assets=bench.pair.assets, **params
        )
        engine = BatchedDecoder(dec, b)  # the loop at every batch size (batch 1: Decoder.generate's)

        def run(p: int) -> Pass:
            gens = [make_generator(self.cfg.seed + p * self.n + i, bench.device) for i in range(self.n)]
            synchronize(bench.device)
            t0 = time.perf_counter()
            outs = [
                (g, g.admitted_at, g.finished_at, g.first_token_at)
                for g in engine.generate(
                    self.prompts, max_new_tokens=self.cfg.max_new_tokens, eos_token_ids=bench.eos, generators=gens
                )
            ]
            synchronize(bench.device)
            seconds = time.perf_counter() - t0
            per = [
                {"tokens": len(g.tokens), "steps": g.steps, "latency": end - start, "first": first - start}
                for g, start, end, first in outs
            ]
            return sum(len(g.tokens) for g, *_ in outs), seconds, per

        return run

    def _transformers(self, mode: str, b: int) -> Callable[[int], Pass]:
        bench = self.bench
        tok = bench.pair.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        kwargs = generate_kwargs(self.cfg, mode, pad)

        def run(p: int) -> Pass:
            torch.manual_seed(self.cfg.seed + p)
            per, tokens = [], 0
            synchronize(bench.device)
            t0 = time.perf_counter()
            for k in range(0, self.n, b):  # static batches: a batch ends with its longest request
                chunk = self.prompts[k : k + b]
                width = max(len(x) for x in chunk)
                ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                mask = torch.zeros_like(ids)
                for r, x in enumerate(chunk):
                    ids[r, width - len(x) :] = torch.tensor(x)
                    mask[r, width - len(x) :] = 1
                s = time.perf_counter()
                with torch.inference_mode():
                    out = bench.pair.target.generate(
                        ids.to(bench.device), attention_mask=mask.to(bench.device), **kwargs
                    )
                synchronize(bench.device)
                end = time.perf_counter()
                for row in out[:, width:].tolist():
                    n = (
                        len(row)
                        if not bench.eos
                        else next((i + 1 for i, t in enumerate(row) if t in bench.eos), len(row))
                    )
                    tokens += n
                    per.append({"tokens": n, "steps": n, "latency": end - s, "first": math.nan})
            return tokens, time.perf_counter() - t0, per

        return run

    def _metered(self, run: Callable[[int], Pass], p: int, energy: list[dict[str, Any]]) -> Pass:
        """One pass of ``run``; with an energy meter, the pass is one metered window (its summary appended)."""
        meter = self.bench.meter
        if not meter.available:
            return run(p)
        synchronize(self.bench.device)
        meter.start()
        out = run(p)
        synchronize(self.bench.device)
        energy.append(energy_summary(meter.stop(), self.bench.idle, out[0]))
        return out

    def run(self) -> list[BatchRow]:
        rows: list[BatchRow] = []
        bench = self.bench
        if bench.meter.available and bench.idle is None and float(self.cfg.get("idle_seconds", 0)) > 0:
            synchronize(bench.device)
            bench.idle = bench.meter.measure_idle(float(self.cfg.idle_seconds))
        for mode in self.cfg.modes:
            batch1: dict[str, float] = {}
            for b in self.batch_sizes:
                runners: dict[tuple[str, str], Callable[[int], Pass]] = {}
                for method in self.cfg.methods:
                    if method in self.skipped and b > 1:
                        rows.append(BatchRow("ours", method, mode, b, note=self.skipped[method]))
                        continue
                    runners[("ours", method)] = self._ours(method, mode, b)
                if "ar" in self.cfg.methods:
                    runners[("transformers", "ar")] = self._transformers(mode, b)
                for run in runners.values():  # warm-up
                    for _ in range(int(self.cfg.warmup)):
                        run(0)
                passes: dict[tuple[str, str], list[Pass]] = {k: [] for k in runners}
                energy: dict[tuple[str, str], list[dict[str, Any]]] = {k: [] for k in runners}
                for p in range(int(self.cfg.repeats)):
                    for key, run in runners.items():
                        passes[key].append(self._metered(run, p + 1, energy[key]))
                        tokens, seconds, _ = passes[key][-1]
                        print(
                            f"[bench] batch {b} {mode} pass {p + 1} {key}: {tokens / seconds:.2f} tokens/s",
                            file=sys.stderr,
                        )
                rate = {k: [t / s for t, s, _ in v] for k, v in passes.items()}
                for (impl, method), ps in passes.items():
                    per = [r for _, _, reqs in ps for r in reqs]
                    tps = statistics.median(rate[(impl, method)])
                    tpot = [
                        1e3 * (r["latency"] - r["first"]) / (r["tokens"] - 1)
                        for r in per
                        if r["tokens"] > 1 and math.isfinite(r["first"])
                    ]
                    row = BatchRow(
                        impl,
                        method,
                        mode,
                        b,
                        tokens_per_s=tps,
                        tokens=ps[-1][0],
                        requests=self.n,
                        tpot_ms_p50=_pct(tpot, 50),
                        tpot_ms_p90=_pct(tpot, 90),
                        latency_s_p50=_pct([r["latency"] for r in per], 50),
                        latency_s_p90=_pct([r["latency"] for r in per], 90),
                        latency_s_p99=_pct([r["latency"] for r in per], 99),
                        accepted_per_step=statistics.mean(r["tokens"] / r["steps"] for r in per if r["steps"])
                        if impl == "ours"
                        else None,
                        j_per_token=_median_of(energy[(impl, method)], "j_per_token"),
                        dynamic_j_per_token=_median_of(energy[(impl, method)], "dynamic_j_per_token"),
                        reference_j_per_token=_median_of(energy[(impl, method)], "reference_j_per_token"),
                    )
                    if impl == "ours":
                        batch1.setdefault(method, tps if b == 1 else math.nan)
                        row.x_batch1 = tps / batch1[method] if math.isfinite(batch1[method]) else None
                        if ("ours", "ar") in rate:
                            row.speedup_vs_ar = statistics.median(
                                x / y for x, y in zip(rate[(impl, method)], rate[("ours", "ar")])
                            )
                        if method == "ar" and ("transformers", "ar") in rate:
                            row.x_transformers = statistics.median(
                                x / y for x, y in zip(rate[(impl, method)], rate[("transformers", "ar")])
                            )
                    rows.append(row)
        return rows
