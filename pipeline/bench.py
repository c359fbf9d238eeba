"""Benchmark: our decoders against transformers' generate() and assisted generation, and the bound.

    python -m pipeline.bench pair=smollm2-offline gamma=4 repeats=3

For every mode (greedy, sample) it times, on the same pair, prompts and settings:
transformers ``generate()`` (autoregressive), assisted generation where it can run
(``assistant_model=draft`` with ``num_assistant_tokens = gamma``, schedule ``constant``, confidence
threshold off, for ``drafter: model`` with a full-vocabulary draft head; ``prompt_lookup_num_tokens =
gamma``, ``max_matching_ngram_size = max_ngram`` for ``drafter: ngram``; a row says why not otherwise:
a restricted draft head, or EAGLE, which transformers does not run), and our ``ar``, ``spd``,
``block``, ``mtad`` with every drafter of ``drafters`` (``pair`` = the pair's configured drafter;
methods that cannot use a drafter get a row saying so). tokens/s is the median over ``repeats`` timed passes after
``warmup`` untimed ones. It also measures the single-token step time of the target (t_ar) and the
draft (t_draft), the time of one verification forward over gamma + 1 tokens (t_verify), the
acceptance rate alpha, and reports Leviathan's bound in both forms:

- ideal:    (1 - alpha^(g+1)) / ((1 - alpha)(g c + 1)),  c = t_draft / t_ar
- measured: E[tokens per step] * t_ar / (g t_draft + t_verify)

with efficiency = measured speedup over our ``ar`` / measured-cost bound, and the per-step
overhead outside the two models' forward passes. Results go to ``benchmarks/<name>.md|json``.

Energy (``energy_meter``, as the sweep's ``measure.energy_meter``: ``auto`` = NVML on a GPU, RAPL on a CPU
where readable, else none): every runner's pass over the prompts is one metered window, so each row has
J/token (median over passes), idle-subtracted with the idle power measured once before the passes
(``idle_seconds``); with ``nvml+zeus``, Zeus's reading of the same windows and ours against it per pass.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import hydra
import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from pipeline.bench_batched import BatchBench, batch_markdown, check_batch_sizes
from pipeline.decoding import DRAFTERS, build_decoder, check_method, make_generator, method_class
from pipeline.decoding.fast_forward import LeanForward, lean_forward_for, unsupported_reason
from pipeline.device import machine_info, synchronize
from pipeline.measure.bounds import alpha_from_accepted, leviathan_bound
from pipeline.measure.costs import step_times
from pipeline.measure.energy import check_energy_meter, energy_summary, make_energy_meter
from pipeline.models import PairSpec, drafter_context, load_pair
from pipeline.prompts import encode_prompt, eos_ids
from pipeline.sweep.checks import check_numbers, check_seeds, number_error

REPO_ROOT = Path(__file__).resolve().parent.parent
# the engine's switches, recorded in the command line of a result
ENV_SWITCHES = ("PIPELINE_LEAN_FORWARD", "PIPELINE_FAST_MATMUL", "PIPELINE_CPU_BF16", "PIPELINE_BF16_KERNELS")


@dataclass
class Row:
    impl: str  # ours | transformers
    method: str
    mode: str  # greedy | sample
    tokens_per_s: float | None
    tokens: int
    drafter: str | None = None  # model | eagle | ngram (None: ar)
    gamma: int | None = None  # the draft length this row ran with (None: a method without one)
    note: str | None = None  # why a row was not run
    ratio_to_transformers: float | None = None
    identical_to_transformers: bool | None = None
    tokens_per_step: float | None = None
    alpha: float | None = None
    c: float | None = None
    bound: float | None = None
    bound_ideal: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    overhead_per_step: float | None = None
    j_per_token: float | None = None  # energy meter's J per new token, median over passes
    dynamic_j_per_token: float | None = None  # the same less idle power x window time
    reference_j_per_token: float | None = None  # a reference meter's (energy_meter: nvml+zeus) on the same windows
    energy_vs_reference: float | None = None  # ours / reference - 1, median of per-pass values


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
                model.fused_chain = self._timed_chain(model.fused_chain)
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


# bench.yaml's numeric settings: key -> (integer, minimum, strict, nullable, example, what it means)
_SETTINGS = {
    "repeats": (True, 1, False, False, 5, " (timed passes; tokens/s is their median)"),
    "probe_reps": (True, 1, False, False, 10, " (step-cost measurements per pass)"),
    "warmup": (True, 0, False, False, 1, " (untimed passes first)"),
    "max_new_tokens": (True, 1, False, False, 64, ""),
    "threads": (True, 1, False, True, 2, " (null: torch's default)"),
    "gamma": (True, 1, False, True, 4, " (null: each method's own draft length)"),
    "idle_seconds": (False, 0, False, False, 5, ""),
}


def check_settings(cfg: DictConfig) -> None:
    """The bench's own settings, before any model loads (a ValueError naming the fix; exit 2): zero passes or
    probes end in a median of nothing, and no prompts in a division by zero, after the pair has loaded."""
    errors = []
    for key, (integer, low, strict, nullable, example, note) in _SETTINGS.items():
        problem = number_error(
            "",
            key,
            cfg.get(key),
            integer=integer,
            low=low,
            strict=strict,
            nullable=nullable,
            example=example,
            note=note,
        )
        if problem:
            errors.append(problem)
    prompts = (
        OmegaConf.to_container(cfg.prompts, resolve=True)
        if OmegaConf.is_list(cfg.get("prompts"))
        else cfg.get("prompts")
    )
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        errors.append(
            f"prompts={prompts!r}: must be a non-empty list of non-empty texts (e.g. 'prompts=[Name a colour.]')"
        )
    errors += (
        check_seeds([cfg.get("seed")]) if cfg.get("seed") is not None else ["seed=null: must be an integer (seed=0)"]
    )
    said = {e.split("=", 1)[0] for e in errors}
    settings = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in ("hydra", "pair")}
    errors += [e for e in check_numbers(settings, "") if e.split("=", 1)[0] not in said]
    if errors:
        raise ValueError("the bench cannot run: " + "; ".join(e.replace("seeds: ", "seed: ") for e in errors))


class Bench:
    def __init__(self, cfg: DictConfig):
        check_settings(cfg)  # before any model loads
        self.cfg = cfg
        spec = PairSpec.from_config(OmegaConf.to_container(cfg.pair, resolve=True))
        ctx = drafter_context(spec)
        self.skipped: dict[tuple[str, str], str] = {}  # (method, drafter) -> why it is not run
        self.drafters: list[str] = []  # row labels: the drafter kinds
        self.drafter_values: dict[
            str, Any
        ] = {}  # label -> the method's `drafter` value (a kind, or a scope with a path)
        for entry in cfg.drafters:
            value = OmegaConf.to_container(entry, resolve=True) if OmegaConf.is_config(entry) else entry
            d = value.get("kind") if isinstance(value, dict) else value
            if d != "pair" and d not in DRAFTERS:
                raise ValueError(
                    f"unknown drafter {value!r} in drafters: choose from pair, {', '.join(DRAFTERS)} (or {{kind: ..., <its parameters>}})"
                )
            if (
                d == "pair"
            ):  # the pair's drafter, resolved as the methods resolve it (eagle + an EAGLE-3 folder: eagle3)
                d = value = check_method("spd", {"drafter": "pair"}, drafters=ctx)["drafter"]["kind"]
            if DRAFTERS.get(d).asset == "draft" and not ctx.has_draft:
                raise ValueError(f"drafters has model but pair {spec.name!r} has no draft model")
            if (
                DRAFTERS.get(d).asset == "eagle"
                and not ctx.has_eagle
                and not (isinstance(value, dict) and value.get("path"))
            ):
                raise ValueError(
                    f"drafters has {d} but pair {spec.name!r} has no `eagle:` head (python -m pipeline.train_eagle, pair.eagle=<folder>, or {{kind: {d}, path: <folder>}})"
                )
            if d not in self.drafters:
                self.drafters.append(d)
                self.drafter_values[d] = value
        self.ctx = ctx
        for mode in cfg.modes:  # bad methods or parameters fail before any model is loaded
            if mode not in ("greedy", "sample"):
                raise ValueError(f"unknown mode {mode!r}: modes are greedy and sample")
            for method in cfg.methods:
                check_method(method, self.method_params(method, mode), drafters=ctx)
                for d in self.drafters if "drafter" in method_class(method).params else ():
                    try:
                        check_method(method, self.method_params(method, mode, d), drafters=ctx)
                    except ValueError as err:
                        self.skipped[(method, d)] = str(err)
        # batch_sizes=[...]: the batch-size table instead (pipeline/bench_batched.py), its refusals before any model loads
        self.batch_skipped = check_batch_sizes(cfg, self) if cfg.get("batch_sizes") else {}
        check_energy_meter(cfg.get("energy_meter", "none"))  # before any model loads
        self.pair = load_pair(spec)
        self.meter = make_energy_meter(next(self.pair.target.parameters()).device, cfg.get("energy_meter", "none"))
        self.idle = None  # the idle power, measured once before the first timed pass when a meter is available
        self.energy: dict[
            Any, list[dict[str, Any]]
        ] = {}  # runner -> energy_summary of each timed pass (the last _timed call)
        self.draft_full_vocab = (
            self.pair.draft is not None and getattr(self.pair.draft, "draft_token_map", None) is None
        )
        self.device = next(self.pair.target.parameters()).device
        self.prompts = [encode_prompt(self.pair.tokenizer, p, spec.chat) for p in cfg.prompts]
        self.eos = [] if cfg.ignore_eos else eos_ids(self.pair.tokenizer, self.pair.target)

    def runs(self) -> list[tuple[str, str | None]]:
        """(method, drafter) of our rows: ar once, every other method with every drafter it can use."""
        out = []
        for m in self.cfg.methods:
            if "drafter" not in method_class(m).params:
                out.append((m, None))
            else:
                out += [(m, d) for d in self.drafters if (m, d) not in self.skipped]
        return out

    def transformers_peers(self) -> dict[str, str | None]:
        """Drafter -> None when transformers' assisted generation runs with it (the drafter declares its
        equivalent, ``Drafter.transformers``), else why not."""
        out: dict[str, str | None] = {}
        for d in self.drafters:
            plugin = DRAFTERS.get(d)
            if plugin.transformers is None:
                out[d] = plugin.no_transformers
            elif plugin.transformers == "assistant_model" and not self.draft_full_vocab:
                out[d] = (
                    "transformers' assisted generation needs the draft's full-vocabulary head; this pair's draft has a "
                    "restricted head (rerun with pair.draft.restrict_head=false to time it)"
                )
            else:
                out[d] = None
        return out

    def _mode_params(self, mode: str) -> dict[str, Any]:
        if mode == "greedy":
            return {"temperature": 0.0}
        return dict(OmegaConf.to_container(self.cfg.sampling, resolve=True))

    def _timed(
        self, runners: dict[Any, Any], probe
    ) -> tuple[dict[Any, tuple[list[float], int, list[list[int]], list[Any]]], list[Any]]:
        """Tokens/s of each runner in each of ``repeats`` passes over all prompts, after warm-up.

        Passes are interleaved (runner A, B, C, A, B, C, ...) so that drifts in machine load hit
        every implementation alike, and ``probe()`` (the step costs) runs before every pass, so
        that ratios and bounds can be formed pass by pass. Each pass draws with its own seeds (prompt
        i of timed pass p = 1, 2, ...: ``seed + p * len(prompts) + i``; warm-up: ``seed + i``, the same for every runner), so acceptance figures
        pool ``repeats`` independent samples instead of repeating one; the generations of every timed
        pass are returned (outputs: the last pass's).
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

    def gamma_of(self, method: str) -> int | None:
        """The draft length ``method`` runs with: ``gamma`` when set (every method's), else
        ``method_params.<method>.gamma``, else the method's own (``conf/method/<method>.yaml``, as a sweep
        runs it; the decoder's default without such a file); None for a method that takes none."""
        params = method_class(method).params
        if "gamma" not in params:
            return None
        if self.cfg.get("gamma") is not None:
            return int(self.cfg.gamma)
        extra = OmegaConf.select(self.cfg, f"method_params.{method}.gamma", default=None)
        if extra is not None:
            return int(extra)
        conf = REPO_ROOT / "conf" / "method" / f"{method}.yaml"
        if conf.exists():
            value = (yaml.safe_load(conf.read_text()) or {}).get("gamma")
            if value is not None:
                return int(value)
        return int(params["gamma"].default)

    def gammas(self) -> list[int]:
        """The distinct draft lengths of the chain rows (each needs its own t_verify)."""
        return sorted({self.gamma_of(m) for m, d in self.runs() if m != "ar" and self.is_chain(m, "sample", d)})

    def method_params(self, method: str, mode: str, drafter: str | None = None) -> dict[str, Any]:
        """Warping of ``mode``, ``gamma`` for methods that take it, then ``method_params.<method>``, then ``drafter``."""
        params = self._mode_params(mode)
        gamma = self.gamma_of(method)
        if gamma is not None:
            params["gamma"] = gamma
        extra = OmegaConf.select(self.cfg, f"method_params.{method}", default=None)
        if extra:
            params.update(
                {k: v for k, v in OmegaConf.to_container(extra, resolve=True).items() if k != "gamma"}
            )  # gamma: gamma_of
        if drafter is not None:
            params["drafter"] = self.drafter_values.get(drafter, drafter)
        return params

    def is_chain(self, method: str, mode: str, drafter: str | None = None) -> bool:
        """A chain of gamma draft tokens verified in one target pass: the bound applies (mtad with a
        draft model drafts beams: it is counted as a chain of its best beam, as before)."""
        cls = method_class(method)
        if cls.draft_shape != "chain":  # the method's declared capability
            return False
        values = check_method(method, self.method_params(method, mode, drafter), drafters=self.ctx)
        return cls.shape_for(DRAFTERS.get(values["drafter"]["kind"]), values) == "chain"

    def ours(self, method: str, mode: str, drafter: str | None = None):
        params = self.method_params(method, mode, drafter)
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
        kwargs: dict[str, Any] = dict(
            max_new_tokens=self.cfg.max_new_tokens, pad_token_id=self.pair.tokenizer.pad_token_id or 0
        )
        if self.cfg.ignore_eos:
            kwargs.update(eos_token_id=None, min_new_tokens=self.cfg.max_new_tokens)
        if mode == "greedy":
            kwargs.update(do_sample=False, top_k=None, top_p=None, temperature=None)
        else:
            s = self.cfg.sampling
            kwargs.update(do_sample=True, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
        if assisted and DRAFTERS.get(drafter).transformers == "prompt_lookup":
            ngram = OmegaConf.select(self.cfg, "method_params.spd.max_ngram", default=None) or 3
            kwargs.update(prompt_lookup_num_tokens=self.gamma_of("spd"), max_matching_ngram_size=int(ngram))
        elif assisted:
            draft.generation_config.num_assistant_tokens = self.gamma_of("spd")
            draft.generation_config.num_assistant_tokens_schedule = "constant"
            draft.generation_config.assistant_confidence_threshold = 0.0
            kwargs.update(
                assistant_model=draft,
                num_assistant_tokens=self.gamma_of("spd"),
                num_assistant_tokens_schedule="constant",
                assistant_confidence_threshold=0.0,
            )

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
        lengths = self.gammas() or [self.gamma_of("spd")]  # no chain row: spd's, for the roofline line
        for g in lengths:
            t_ar, costs[f"t_verify_g{g}"] = step_times(target, prompt, g, self.device, reps=reps)
            costs.setdefault("t_ar", t_ar)  # the first reading: every row's ratios use one t_ar per pass
        costs["t_verify"] = costs[f"t_verify_g{max(lengths)}"]
        for d in self.drafters:  # each drafter measures its own draft token (Drafter.step_cost), under spd's warping
            dec = build_decoder(
                "spd", target, self.pair.draft, assets=self.pair.assets, **self.method_params("spd", "sample", d)
            )
            costs[f"t_draft_{d}"] = dec.drafter_impl.step_cost(
                dec.target,
                list(prompt),
                self.gamma_of("spd"),
                dec.warper,
                reps=reps,
                sync=lambda: synchronize(self.device),
            )
        for method, d in self.runs():
            if method != "ar" and self.is_chain(method, "sample", d):
                costs[f"t_propose_{method}_{d}"] = self._proposal_cost(method, d, prompt, reps)
        return costs

    def _proposal_cost(self, method: str, drafter: str, prompt: list[int], reps: int) -> float:
        """Median seconds per draft token of ``method``'s own ``gamma``-token proposal after ``prompt`` (its
        drafter's chain for spd/block, beam sampling for mtad), sampled mode, over ``reps`` after one warm-up."""
        dec = build_decoder(
            method,
            self.pair.target,
            self.pair.draft,
            assets=self.pair.assets,
            **self.method_params(method, "sample", drafter),
        )
        prompt, gamma = list(prompt), self.gamma_of(method)
        generator = make_generator(0, self.device)
        times = []
        with torch.inference_mode():
            dec._start(prompt)
            for _ in range(reps + 1):
                synchronize(self.device)
                t0 = time.perf_counter()
                dec.propose(prompt, gamma, generator)
                synchronize(self.device)
                times.append(time.perf_counter() - t0)
                dec.drafter_impl.rollback(len(prompt) - 1)
        dec.target.reset()
        return statistics.median(times[1:]) / gamma

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
        for mode in cfg.modes:
            runners = {("transformers", "ar", None): self.transformers(False, mode)}
            for d, why in hf_drafters.items():
                if why is None:
                    runners[("transformers", "spd", d)] = self.transformers(True, mode, d)
            runners.update({("ours", m, d): self.ours(m, mode, d) for m, d in self.runs()})
            timers = {}
            for key in runners:  # time spent inside the models' forwards, per runner
                runners[key] = self._with_forward_timers(runners[key], timers.setdefault(key, [0.0]))
            results, probes = self._timed(runners, self._probe_costs)
            self.probes[mode] = probes
            all_probes += probes
            hf_ar = results[("transformers", "ar", None)]
            rows.append(Row("transformers", "ar", mode, med(hf_ar[0]), hf_ar[1]))
            for d, why in hf_drafters.items():
                if why is None:
                    hf = results[("transformers", "spd", d)]
                    rows.append(
                        Row("transformers", "spd", mode, med(hf[0]), hf[1], drafter=d, gamma=self.gamma_of("spd"))
                    )
                else:
                    rows.append(Row("transformers", "spd", mode, None, 0, drafter=d, note=why))
            ours_ar = results.get(("ours", "ar", None))
            for method, d in self.runs():
                rates, tokens, outs, gens = results[("ours", method, d)]
                peer = hf_ar if method == "ar" else results.get(("transformers", "spd", d))
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
                    key = f"t_propose_{method}_{d}" if f"t_propose_{method}_{d}" in probes[0] else f"t_draft_{d}"
                    alpha = alpha_from_accepted([a for g in gens for a in g.accepted], gamma)
                    bounds = [
                        row.tokens_per_step * p["t_ar"] / (gamma * p[key] + p[f"t_verify_g{gamma}"]) for p in probes
                    ]
                    c = med([p[key] / p["t_ar"] for p in probes])
                    row.alpha, row.c = alpha, c
                    row.bound_ideal = leviathan_bound(alpha, gamma, c)
                    row.bound = med(bounds)
                    if ours_ar:
                        row.efficiency = med([s / b for s, b in zip(speedups, bounds)])
                rows.append(row)
            for row in rows:
                if row.mode == mode and not row.note:
                    _energy_figures(row, self.energy.get((row.impl, row.method, row.drafter), []))  # this mode's passes
            for (method, d), why in self.skipped.items():
                rows.append(Row("ours", method, mode, None, 0, drafter=d, note=why))
        costs = {f"{k}_ms": med([p[k] for p in all_probes]) * 1e3 for k in all_probes[0]}
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
    times = []
    for _ in range(reps + 1):
        synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return 2 * n / statistics.median(times[1:])


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


def engine_info(pair) -> str:
    """Which forward our decoders use for each model (lean or transformers'), its dtype and kernel path."""
    parts = []
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        if model is None:
            continue
        lean = lean_forward_for(model)
        dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        if lean is None:
            parts.append(
                f"{role} {dtype} through transformers' forward ({unsupported_reason(model) or 'PIPELINE_LEAN_FORWARD=0'})"
            )
        else:
            parts.append(f"{role} {dtype} through the lean forward, kernels {lean.kernel_path}")
    return "; ".join(parts)


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _gammas(rows: list[Row], cfg: DictConfig) -> str:
    """How the rows' draft lengths were chosen, for the header."""
    chosen = {}
    for r in rows:
        if r.impl == "ours" and r.gamma is not None and not r.note:
            chosen.setdefault(r.method, r.gamma)
    if cfg.get("gamma") is not None:
        return f"gamma {cfg.gamma} (every method)"
    if not chosen:
        return "no method with a draft length"
    return (
        "gamma per method (method_params.<method>.gamma, else conf/method/<method>.yaml; gamma=N sets every method's): "
        + ", ".join(f"{m} {g}" for m, g in chosen.items())
    )


def _energy_lines(rows: list[Row], costs: dict[str, Any]) -> list[str]:
    """The energy table (rows with a reading), or one line saying why there is none."""
    meter = costs.get("energy_meter") or {}
    if not meter.get("available"):
        return ["", f"Energy: not measured ({meter.get('reason') or 'energy_meter=none'})."]
    ref = meter.get("reference")
    idle = costs.get("idle_power_w")
    head = (
        f"Energy: meter {meter.get('meter')}; each row's pass over the prompts is one window, J/token the median over passes; "
        f"idle power {_fmt(idle, 1)} W"
        + (f" (reference {_fmt(costs.get('reference_idle_power_w'), 1)} W)" if ref else "")
        + "; dynamic = less idle power x window time"
        + ("; ours vs reference: ours / reference - 1 per pass, median." if ref else ".")
    )
    lines = [
        "",
        head,
        "",
        "| impl | method | drafter | mode | J/token | dynamic J/token |"
        + (" reference J/token | ours vs reference |" if ref else ""),
        "|---|---|---|---|---|---|" + ("---|---|" if ref else ""),
    ]
    for r in rows:
        if r.note or r.j_per_token is None and r.reference_j_per_token is None:
            continue
        tail = (
            f" {_fmt(r.reference_j_per_token, 4)} | {_fmt(None if r.energy_vs_reference is None else 100 * r.energy_vs_reference, 2)}% |"
            if ref
            else ""
        )
        lines.append(
            f"| {r.impl} | {r.method} | {_fmt(r.drafter)} | {r.mode} | {_fmt(r.j_per_token, 4)} | {_fmt(r.dynamic_j_per_token, 4)} |"
            + tail
        )
    return lines


def to_markdown(
    name: str, rows: list[Row], costs: dict[str, Any], info: dict[str, Any], command: str, cfg: DictConfig
) -> str:
    verify = sorted((int(k[len("t_verify_g") : -3]), v) for k, v in costs.items() if k.startswith("t_verify_g"))
    lines = [
        f"# Benchmark `{name}`",
        "",
        f"Command: `{command}`",
        "",
        f"Pair `{cfg.pair.name}`, {_gammas(rows, cfg)}; {len(cfg.prompts)} prompts x {cfg.max_new_tokens} new tokens"
        f"{' (EOS ignored)' if cfg.ignore_eos else ''}, {cfg.repeats} timed passes after {cfg.warmup} warm-up; "
        f"sampling T={cfg.sampling.temperature}, top-k {cfg.sampling.top_k}, top-p {cfg.sampling.top_p}. "
        "tokens/s: median over passes; ratio, speedup and efficiency: medians of per-pass values (every pass "
        "runs all rows back to back after measuring the step costs).",
        "",
        f"Step costs (medians over passes, batch 1, KV cache): t_ar {costs['t_ar_ms']:.2f} ms, "
        + ", ".join(f"t_verify({g}+1) {v:.2f} ms" for g, v in verify)
        + "; one draft token: "
        + ", ".join(
            f"{k[8:-3]} {v:.3f} ms (c {costs['c_' + k[8:-3]]:.3f})"
            for k, v in costs.items()
            if k.startswith("t_draft_") and k != "t_draft_ms"
        )
        + "; each method's own proposal per draft token (its row's t_draft and c): "
        + ", ".join(
            f"{k[10:-3].replace('_', ' with ', 1)} {v:.3f} ms" for k, v in costs.items() if k.startswith("t_propose_")
        )
        + ". "
        "bound (measured costs) = tokens/step x t_ar / (gamma t_draft + t_verify); bound (ideal) = "
        "(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)); efficiency = speedup vs our ar / bound (measured costs); "
        "overhead/step = share of our decode time spent outside the two models' forward passes.",
        "",
        f"Our engine: {info.get('engine', '')}.",
        "",
        f"Roofline: copy bandwidth {costs['bandwidth_gb_s']:.1f} GB/s (a {costs['target_mb']:.0f} MB copy, read + write); a target step "
        f"streams {costs['target_mb']:.0f} MB: floor {costs['floor_target_ms']:.2f} ms, t_ar / floor {costs['ar_over_floor']:.2f}, "
        + ", ".join(f"t_verify({g}+1) / t_ar {v / costs['t_ar_ms']:.2f}" for g, v in verify)
        + (
            f"; the draft streams {costs['draft_mb']:.1f} MB: floor {costs['floor_draft_ms']:.3f} ms, t_draft / floor {costs['draft_over_floor']:.1f}"
            if "draft_mb" in costs
            else ""
        )
        + ".",
        "",
        "| impl | method | drafter | gamma | mode | tokens/s | ratio to transformers | identical to transformers greedy | tokens/step | alpha | c | bound (measured costs) | bound (ideal) | speedup vs our ar | efficiency | overhead/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for r in rows:
        if r.note:
            notes.append(f"- {r.impl} {r.method} ({r.drafter}, {r.mode}) not run: {r.note}")
            continue
        lines.append(
            f"| {r.impl} | {r.method} | {_fmt(r.drafter)} | {_fmt(r.gamma)} | {r.mode} | {_fmt(r.tokens_per_s)} | {_fmt(r.ratio_to_transformers)} | "
            f"{_fmt(r.identical_to_transformers)} | {_fmt(r.tokens_per_step)} | {_fmt(r.alpha, 3)} | {_fmt(r.c, 3)} | "
            f"{_fmt(r.bound)} | {_fmt(r.bound_ideal)} | {_fmt(r.speedup)} | {_fmt(r.efficiency)} | "
            f"{_fmt(None if r.overhead_per_step is None else 100 * r.overhead_per_step, 1)}{'%' if r.overhead_per_step is not None else ''} |"
        )
    lines += _energy_lines(rows, costs)
    if notes:
        lines += ["", "Rows not run:", *sorted(set(notes))]
    lines += ["", "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items() if k != "engine"), ""]
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path="../conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    try:
        check_settings(cfg)
        if cfg.threads:
            torch.set_num_threads(int(cfg.threads))
        bench = Bench(cfg)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    name = cfg.name or f"{cfg.pair.name}-{bench.device.type}"
    if cfg.get("batch_sizes"):
        main_batched(cfg, bench, name)
        return
    rows, costs = bench.run()
    bench.meter.close()
    info = machine_info(bench.device)
    info.update(bench.pair.precision())
    info["engine"] = engine_info(bench.pair)
    env = " ".join(f"{k}={os.environ[k]}" for k in ENV_SWITCHES if k in os.environ)
    command = (env + " " if env else "") + "python -m pipeline.bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = REPO_ROOT / cfg.out_dir
    out.mkdir(parents=True, exist_ok=True)
    # the measurements first: a table that cannot be drawn must not lose what the passes measured
    payload = [asdict(r) for r in rows]
    (out / f"{name}.json").write_text(json.dumps(payload, indent=1))
    (out / f"{name}.meta.json").write_text(
        json.dumps(
            {"command": command, "costs": costs, "machine": info, "config": OmegaConf.to_container(cfg, resolve=True)},
            indent=1,
        )
    )
    md = to_markdown(name, rows, costs, info, command, cfg)
    (out / f"{name}.md").write_text(md)
    print(md)


def main_batched(cfg: DictConfig, bench: Bench, name: str) -> None:
    """``batch_sizes=[...]``: the batch-size table (``bench_batched``) to benchmarks/<name>-batching.md|json."""
    rows = BatchBench(bench, cfg).run()
    bench.meter.close()
    info = machine_info(bench.device)
    info.update(bench.pair.precision())
    env = " ".join(f"{k}={os.environ[k]}" for k in ENV_SWITCHES if k in os.environ)
    command = (env + " " if env else "") + "python -m pipeline.bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    md = batch_markdown(name, rows, cfg, command, info)
    out = REPO_ROOT / cfg.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}-batching.md").write_text(md)
    (out / f"{name}-batching.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(md)


if __name__ == "__main__":
    main()
