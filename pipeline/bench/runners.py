"""The bench's runs on the loaded pair: every runner timed pass by pass, the step costs probed before each pass,
the rows with their ratios, bounds and energy, and the machine's roofline."""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from pipeline.bench.peers import PEERS, REFERENCE, PeerArgs, no_peer
from pipeline.bench.plan import BenchPlan, Row, generate_kwargs
from pipeline.decoding import build_decoder, make_generator
from pipeline.decoding.fast_forward import LeanForward, lean_forward_for
from pipeline.decoding.timing import median_times
from pipeline.device import synchronize
from pipeline.measure.bounds import alpha_from_accepted, hindsight_bound, hindsight_gamma, leviathan_bound
from pipeline.measure.costs import chain_draft_cost, per_draft_token, step_times
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
        self, runners: dict[Any, Any], probe
    ) -> tuple[dict[Any, tuple[list[float], int, list[list[int]], list[Any]]], list[Any]]:
        """Tokens/s of each runner in each of ``repeats`` passes over all prompts, after warm-up.

        Passes are interleaved (runner A, B, C, A, B, C, ...) so that drifts in machine load hit
        every implementation alike, and ``probe()`` (the step costs) runs before every pass, so
        that ratios and bounds can be formed pass by pass. Each pass draws with its own seeds (prompt
        i of timed pass p = 1, 2, ...: ``seed + p * len(prompts) + i``; warm-up: ``seed + i``, the same for
        every runner), so acceptance figures pool ``repeats`` independent samples instead of repeating one;
        the generations of every timed pass are returned (outputs: the last pass's).
        """
        for _ in range(self.cfg.warmup):
            for run_one in runners.values():
                for i, ids in enumerate(self.prompts):
                    run_one(i, ids)
        rates: dict[Any, list[float]] = {k: [] for k in runners}
        self.energy = {k: [] for k in runners}
        if self.meter.available and self.idle is None and self.cfg.get("idle_seconds", 0) > 0:
            synchronize(self.device)
            self.idle = self.meter.measure_idle(float(self.cfg.idle_seconds))
        probes = []
        last: dict[Any, list[Any]] = {}
        gens: dict[Any, list[Any]] = {k: [] for k in runners}
        for p in range(self.cfg.repeats):
            probes.append(probe())
            for key, run_one in runners.items():
                tokens, seconds, outs = 0, 0.0, []
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
                # each pass as it ends (stderr): a run stopped at a time limit still says what it measured
                print(
                    f"[bench] pass {p + 1}/{self.cfg.repeats} {key}: {tokens / seconds:.2f} tokens/s", file=sys.stderr
                )
                last[key] = outs
                gens[key].extend(o[1] for o in outs)
        results = {k: (rates[k], sum(len(o[0]) for o in last[k]), [o[0] for o in last[k]], gens[k]) for k in runners}
        return results, probes

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
        params = self.method_params(method, mode, drafter, stop)
        dec = build_decoder(
            method, self.pair.target, self.pair.draft if method != "ar" else None, assets=self.pair.assets, **params
        )

        def run_one(i, ids):
            gen = make_generator(self.cfg.seed + i, self.device)
            g = dec.generate(ids, max_new_tokens=self.cfg.max_new_tokens, eos_token_ids=self.eos, generator=gen)
            return g.tokens, g

        return run_one

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

    def _probe_costs(self) -> dict[str, float]:
        """t_ar, per draft length g of the rows ``t_verify_g<g>`` (one target forward of g + 1 tokens;
        ``t_verify``: the longest), per drafter the cost of one draft token (``t_draft_<drafter>``) and per
        chain method its own proposal's cost per token (``t_propose_<method>_<drafter>``: MTAD's beams cost
        more than the drafter's chain)."""
        target, prompt, reps = self.pair.target, self.prompts[0], self.cfg.probe_reps
        costs: dict[str, float] = {}
        d: str | None
        lengths = self.gammas() or [self.chain_gamma(REFERENCE)]  # no chain row: the reference's, for the roofline line
        for g in lengths:
            t_ar, costs[f"t_verify_g{g}"] = step_times(target, prompt, g, self.device, reps=reps)
            costs.setdefault("t_ar", t_ar)  # the first reading: every row's ratios use one t_ar per pass
        costs["t_verify"] = costs[f"t_verify_g{max(lengths)}"]
        for (
            d
        ) in self.drafters:  # each drafter's own draft token (costs.chain_draft_cost), under the reference's warping
            dec: Any = build_decoder(
                REFERENCE,
                target,
                self.pair.draft,
                assets=self.pair.assets,
                **self.method_params(REFERENCE, "sample", d),
            )
            costs[f"t_draft_{d}"] = chain_draft_cost(
                dec.drafter_impl,
                dec.target,
                list(prompt),
                self.chain_gamma(REFERENCE),
                dec.warper,
                reps=reps,
                sync=lambda: synchronize(self.device),
            )
        for method, d in self.runs():
            if method != "ar" and self.is_chain(method, "sample", d):
                costs[f"t_propose_{method}_{d}"] = self._proposal_cost(method, d, prompt, reps)
        return costs

    def _proposal_cost(self, method: str, drafter: str | None, prompt: list[int], reps: int) -> float:
        """Median seconds per draft token of ``method``'s own ``gamma``-token proposal after ``prompt`` (its
        drafter's chain for spd/block, beam sampling for mtad), sampled mode, over ``reps`` after one warm-up."""
        dec: Any = build_decoder(
            method,
            self.pair.target,
            self.pair.draft,
            assets=self.pair.assets,
            **self.method_params(method, "sample", drafter),
        )
        prompt, gamma = list(prompt), self.chain_gamma(method)
        generator = make_generator(0, self.device)
        with torch.inference_mode():
            dec._start(prompt)
        seconds = per_draft_token(
            lambda: dec.propose(prompt, gamma, generator),
            lambda: dec.drafter_impl.rollback(len(prompt) - 1),
            gamma,
            reps,
            lambda: synchronize(self.device),
        )
        dec.target.reset()
        return seconds

    def run(self) -> tuple[list[Row], dict[str, Any]]:
        """All rows. Ratios, speedups and efficiencies are medians of per-pass values (each pass
        times every runner back to back after measuring the step costs), so slow drifts in machine
        load cancel; tokens/s are medians over passes."""
        cfg = self.cfg
        rows: list[Row] = []
        all_probes: list[dict[str, float]] = []
        med = statistics.median
        self.probes: dict[str, list[dict[str, float]]] = {}  # per mode, the step costs (s) measured in each pass
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
            timers: dict[tuple[str, str, str | None], list[float]] = {}
            for key in runners:  # time spent inside the models' forwards, per runner
                runners[key] = self._with_forward_timers(runners[key], timers.setdefault(key, [0.0]))
            results, probes = self._timed(runners, self._probe_costs)
            self.probes[mode] = probes
            all_probes += probes
            hf_ar = results[("transformers", "ar", None)]
            rows.append(Row("transformers", "ar", mode, med(hf_ar[0]), hf_ar[1]))
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
                # overhead: wall time outside the models' forwards, as a share of the decode time
                passes = cfg.warmup + cfg.repeats
                in_forward, total = timers[("ours", method, d)][0] / passes, timers[("ours", method, d)][1] / passes
                row.overhead_per_step = max(0.0, (total - in_forward) / total)
                if ours_ar and method != "ar":
                    speedups = [r / a for r, a in zip(rates, ours_ar[0])]
                    row.speedup = med(speedups)
                if method != "ar" and self.is_chain(method, mode, d):
                    cost = f"t_propose_{method}_{d}" if f"t_propose_{method}_{d}" in probes[0] else f"t_draft_{d}"
                    g = self.chain_gamma(method)
                    # each verified draft's share of a step, from the measured (g + 1)-token pass (linear in the rows)
                    v = max(0.0, med([(p[f"t_verify_g{g}"] / p["t_ar"] - 1.0) / g for p in probes]))
                    _oracle(row, gens, g, med([p[cost] / p["t_ar"] for p in probes]), v)
                    alpha = alpha_from_accepted([a for gen in gens for a in gen.accepted], g)
                    bounds = [row.tokens_per_step * p["t_ar"] / (g * p[cost] + p[f"t_verify_g{g}"]) for p in probes]
                    c = med([p[cost] / p["t_ar"] for p in probes])
                    row.alpha, row.c = alpha, c
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
                if ours_ar:
                    row.speedup = med([r / a for r, a in zip(rates, ours_ar[0])])
                rows.append(row)
            for row in rows:
                if row.mode == mode and not row.note:
                    key = (row.impl if row.draft_stop is None else f"ours:{row.draft_stop}", row.method, row.drafter)
                    _energy_figures(row, self.energy.get(key, []))  # this mode's passes
            for (method, d), why in self.skipped.items():
                rows.append(Row("ours", method, mode, None, 0, drafter=d, note=why))
        costs: dict[str, Any] = {f"{k}_ms": med([p[k] for p in all_probes]) * 1e3 for k in all_probes[0]}
        for d in self.drafters:
            costs[f"c_{d}"] = med([p[f"t_draft_{d}"] / p["t_ar"] for p in all_probes])
        # the first drafter's figures under the historical names
        costs["t_draft_ms"] = costs[f"t_draft_{self.drafters[0]}_ms"]
        costs["c"] = costs[f"c_{self.drafters[0]}"]
        costs.update(roofline(self.pair, costs, self.device))
        costs["energy_meter"] = self.meter.info()
        if self.idle is not None and self.idle.available:
            costs["idle_power_w"] = self.idle.power_w
            costs["reference_idle_power_w"] = self.idle.reference_power_w
        return rows, costs


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
