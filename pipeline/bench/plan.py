"""The bench's plan, before any model loads: its settings checked, the rows' drafters, methods and parameters.

``BenchPlan`` is what ``runners.Bench`` runs; the module docstring of ``pipeline.bench`` describes the bench.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, OmegaConf

from pipeline.bench.peers import REFERENCE
from pipeline.decoding import DRAFTERS, check_method, method_args, method_class
from pipeline.decoding.draft_length import DRAFT_STOPS
from pipeline.decoding.drafter_scope import PAIR
from pipeline.measure.energy import check_energy_meter
from pipeline.measure.workload import Workload
from pipeline.models import PairSpec, drafter_context, load_tokenizer
from pipeline.prompts import encode_prompt
from pipeline.sweep.checks import MAX_BATCH_SIZE, check_numbers, check_seeds, context_length, rule_errors

REPO_ROOT = Path(__file__).resolve().parents[2]


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
    draft_stop: str | None = None  # an adaptive draft length (draft_stops); None: the method's own (fixed gamma)
    mean_drafted: float | None = None  # drafts per drafted iteration (gamma for a fixed row, less near the end)
    oracle_gamma: str | None = None  # the best fixed gamma per request in hindsight: gamma x requests
    oracle_bound: float | None = None  # mean over requests of the hindsight bound at that request's best gamma
    hindsight_fixed: float | None = None  # the same arithmetic at the row's own gamma (what the oracle is against)
    # ours, by the loop's own clock (medians over passes): a plain target step, the draft phase per position, the mean
    # pass of a drafting iteration, v (one more drafted position's rows over a step), the phases' shares of the time
    t_step_ms: float | None = None
    t_draft_ms: float | None = None
    t_verify_ms: float | None = None
    v: float | None = None
    share_draft: float | None = None
    share_verify: float | None = None
    share_rule: float | None = None
    share_other: float | None = None
    speedup_normalized: float | None = None  # tokens per own target step over ar's, pass by pass


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
MAX_BATCH_REQUESTS = 4 * MAX_BATCH_SIZE  # batch_requests: requests per pass of the batch-size table


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def batch_errors(cfg: DictConfig) -> list[str]:
    """``batch_sizes`` and ``batch_requests``, before any model loads: integers in range (a batch size at most
    ``MAX_BATCH_SIZE``, requests at most ``MAX_BATCH_REQUESTS``; 0 is refused, null is the default) and no batch
    larger than the requests of a pass."""
    errors = []
    sizes_raw = cfg.get("batch_sizes")
    sizes: list[Any] = []
    if sizes_raw is not None:
        sizes = list(sizes_raw) if OmegaConf.is_list(sizes_raw) else [sizes_raw]
        if not sizes or not all(_is_int(b) and 1 <= b <= MAX_BATCH_SIZE for b in sizes):
            errors.append(
                f"batch_sizes={str(sizes)[:80]}: must be null or a non-empty list of integers in [1, {MAX_BATCH_SIZE}] "
                "(each slot holds a KV cache; e.g. batch_sizes=[1,2,4,8,16])"
            )
            sizes = []
    requests = cfg.get("batch_requests")
    if requests is not None:
        if not _is_int(requests) or not 1 <= requests <= MAX_BATCH_REQUESTS:
            errors.append(
                f"batch_requests={str(requests)[:40]!s}: must be null (twice the largest batch size) or an integer "
                f"in [1, {MAX_BATCH_REQUESTS}] (e.g. batch_requests=32)"
            )
        elif sizes and max(sizes) > requests:
            errors.append(
                f"batch_sizes has {max(sizes)} but batch_requests={requests}: a batch holds at most the requests of "
                f"a pass (raise batch_requests or lower batch_sizes)"
            )
    return errors


def check_settings(cfg: DictConfig) -> None:
    """The bench's own settings, before any model loads (a ValueError naming the fix; exit 2): zero passes or
    probes end in a median of nothing, and no prompts in a division by zero, after the pair has loaded."""
    errors = rule_errors("", cfg, _SETTINGS) + batch_errors(cfg) + workload_errors(cfg)
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
    settings = {k: v for k, v in _container(cfg).items() if k not in ("hydra", "pair")}
    errors += [e for e in check_numbers(settings, "") if e.split("=", 1)[0] not in said]
    if errors:
        raise ValueError("the bench cannot run: " + "; ".join(e.replace("seeds: ", "seed: ") for e in errors))


def bench_workload(cfg: DictConfig) -> Workload:
    """The bench's ``workload`` and ``slo`` (conf/workload/, bench.yaml), validated (a ValueError naming the fix)."""
    node, slo = cfg.get("workload"), cfg.get("slo")
    return Workload.from_config(
        _container(node) if node is not None else None, _container(slo) if slo is not None else None
    )


def workload_errors(cfg: DictConfig) -> list[str]:
    """A bad workload, before any model loads (``pipeline.measure.workload``); a serving run and the batch-size
    table are two benches."""
    try:
        workload = bench_workload(cfg)
        workload.check_slots(MAX_BATCH_SIZE, "the most slots an engine holds")
    except ValueError as err:
        return [str(err)]
    if not workload.offline and cfg.get("batch_sizes") is not None:
        return [
            "batch_sizes and workload are two benches (the batch-size table, the serving table): drop batch_sizes "
            "or workload=offline"
        ]
    return []


def _container(node: Any) -> dict[str, Any]:
    """A config mapping as a plain dict, interpolations resolved."""
    return cast(dict[str, Any], OmegaConf.to_container(node, resolve=True))


def generate_kwargs(cfg: DictConfig, mode: str, pad_token_id: int) -> dict[str, Any]:
    """transformers' ``generate()`` settings of the bench's peers in ``mode`` (batch 1 and batched alike)."""
    kwargs: dict[str, Any] = dict(max_new_tokens=cfg.max_new_tokens, pad_token_id=pad_token_id)
    if cfg.ignore_eos:
        kwargs.update(eos_token_id=None, min_new_tokens=cfg.max_new_tokens)
    if mode == "greedy":
        kwargs.update(do_sample=False, top_k=None, top_p=None, temperature=None)
    else:
        s = cfg.sampling
        kwargs.update(do_sample=True, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
    return kwargs


def check_batch_sizes(cfg: DictConfig, bench: Any) -> dict[str, str]:
    """Before any model loads: ``batch_sizes`` valid, and per method of ``methods`` why it cannot batch (its rows
    above batch 1 then say so); ``bench`` is the ``BenchPlan`` being built (its parameters and the pair's drafters)."""
    sizes = list(cfg.batch_sizes)
    if not sizes or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in sizes):
        raise ValueError(
            f"batch_sizes must be a non-empty list of integers >= 1, got {sizes} (e.g. batch_sizes=[1,2,4,8,16])"
        )
    skipped = {}
    for method in cfg.methods:
        values = check_method(method, bench.method_params(method, "sample"), drafters=bench.ctx)
        reason = method_args(method, values).capabilities.batch_refusal
        if reason and max(sizes) > 1:
            skipped[method] = reason
    return skipped


def _draft_length(value: Any, where: str) -> int:
    """A draft length as set: an integer >= 1, never rounded (``2.7`` ran as 2 and ``true`` as 1)."""
    if not _is_int(value) or value < 1:
        raise ValueError(f"{where}={value!r}: the draft length must be an integer >= 1 (e.g. {where}=4)")
    return int(value)


def check_prompts_fit(cfg: DictConfig, spec: PairSpec) -> None:
    """Before any model loads (its tokenizer alone): every prompt, encoded as the bench encodes it, with
    ``max_new_tokens`` after it within the target's context (read from its config, as the sweep reads it)."""
    context = context_length(_container(cfg.pair))
    if context is None:
        return
    tokenizer = load_tokenizer(spec.target)
    for i, prompt in enumerate(cfg.prompts):
        n = len(encode_prompt(tokenizer, str(prompt), spec.chat))
        if n + cfg.max_new_tokens > context:
            raise ValueError(
                f"prompts[{i}] ({n} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the context of pair "
                f"{spec.name!r}'s target ({context} positions): shorten the prompt or lower max_new_tokens"
            )


def check_draft_stops(cfg: DictConfig) -> list[str]:
    """``draft_stops``: the draft-length policies of the chain rows (``none``: fixed gamma, always run)."""
    stops = list(cfg.get("draft_stops") or ["none"])
    bad = [s for s in stops if s not in DRAFT_STOPS]
    if bad:
        raise ValueError(f"draft_stops has {bad}: choose from {list(DRAFT_STOPS)} (e.g. draft_stops=[none,confidence])")
    return stops


class BenchPlan:
    """What the bench will run, from its config, before any model loads: the drafters of the rows, the (method,
    drafter) combinations it skips and why, each method's parameters and draft length (``runners.Bench`` loads
    the pair and runs it)."""

    def __init__(self, cfg: DictConfig):
        check_settings(cfg)  # before any model loads
        self.cfg = cfg
        spec = PairSpec.from_config(_container(cfg.pair))
        ctx = drafter_context(spec)
        self.skipped: dict[tuple[str, str], str] = {}  # (method, drafter) -> why it is not run
        self.drafters: list[str] = []  # row labels: the drafter kinds
        # label -> the method's `drafter` value (a kind, or a scope with a path)
        self.drafter_values: dict[str, Any] = {}
        for entry in cfg.drafters:
            value: Any = OmegaConf.to_container(entry, resolve=True) if OmegaConf.is_config(entry) else entry
            d: Any = value.get("kind") if isinstance(value, dict) else value
            if d != PAIR and d not in DRAFTERS:
                raise ValueError(
                    f"unknown drafter {value!r} in drafters: choose from {PAIR}, {', '.join(DRAFTERS)} "
                    "(or {kind: ..., <its parameters>})"
                )
            if d == PAIR:  # the pair's drafter, resolved as the methods resolve it (eagle + an EAGLE-3 folder: eagle3)
                d = value = check_method(REFERENCE, {"drafter": PAIR}, drafters=ctx)["drafter"]["kind"]
            if DRAFTERS.get(d).asset == "draft" and not ctx.has_draft:
                raise ValueError(f"drafters has model but pair {spec.name!r} has no draft model")
            if (
                DRAFTERS.get(d).asset == "eagle"
                and not ctx.has_eagle
                and not (isinstance(value, dict) and value.get("path"))
            ):
                raise ValueError(
                    f"drafters has {d} but pair {spec.name!r} has no `eagle:` head (python -m pipeline.train_eagle, "
                    f"pair.eagle=<folder>, or {{kind: {d}, path: <folder>}})"
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
        # batch_sizes=[...]: the batch-size table instead (pipeline/bench/batched.py), its refusals before any
        # model loads
        self.batch_skipped = check_batch_sizes(cfg, self) if cfg.get("batch_sizes") else {}
        self.stops = check_draft_stops(cfg)
        check_energy_meter(cfg.get("energy_meter", "none"))  # before any model loads
        check_prompts_fit(cfg, spec)
        self.spec = spec

    def runs(self) -> list[tuple[str, str | None]]:
        """(method, drafter) of our rows: ar once, every other method with every drafter it can use."""
        out: list[tuple[str, str | None]] = []
        for m in self.cfg.methods:
            if "drafter" not in method_class(m).params:
                out.append((m, None))
            else:
                out += [(m, d) for d in self.drafters if (m, d) not in self.skipped]
        return out

    def adaptive_runs(self, mode: str = "sample") -> list[tuple[str, str | None, str]]:
        """(method, drafter, draft_stop) of the rows beside the fixed-gamma ones: every chain row of a method with
        ``draft_stop`` under every policy of ``draft_stops`` but ``none``."""
        return [
            (m, d, stop)
            for stop in self.stops
            if stop != "none"
            for m, d in self.runs()
            if "draft_stop" in method_class(m).params and self.is_chain(m, mode, d)
        ]

    def _mode_params(self, mode: str) -> dict[str, Any]:
        if mode == "greedy":
            return {"temperature": 0.0}
        return dict(_container(self.cfg.sampling))

    def gamma_of(self, method: str) -> int | None:
        """The draft length ``method`` runs with: ``gamma`` when set (every method's), else
        ``method_params.<method>.gamma``, else the method's own (``conf/method/<method>.yaml``, as a sweep
        runs it; the decoder's default without such a file); None for a method that takes none."""
        params = method_class(method).params
        if "gamma" not in params:
            return None
        if self.cfg.get("gamma") is not None:
            return _draft_length(self.cfg.gamma, "gamma")
        extra = OmegaConf.select(self.cfg, f"method_params.{method}.gamma", default=None)
        if extra is not None:
            return _draft_length(extra, f"method_params.{method}.gamma")
        conf = REPO_ROOT / "conf" / "method" / f"{method}.yaml"
        if conf.exists():
            value = (yaml.safe_load(conf.read_text()) or {}).get("gamma")
            if value is not None:
                return _draft_length(value, f"gamma of conf/method/{method}.yaml")
        return int(params["gamma"].default)

    def gammas(self) -> list[int]:
        """The distinct draft lengths of the chain rows (each needs its own t_verify)."""
        return sorted({self.chain_gamma(m) for m, d in self.runs() if m != "ar" and self.is_chain(m, "sample", d)})

    def chain_gamma(self, method: str) -> int:
        """``gamma_of`` a method that drafts (spd, a chain row's method): a ValueError for one that takes none."""
        gamma = self.gamma_of(method)
        if gamma is None:
            raise ValueError(f"method {method!r} takes no draft length (gamma)")
        return gamma

    def method_params(
        self, method: str, mode: str, drafter: str | None = None, stop: str | None = None
    ) -> dict[str, Any]:
        """Warping of ``mode``, ``gamma`` for methods that take it, then ``method_params.<method>``, then
        ``drafter``, then ``draft_stop`` of an adaptive row."""
        params = self._mode_params(mode)
        gamma = self.gamma_of(method)
        if gamma is not None:
            params["gamma"] = gamma
        extra = OmegaConf.select(self.cfg, f"method_params.{method}", default=None)
        if extra:
            params.update({k: v for k, v in _container(extra).items() if k != "gamma"})  # gamma: gamma_of
        if drafter is not None:
            params["drafter"] = self.drafter_values.get(drafter, drafter)
        if stop is not None:
            params["draft_stop"] = stop
        elif "draft_stop" not in params:  # draft_threshold / *_cost tune the adaptive rows, not the fixed one
            params = {k: v for k, v in params.items() if k not in ("draft_threshold", "draft_cost", "verify_cost")}
        return params

    def is_chain(self, method: str, mode: str, drafter: str | None = None) -> bool:
        """A chain of gamma draft tokens verified in one target pass: the bound applies (mtad with a
        draft model drafts beams: it is counted as a chain of its best beam, as before)."""
        values = check_method(method, self.method_params(method, mode, drafter), drafters=self.ctx)
        return method_args(method, values).capabilities.draft_shape == "chain"  # the configured method's
