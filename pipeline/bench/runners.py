"""The bench's runs on the loaded pair: every runner timed pass by pass, our rows' step costs and time breakdown read
off the decoding loop's own clock in the same passes (``BatchedDecoder.clock``, ``measure.costs.cost_model``: no
second timing path), the rows with their ratios, bounds and energy, and the machine's roofline."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from pipeline.bench.peers import PEERS, REFERENCE, PeerArgs, no_peer
from pipeline.bench.plan import BenchPlan, Row, generate_kwargs
from pipeline.decoding import build_decoder, make_generator
from pipeline.decoding.batched import BatchedDecoder
from pipeline.decoding.fast_forward import LeanForward, lean_forward_for
from pipeline.decoding.phase_clock import PHASES, Iteration
from pipeline.decoding.timing import median_times
from pipeline.device import synchronize
from pipeline.measure.bounds import alpha_from_accepted, hindsight_bound, hindsight_gamma, leviathan_bound
from pipeline.measure.costs import cost_model
from pipeline.measure.energy import energy_summary, make_energy_meter
from pipeline.measure.meters import IdleReading
from pipeline.models import load_pair
from pipeline.prompts import encode_prompt, eos_ids


class _ForwardClock:
    """Wall time inside the target's and the draft's forward passes (hooks, synchronised)."""

    def __init__(self, models, device):
        self.device = device
        self.inside = 0.0
        self._t0 = 0.0
        self._handles = []
        self._chains = []  # lean forwards whose fused draft chain (a method, not a module call) is timed too
        for model in models:
            self._handles.append(model.register_forward_pre_hook(self._pre))
            self._handles.append(model.register_forward_hook(self._post))
            if isinstance(model, LeanForward):
                setattr(model, "fused_chain", self._timed_chain(model.fused_chain))
                self._chains.append(model)

    def _timed_chain(self, chain):
        def timed(*args, **kwargs):
            self._pre()
            try:
                return chain(*args, **kwargs)
            finally:
                self._post()

        return timed

    def _pre(self, *args):
        synchronize(self.device)
        self._t0 = time.perf_counter()

    def _post(self, *args):
        synchronize(self.device)
        self.inside += time.perf_counter() - self._t0

    def remove(self):
        for h in self._handles:
            h.remove()
        for model in self._chains:
            del model.fused_chain  # the class's method again


@dataclass
class OursRunner:
    """One of our methods as a bench runner: ``runner(i, ids)`` decodes prompt ``i`` at batch 1 through ``engine``
    (the loop whose clock times every iteration) with the seed ``seed + i``; (tokens, its generation)."""

    engine: BatchedDecoder
    seed: int
    max_new_tokens: int
    eos: list[int]
    device: Any

    def __call__(self, i: int, ids: list[int]) -> tuple[list[int], Any]:
        gen = make_generator(self.seed + i, self.device)
        (g,) = self.engine.generate([ids], max_new_tokens=self.max_new_tokens, eos_token_ids=self.eos, generators=[gen])
        return g.tokens, g


class Bench(BenchPlan):
    """The plan's pair loaded, with its prompts, energy meter and runners."""

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)  # every check before any model loads
        spec = self.spec
        self.pair = load_pair(spec)
        self.meter = make_energy_meter(next(self.pair.target.parameters()).device, cfg.get("energy_meter", "none"))
        self.idle: IdleReading | None = (
            None  # the idle power, measured once before the first timed pass when a meter is available
        )
        # runner -> energy_summary of each timed pass (the last _timed call)
        self.energy: dict[Any, list[dict[str, Any]]] = {}
        self.draft_full_vocab = (
            self.pair.draft is not None and getattr(self.pair.draft, "draft_token_map", None) is None
        )
        self.device = next(self.pair.target.parameters()).device
        self.prompts = [encode_prompt(self.pair.tokenizer, p, spec.chat) for p in cfg.prompts]
        self.eos = [] if cfg.ignore_eos else eos_ids(self.pair.tokenizer, self.pair.target)

    def transformers_peers(self) -> dict[str, str | None]:
        """Drafter -> None when transformers' assisted generation runs with it (a peer is registered for its kind,
        ``peers.PEERS``), else why not."""
        out: dict[str, str | None] = {}
        for d in self.drafters:
            if d not in PEERS:
                out[d] = no_peer(d)
            elif PEERS[d].full_vocab_draft and not self.draft_full_vocab:
                out[d] = (
                    "transformers' assisted generation needs the draft's full-vocabulary head; this pair's draft has a "
                    "restricted head (rerun with pair.draft.restrict_head=false to time it)"
                )
            else:
                out[d] = None
        return out

    def _timed(
        self, runners: dict[Any, Any], engines: dict[Any, BatchedDecoder] | None = None
    ) -> tuple[dict[Any, tuple[list[float], int, list[list[int]], list[Any]]], dict[Any, list[dict[str, float]]]]:
        """Tokens/s of each runner in each of ``repeats`` passes over all prompts, after warm-up.

        Passes are interleaved (runner A, B, C, A, B, C, ...) so that drifts in machine load hit every
        implementation alike. Each pass draws with its own seeds (prompt i of timed pass p = 1, 2, ...:
        ``seed + p * len(prompts) + i``; warm-up: ``seed + i``, the same for every runner), so acceptance figures pool
        ``repeats`` independent samples instead of repeating one; the generations of every timed pass are returned
        (outputs: the last pass's). For a runner of ours (``engines``: its loop), the warm-up drafts the calibration
        schedule and each timed pass's iterations, as the loop's clock timed them, give that pass's cost model
        (``costs.cost_model``): the second value returned, per runner, one dict per pass.
        """
        engines = engines or {}
        for engine in engines.values():
            engine.calibrate = True
            engine.clock.reset()
        for _ in range(self.cfg.warmup):
            for run_one in runners.values():
                for i, ids in enumerate(self.prompts):
                    run_one(i, ids)
        calibration: dict[Any, list[Iteration]] = {}
        for key, engine in engines.items():
            calibration[key] = engine.clock.records()
            engine.calibrate = False
        rates: dict[Any, list[float]] = {k: [] for k in runners}
        self.energy = {k: [] for k in runners}
        if self.meter.available and self.idle is None and self.cfg.get("idle_seconds", 0) > 0:
            synchronize(self.device)
            self.idle = self.meter.measure_idle(float(self.cfg.idle_seconds))
        clocks: dict[Any, list[dict[str, float]]] = {k: [] for k in engines}
        last: dict[Any, list[Any]] = {}
        gens: dict[Any, list[Any]] = {k: [] for k in runners}
        for p in range(self.cfg.repeats):
            for key, run_one in runners.items():
                tokens, seconds, outs = 0, 0.0, []
                if key in engines:
                    engines[key].clock.reset()
                if self.meter.available:  # the runner's pass is one metered window
                    synchronize(self.device)
                    self.meter.start()
                for i, ids in enumerate(self.prompts):
                    synchronize(self.device)
                    t0 = time.perf_counter()
                    out = run_one((p + 1) * len(self.prompts) + i, ids)
                    synchronize(self.device)
                    seconds += time.perf_counter() - t0
                    tokens += len(out[0])
                    outs.append(out)
                if self.meter.available:
                    self.energy[key].append(energy_summary(self.meter.stop(), self.idle, tokens))
                rates[key].append(tokens / seconds)
                if key in engines:
                    clocks[key].append(_pass_costs(engines[key].clock.records(), calibration[key], tokens, seconds))
                # each pass as it ends (stderr): a run stopped at a time limit still says what it measured
                print(
                    f"[bench] pass {p + 1}/{self.cfg.repeats} {key}: {tokens / seconds:.2f} tokens/s", file=sys.stderr
                )
                last[key] = outs
                gens[key].extend(o[1] for o in outs)
        results = {k: (rates[k], sum(len(o[0]) for o in last[k]), [o[0] for o in last[k]], gens[k]) for k in runners}
        return results, clocks

    def _with_forward_timers(self, run_one, acc: list[float]):
        """Wrap a runner so acc = [seconds inside model forwards, seconds in total] accumulate."""
        acc[:] = [0.0, 0.0]
        models = [m for m in (self.pair.target, self.pair.draft) if m is not None]
        # our engine may run a model through its lean forward instead of model(...): time both
        models += [lean for m in list(models) if (lean := lean_forward_for(m)) is not None]
        if self.pair.assets.get("eagle") is not None:
            models.append(self.pair.assets["eagle"])

        def timed(i, ids):
            clock = _ForwardClock(models, self.device)
            t0 = time.perf_counter()
            try:
                return run_one(i, ids)
            finally:
                synchronize(self.device)
                acc[1] += time.perf_counter() - t0
                acc[0] += clock.inside
                clock.remove()

        return timed

    def ours(self, method: str, mode: str, drafter: str | None = None, stop: str | None = None):
        """A runner of ours (``OursRunner``): the method's loop at batch 1 (``BatchedDecoder``), whose clock times
        every iteration."""
        params = self.method_params(method, mode, drafter, stop)
        dec = build_decoder(
            method, self.pair.target, self.pair.draft if method != "ar" else None, assets=self.pair.assets, **params
        )
        return OursRunner(BatchedDecoder(dec, 1), self.cfg.seed, self.cfg.max_new_tokens, self.eos, self.device)

    def transformers(self, assisted: bool, mode: str, drafter: str = "model"):
        target, draft = self.pair.target, self.pair.draft
        kwargs = generate_kwargs(self.cfg, mode, self.pair.tokenizer.pad_token_id or 0)
        if assisted:  # the peer registered for the drafter (transformers_peers: only drafters that have one)
            ngram = OmegaConf.select(self.cfg, f"method_params.{REFERENCE}.max_ngram", default=None) or 3
            kwargs.update(PEERS[drafter].kwargs(PeerArgs(draft, self.chain_gamma(REFERENCE), int(ngram))))

        def run_one(i, ids):
            torch.manual_seed(self.cfg.seed + i)
            x = torch.tensor([ids], device=self.device)
            with torch.inference_mode():
                out = target.generate(x, attention_mask=torch.ones_like(x), **kwargs)
            # prompt lookup in transformers can overshoot max_new_tokens by its last accepted block: count only
            # max_new_tokens (conservative for transformers' tokens/s; the same tokens as ours)
            return out[0, len(ids) :].tolist()[: self.cfg.max_new_tokens], None

        return run_one

    def run(self) -> tuple[list[Row], dict[str, Any]]:
        """All rows. Ratios, speedups and efficiencies are medians of per-pass values (each pass times every runner
        back to back), so slow drifts in machine load cancel; tokens/s are medians over passes. Our rows' costs (the
        target's step, c, v, the time breakdown) are their own loop's clock in the same passes."""
        cfg = self.cfg
        rows: list[Row] = []
        med = statistics.median
        self.clocks: dict[str, dict[Any, list[dict[str, float]]]] = {}  # per mode, per runner of ours, per pass
        hf_drafters = self.transformers_peers()
        d: str | None
        for mode in cfg.modes:
            runners: dict[tuple[str, str, str | None], Any] = {
                ("transformers", "ar", None): self.transformers(False, mode)
            }
            for d, why in hf_drafters.items():
                if why is None:
                    runners[("transformers", REFERENCE, d)] = self.transformers(True, mode, d)
            runners.update({("ours", m, d): self.ours(m, mode, d) for m, d in self.runs()})
            adaptive = self.adaptive_runs(mode)
            runners.update({(f"ours:{s}", m, d): self.ours(m, mode, d, s) for m, d, s in adaptive})
            engines = {k: r.engine for k, r in runners.items() if isinstance(r, OursRunner)}
            timers: dict[tuple[str, str, str | None], list[float]] = {}
            for key in runners:  # transformers: time spent inside the models' forwards (ours: the loop's clock)
                if key not in engines:
                    runners[key] = self._with_forward_timers(runners[key], timers.setdefault(key, [0.0]))
            results, clocks = self._timed(runners, engines)
            self.clocks[mode] = clocks
            hf_ar = results[("transformers", "ar", None)]
            rows.append(Row("transformers", "ar", mode, med(hf_ar[0]), hf_ar[1]))
            hf_total = timers[("transformers", "ar", None)]
            rows[-1].overhead_per_step = max(0.0, (hf_total[1] - hf_total[0]) / hf_total[1]) if hf_total[1] else None
            for d, why in hf_drafters.items():
                if why is None:
                    hf = results[("transformers", REFERENCE, d)]
                    rows.append(
                        Row(
                            "transformers",
                            REFERENCE,
                            mode,
                            med(hf[0]),
                            hf[1],
                            drafter=d,
                            gamma=self.gamma_of(REFERENCE),
                        )
                    )
                else:
                    rows.append(Row("transformers", REFERENCE, mode, None, 0, drafter=d, note=why))
            ours_ar = results.get(("ours", "ar", None))
            ar_clock = clocks.get(("ours", "ar", None))
            for method, d in self.runs():
                rates, tokens, outs, gens = results[("ours", method, d)]
                peer = hf_ar if method == "ar" else results.get(("transformers", REFERENCE, d))
                gamma = self.gamma_of(method)
                row = Row("ours", method, mode, med(rates), tokens, drafter=d, gamma=gamma)
                if peer is not None:
                    row.ratio_to_transformers = med([r / p for r, p in zip(rates, peer[0])])
                if mode == "greedy":
                    row.identical_to_transformers = outs == hf_ar[2]
                steps = sum(g.steps for g in gens)
                new = sum(len(g.tokens) for g in gens)
                row.tokens_per_step = new / steps
                own = clocks[("ours", method, d)]
                _clock_columns(row, own, ar_clock)
                if ours_ar and method != "ar":
                    speedups = [r / a for r, a in zip(rates, ours_ar[0])]
                    row.speedup = med(speedups)
                if method != "ar" and self.is_chain(method, mode, d):
                    g = self.chain_gamma(method)
                    c, v = row.c if row.c is not None else 0.0, max(0.0, row.v or 0.0)
                    _oracle(row, gens, g, c, v)
                    alpha = alpha_from_accepted([a for gen in gens for a in gen.accepted], g)
                    # measured costs: a pass's tokens per iteration at its own step over its iteration's draft + verify
                    bounds = [row.tokens_per_step * p["t_step"] / p["draft_verify"] for p in own]
                    row.alpha = alpha
                    row.bound_ideal = leviathan_bound(alpha, g, c)
                    row.bound = med(bounds)
                    if ours_ar:
                        row.efficiency = med([s / b for s, b in zip(speedups, bounds)])
                rows.append(row)
            for method, d, stop in adaptive:  # beside the fixed rows: the same method and drafter, adaptive lengths
                rates, tokens, _, gens = results[(f"ours:{stop}", method, d)]
                row = Row("ours", method, mode, med(rates), tokens, drafter=d, gamma=self.gamma_of(method))
                row.draft_stop = stop
                row.tokens_per_step = sum(len(g.tokens) for g in gens) / sum(g.steps for g in gens)
                drafted = [w for g in gens for w in g.drafted if w > 0]
                row.mean_drafted = sum(drafted) / len(drafted) if drafted else None
                _clock_columns(row, clocks[(f"ours:{stop}", method, d)], ar_clock)
                if ours_ar:
                    row.speedup = med([r / a for r, a in zip(rates, ours_ar[0])])
                rows.append(row)
            for row in rows:
                if row.mode == mode and not row.note:
                    key = (row.impl if row.draft_stop is None else f"ours:{row.draft_stop}", row.method, row.drafter)
                    _energy_figures(row, self.energy.get(key, []))  # this mode's passes
            for (method, d), why in self.skipped.items():
                rows.append(Row("ours", method, mode, None, 0, drafter=d, note=why))
        costs = self._costs(rows)
        costs.update(roofline(self.pair, costs, self.device))
        costs["energy_meter"] = self.meter.info()
        if self.idle is not None and self.idle.available:
            costs["idle_power_w"] = self.idle.power_w
            costs["reference_idle_power_w"] = self.idle.reference_power_w
        return rows, costs

    def _costs(self, rows: list[Row]) -> dict[str, Any]:
        """The bench's step costs, each from a row of ours (medians over its passes, its own loop's clock):
        ``t_ar_ms`` (ar's plain step; without an ar row, the reference's), ``t_verify_g<g>_ms`` (the mean pass of a
        drafting iteration of a chain row at gamma g; ``t_verify_ms``: the longest), ``t_draft_<drafter>_ms`` and
        ``c_<drafter>`` (the reference method's draft phase per position with that drafter), ``t_propose_<method>_
        <drafter>_ms`` (each chain row's own: MTAD's beams are dearer than the chain); ``t_draft_ms``, ``c``: the
        first drafter's."""
        med = statistics.median
        ours = [r for r in rows if r.impl == "ours" and r.draft_stop is None and r.t_step_ms is not None]
        ar = [r.t_step_ms for r in ours if r.method == "ar" and r.t_step_ms is not None]
        ref = [r.t_step_ms for r in ours if r.method == REFERENCE and r.t_step_ms is not None]
        steps = ar or ref or [r.t_step_ms for r in ours if r.t_step_ms is not None]
        costs: dict[str, Any] = {"t_ar_ms": med(steps) if steps else float("nan")}
        verify: dict[int, list[float]] = {}
        for r in ours:
            if r.method == "ar" or r.t_verify_ms is None or r.gamma is None:
                continue
            if self.is_chain(r.method, r.mode, r.drafter):
                verify.setdefault(int(r.gamma), []).append(r.t_verify_ms)
                if r.t_draft_ms is not None:
                    costs.setdefault(f"t_propose_{r.method}_{r.drafter}_ms", r.t_draft_ms)
            if r.method == REFERENCE and r.t_draft_ms is not None:
                costs.setdefault(f"t_draft_{r.drafter}_ms", r.t_draft_ms)
                costs.setdefault(f"c_{r.drafter}", r.c)
        for g, values in sorted(verify.items()):
            costs[f"t_verify_g{g}_ms"] = med(values)
        costs["t_verify_ms"] = costs[f"t_verify_g{max(verify)}_ms"] if verify else costs["t_ar_ms"]
        first = next((d for d in self.drafters if f"t_draft_{d}_ms" in costs), None)
        if first is not None:  # the first drafter's figures under the historical names
            costs["t_draft_ms"], costs["c"] = costs[f"t_draft_{first}_ms"], costs[f"c_{first}"]
        return costs


def _pass_costs(
    iterations: list[Iteration], calibration: list[Iteration], tokens: int, seconds: float
) -> dict[str, float]:
    """One pass of a runner of ours, by its loop's clock: the cost model (``costs.cost_model``) with the pass's mean
    draft + verify per iteration (``draft_verify``), its plain step (``t_step``) and its tokens per own step."""
    model = cost_model(iterations, 1, calibration)
    n = len(iterations)
    model["t_step"] = model["t_target_step_ms"] / 1e3
    model["draft_verify"] = (model["time_draft_s"] + model["time_verify_s"]) / n if n else float("nan")
    model["tokens_per_step_time"] = tokens / seconds * model["t_step"] if seconds > 0 else float("nan")
    return model


def _clock_columns(row: Row, passes: list[dict[str, float]], ar: list[dict[str, float]] | None) -> None:
    """A row of ours' clock columns: medians over its passes of its step, c, v, its draft and verify costs and its
    phase shares; ``speedup_normalized``: its tokens per own step over ar's, pass by pass (a machine phase between the
    two runners cancels in it)."""
    med = statistics.median

    def median_of(key: str, scale: float = 1.0) -> float | None:
        values = [p[key] * scale for p in passes if p.get(key) is not None and p[key] == p[key]]
        return med(values) if values else None

    row.t_step_ms = median_of("t_target_step_ms")
    row.t_draft_ms = median_of("t_draft_step_ms")
    row.t_verify_ms = median_of("t_verify_ms")
    row.c = median_of("cost_ratio_c")
    row.v = median_of("row_cost_v")
    for phase in PHASES:
        setattr(row, f"share_{phase}", median_of(f"phase_share_{phase}"))
    row.overhead_per_step = (row.share_rule or 0.0) + (row.share_other or 0.0)
    if ar and row.method != "ar":
        ratios = [p["tokens_per_step_time"] / a["tokens_per_step_time"] for p, a in zip(passes, ar)]
        ratios = [r for r in ratios if r == r]
        row.speedup_normalized = med(ratios) if ratios else None


def _oracle(row: Row, gens: list[Any], gamma: int, c: float, v: float = 0.0) -> None:
    """The hindsight oracle of a fixed-gamma chain row (docs/measurement.md): per request (each generation), the
    best fixed gamma in 1..``gamma`` from its recorded (drafted, accepted) iterations and the ideal bound it implies
    at cost ratio ``c`` and verification cost ``v`` per draft (``bounds.hindsight_gamma``); the row's mean over
    requests, beside the same arithmetic at the row's own gamma (``hindsight_fixed``)."""
    best, bounds, fixed = [], [], []
    drafted_all = [w for g in gens for w in g.drafted if w > 0]
    for gen in gens:
        # drafts accepted per iteration: emitted - 1 (the bonus or next token), never more than were drafted
        its = [(w, min(max(a - 1, 0), w)) for w, a in zip(gen.drafted, gen.accepted)]
        g_best, bound = hindsight_gamma(its, gamma, c, v)
        if g_best:
            best.append(g_best)
            bounds.append(bound)
            fixed.append(hindsight_bound(its, gamma, c, v))
    row.mean_drafted = sum(drafted_all) / len(drafted_all) if drafted_all else None
    if bounds:
        row.oracle_bound = sum(bounds) / len(bounds)
        row.hindsight_fixed = sum(fixed) / len(fixed)
        row.oracle_gamma = ", ".join(f"{g}x{best.count(g)}" for g in sorted(set(best)))


def _energy_figures(row: Row, passes: list[dict[str, Any]]) -> None:
    """A row's energy columns: medians over its metered passes (None where the meter read nothing)."""

    def median_of(key: str) -> float | None:
        values = [p[key] for p in passes if p.get(key) is not None]
        return statistics.median(values) if values else None

    row.j_per_token = median_of("j_per_token")
    row.dynamic_j_per_token = median_of("dynamic_j_per_token")
    row.reference_j_per_token = median_of("reference_j_per_token")
    row.energy_vs_reference = median_of("energy_vs_reference")


def streamed_bytes(model) -> int:
    """Bytes of weights one decode step reads: every parameter once, less an input embedding that is not
    also the LM head (a step reads one row of it)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if embed is not None and (head is None or head.weight.data_ptr() != embed.weight.data_ptr()):
        total -= embed.weight.numel() * embed.weight.element_size()
    return total


def copy_bandwidth(nbytes: int, device, reps: int = 7) -> float:
    """This machine's memory bandwidth in bytes/s: a copy of an ``nbytes`` buffer (read + write), median of ``reps``."""
    n = max(nbytes, 1 << 20)
    src = torch.ones(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    (seconds,) = median_times(lambda: dst.copy_(src), reps=reps, warmup=1, sync=lambda: synchronize(device))
    return 2 * n / seconds


def roofline(pair, costs: dict[str, float], device) -> dict[str, float]:
    """The floor of a step (its weights' bytes over the copy bandwidth) and where the measured steps stand."""
    out: dict[str, float] = {}
    target_bytes = streamed_bytes(pair.target)
    bandwidth = copy_bandwidth(target_bytes, device)
    out["bandwidth_gb_s"] = bandwidth / 1e9
    out["target_mb"] = target_bytes / 1e6
    out["floor_target_ms"] = 1e3 * target_bytes / bandwidth
    out["ar_over_floor"] = costs["t_ar_ms"] / out["floor_target_ms"]
    out["verify_over_ar"] = costs["t_verify_ms"] / costs["t_ar_ms"]  # the longest verification of the rows
    for k in [k for k in costs if k.startswith("t_verify_g")]:
        out["verify_over_ar_" + k[len("t_verify_") : -3]] = costs[k] / costs["t_ar_ms"]
    if pair.draft is not None and "t_draft_model_ms" in costs:
        draft_bytes = streamed_bytes(pair.draft)
        out["draft_mb"] = draft_bytes / 1e6
        out["floor_draft_ms"] = 1e3 * draft_bytes / bandwidth
        out["draft_over_floor"] = costs["t_draft_model_ms"] / out["floor_draft_ms"]
    return out
