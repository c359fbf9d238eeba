"""What a cell's window yields: its protocol, its per-generation records and the window's result with its flat
summary; the predictions handed to scoring and the per-request latency metrics (docs/DESIGN.md section 5).

The window itself (``run_window``, at every batch size) is ``pipeline.measure.window``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from pipeline.decoding.phase_clock import Iteration
from pipeline.measure.acceptance import records_metrics
from pipeline.measure.costs import cost_model, step_drift
from pipeline.measure.energy import EnergyReading, IdleReading, energy_summary
from pipeline.measure.workload import PERCENTILES, Workload, latency_metrics, percentiles, serving_metrics


@dataclass(frozen=True)
class Protocol:
    """The measurement protocol's settings, with their one default (``measure:`` of conf/config.yaml
    repeats these values for Hydra's overrides; tests/test_measure.py holds the two equal)."""

    warmup_generations: int = 3  # at least this many warm-up generations on samples outside the slice ...
    warmup_seconds: float = 10.0  # ... and at least this long
    warmup_samples: int = 3  # how many samples after the slice the warm-up uses
    idle_seconds: float = 10.0  # idle power with the models resident (only with an energy meter)
    energy_meter: str = "auto"  # auto | nvml | rapl | zeus | none, or nvml+zeus (a reference meter beside)
    perplexity: bool = True  # teacher-forced target pass after the window
    score: bool = True  # run the task's scorer
    threads: int | None = None  # torch intra-op threads; None: what the cell's isolation holds
    costs: bool = True  # time the drafter's and the target's steps after the window (Leviathan's c)

    @classmethod
    def from_config(cls, measure: dict[str, Any] | None) -> Protocol:
        """The protocol of a ``measure:`` mapping (keys it does not set keep their default)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in (measure or {}).items() if k in names and v is not None or k == "threads"})


PROTOCOL = Protocol()


@dataclass
class GenerationRecord:
    """One generation (one turn of one sample)."""

    id: str
    turn: int
    prompt_style: str
    prompt_text: str
    prompt_ids: list[int]
    tokens: list[int]
    new_tokens: int
    steps: int
    draft_steps: int
    accepted: list[int]
    decode_s: float
    hit_eos: bool
    answer_prefix: str = ""
    text: str | None = None  # detokenised after the window
    prediction: str | None = None  # answer_prefix + text cut at a stop string: what a scorer gets
    counted_tokens: int | None = None  # tokens up to the stop string (new_tokens without one)
    category: str | None = None  # the sample's category (per-category reports, Spec-Bench export)
    drafted: list[int] = field(
        default_factory=list
    )  # per iteration: draft positions put to the target (speculative methods)
    prefill_s: float = 0.0  # the part of decode_s spent writing the prompt into the caches (Decoder.prefill_seconds)
    # batch > 1 (run_window's batch_size): decode_s is the request's time in a slot; before it, its wait for one
    queue_s: float | None = None  # from the window's start (or its previous turn's end) to taking a slot
    ttft_s: float | None = None  # from taking a slot to its first token
    # a workload's window (pipeline.measure.workload): when the request arrived, seconds after the window opened (its
    # queue_s is then from its arrival); None offline
    arrival_s: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tokens_per_s"] = self.tokens_per_s
        return out


@dataclass
class WindowResult:
    """Everything measured in one cell's window; ``summary()`` gives the flat metrics."""

    records: list[GenerationRecord]
    window_s: float
    decode_s: float
    samples_total: int
    samples_finished: int
    time_budget_s: float | None
    budget_exhausted: bool
    warmup: dict[str, Any]
    energy: EnergyReading
    idle: IdleReading | None
    peak_memory: dict[str, Any]
    device: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)
    probe: dict[str, float] = field(default_factory=dict)  # probe_before_ms / probe_after_ms (run_window's ``probe``)
    iterations: list[Iteration] = field(default_factory=list)  # the loop's clock over the window (``phase_clock``)
    calibration: list[Iteration] = field(default_factory=list)  # the warm-up's (the calibration schedule)
    clock_transitions: int = 0  # the clock's reads over the window (its own cost: this many reads)

    def costs(self) -> dict[str, float]:
        """The cost model and time breakdown of the window, from its iterations (``costs.cost_model``), with
        ``step_drift`` / ``disturbed`` (did the window's own step move: ``costs.step_drift``), and
        ``tokens_per_target_step``: tokens/s in units of the window's own plain target step (a machine uniformly
        slower or faster leaves it, and a speedup formed from it, unchanged)."""
        if not self.iterations:
            return {}
        batch = int(self.settings.get("batch_size", 1) or 1)
        probes = [v for v in self.probe.values() if v is not None and math.isfinite(v) and v > 0]
        hint = sum(probes) / len(probes) / 1e3 if probes and batch == 1 else None
        model = cost_model(self.iterations, batch, self.calibration, step_hint_s=hint)
        model.update(
            step_drift(
                self.iterations,
                model["row_slope_ms"],
                batch,
                [self.probe.get("probe_before_ms"), self.probe.get("probe_after_ms")],
            )
        )
        tokens = sum(r.new_tokens for r in self.records)
        t_step = model["t_target_step_ms"] / 1e3
        model["tokens_per_target_step"] = tokens / self.decode_s * t_step if self.decode_s > 0 else math.nan
        model["clock_transitions"] = float(self.clock_transitions)
        return model

    def summary(self) -> dict[str, Any]:
        recs = self.records
        tokens = sum(r.new_tokens for r in recs)
        steps = sum(r.steps for r in recs)
        prefill_s = sum(r.prefill_s for r in recs)
        per_sample_rates = [r.tokens_per_s for r in recs if r.decode_s > 0]
        per_sample_accept = [r.new_tokens / r.steps for r in recs if r.steps > 0]
        out: dict[str, Any] = {
            "generations": len(recs),
            "samples_total": self.samples_total,
            "samples_finished": self.samples_finished,
            "budget_exhausted": self.budget_exhausted,
            "time_budget_s": self.time_budget_s,
            "new_tokens": tokens,
            "counted_tokens": sum(r.counted_tokens if r.counted_tokens is not None else r.new_tokens for r in recs),
            "window_s": self.window_s,
            "decode_s": self.decode_s,
            "other_in_window_s": self.window_s - self.decode_s,
            "tokens_per_s": tokens / self.decode_s if self.decode_s > 0 else float("nan"),
            "tokens_per_s_window": tokens / self.window_s if self.window_s > 0 else float("nan"),
            # decode rate without the prompts' prefill (the bench's prompts are short; a task's may not be)
            "prefill_s": prefill_s,
            "tokens_per_s_decode": tokens / (self.decode_s - prefill_s) if self.decode_s > prefill_s else float("nan"),
            "tokens_per_s_mean_of_samples": _mean(per_sample_rates),
            "target_steps": steps,
            "draft_steps": sum(r.draft_steps for r in recs),
            "prefills": len(recs),
            "accepted_per_step": tokens / steps if steps > 0 else float("nan"),
            "accepted_per_step_mean_of_samples": _mean(per_sample_accept),
            "warmup_generations": self.warmup.get("generations"),
            "warmup_s": self.warmup.get("seconds"),
            **{f"peak_memory_{k}": v for k, v in self.peak_memory.items()},
            **self.probe,
        }
        out.update(energy_summary(self.energy, self.idle, tokens))
        out.update(self.costs())
        # acceptance in vLLM / Spec-Bench conventions, pooled and per request (pipeline.measure.acceptance)
        out.update(records_metrics(recs, self.settings.get("draft_length")))
        if self.settings.get("workload"):  # a workload's window: latency from arrival, throughput, goodput, occupancy
            out.update(serving_metrics(recs, Workload.from_dict(self.settings["workload"])))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "energy": self.energy.to_dict(),
            "idle": self.idle.to_dict() if self.idle else None,
            "warmup": self.warmup,
            "device": self.device,
            "settings": self.settings,
            "records": [r.to_dict() for r in self.records],
        }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def sample_seed(seed: int, sample_id: str, turn: int) -> int:
    """A 63-bit seed for one generation, independent of order, slice and warm-up."""
    digest = hashlib.sha256(f"{seed}\x00{sample_id}\x00{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def cut_at_stop(
    tokenizer: Any, tokens: Sequence[int], stop_strings: Sequence[str], skip_special_tokens: bool = True
) -> tuple[str, int]:
    """Text up to the first stop string, and the number of tokens needed to produce it (stop included)."""
    text = tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)
    positions = [text.find(s) for s in stop_strings if s and text.find(s) >= 0]
    if not positions:
        return text, len(tokens)
    cut = min(positions)
    stop_end = cut + next(len(s) for s in stop_strings if s and text.find(s) == cut)
    # the shortest token prefix whose text reaches the end of the stop string
    lo, hi = 1, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(list(tokens[:mid]), skip_special_tokens=skip_special_tokens)) >= stop_end:
            hi = mid
        else:
            lo = mid + 1
    return text[:cut], lo


def predictions(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per-sample predictions in the scorers' JSONL shape (multi-turn samples: the list of answers), from record
    dicts (``GenerationRecord.to_dict()`` or a logged samples.jsonl line: ``id``, ``turn``, ``prediction``,
    ``prompt_style``)."""
    by_id: dict[str, list[Mapping[str, Any]]] = {}
    for rec in records:
        by_id.setdefault(str(rec["id"]), []).append(rec)
    out = []
    for sid, recs in by_id.items():
        recs = sorted(recs, key=lambda r: int(r.get("turn") or 0))
        prediction: Any = recs[0]["prediction"] if len(recs) == 1 else [r["prediction"] for r in recs]
        out.append({"id": sid, "prediction": prediction, "format": recs[0].get("prompt_style")})
    return out


def predictions_for_scoring(result: WindowResult) -> list[dict[str, Any]]:
    """``predictions`` of a window's records."""
    return predictions(
        {"id": r.id, "turn": r.turn, "prediction": r.prediction, "prompt_style": r.prompt_style} for r in result.records
    )


def _percentiles(values: Sequence[float], name: str) -> dict[str, float]:
    return percentiles(values, PERCENTILES, name)


def request_metrics(records: Sequence[GenerationRecord]) -> dict[str, float]:
    """Per-request latency metrics of a window, at any batch size: percentiles of the latency in a slot
    (``latency_s``: ``decode_s``), of the time per output token after the first (``tpot_ms``), of the time to the
    first token (``ttft_s``; at batch 1 the prompt's prefill plus one step) and of the wait for a slot (``queue_s``).
    Records of a workload's window (``arrival_s`` set) measure ``ttft_s`` and ``queue_s`` from each request's arrival
    and add ``e2e_s`` (``pipeline.measure.workload.latency_metrics``)."""
    if records and all(r.arrival_s is not None for r in records):
        return {**_percentiles([r.decode_s for r in records], "latency_s"), **latency_metrics(records)}
    tpot, ttft = [], []
    for r in records:
        first = r.ttft_s if r.ttft_s is not None else (r.prefill_s + (r.decode_s - r.prefill_s) / max(r.steps, 1))
        ttft.append(first)
        if r.new_tokens > 1:
            tpot.append(1e3 * (r.decode_s - first) / (r.new_tokens - 1))
    out = {
        **_percentiles([r.decode_s for r in records], "latency_s"),
        **_percentiles(tpot, "tpot_ms"),
        **_percentiles(ttft, "ttft_s"),
    }
    out.update(_percentiles([r.queue_s or 0.0 for r in records], "queue_s"))
    return out
