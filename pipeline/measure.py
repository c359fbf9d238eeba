"""The measurement window of one cell (docs/DESIGN.md section 5).

    result = run_window(decoder, samples, tokenizer=tok, chat=True, eos_token_ids=[2],
                        max_new_tokens=128, seed=0, device="cuda", meter=make_energy_meter("cuda"),
                        warmup_samples=held_out, time_budget_s=600)

Protocol:

1. Prompts are formatted and tokenised before the window (first turns; a later turn of a multi-turn
   sample needs the previous answer, so it is formatted inside the window, off the decode clock).
2. Warm-up on samples that are not measured: at least ``warmup_generations`` and ``warmup_seconds``.
3. Idle power with the models resident (``idle_seconds``), when an energy meter is available.
4. One window over the slice: synchronise the device, read ``perf_counter`` and the energy counter;
   decode every sample; synchronise; read both again. Each ``generate`` call is bracketed by its own
   synchronisation, so ``decode_s`` (the sum of those intervals) is decode time only and
   ``window_s - decode_s`` is everything else that happened inside the window.
5. Tokens are the generated ids as the decoder returns them (cut at the first EOS, EOS included),
   counted the same way for every method; rates and J/token use them. Stop strings (continuation
   prompts) are applied after the window: they cut the text handed to scoring and give
   ``counted_tokens``, a separate column.
6. A time budget (the papers' fixed-time runs) stops starting new samples once the window has lasted
   ``time_budget_s``; how many finished is recorded.
7. Detokenisation, perplexity and scoring happen after the window.
8. The machine's speed just before and just after the window (``probe``: the target's single-token step on
   a fixed prompt, ``probe_step_ms``): compared with the pair's step calibrated at the start of the sweep
   (``disturbance``), it tells a cell measured while something else loaded the machine.

Randomness: each generation gets its own generator seeded from ``(seed, sample id, turn)``, so a
sample's output does not depend on the warm-up, the slice or the budget.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch

from pipeline.acceptance import records_metrics
from pipeline.data import format_sample
from pipeline.data.base import Prompt, Sample
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.warping import make_generator
from pipeline.device import environment_info, peak_memory, reset_peak_memory, synchronize
from pipeline.energy import EnergyMeter, EnergyReading, IdleReading, NullMeter, energy_summary

Formatter = Callable[[Sample, int, Sequence[str]], Prompt]


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
    # batch > 1 (measure_batched.py): decode_s is the request's time in a slot; before it, its wait for one
    queue_s: float | None = None  # from the window's start (or its previous turn's end) to taking a slot
    ttft_s: float | None = None  # from taking a slot to its first token

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
        # acceptance in vLLM / Spec-Bench conventions, pooled and per request (pipeline.acceptance)
        out.update(records_metrics(recs, self.settings.get("draft_length")))
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


def _draft_length(decoder: Any) -> int | None:
    """The chain length gamma a draft-verify decoder drafts per iteration (None for other methods)."""
    gamma = getattr(getattr(decoder, "args", None), "gamma", None)
    if gamma is None and getattr(decoder, "draft_shape", None) == "chain":
        gamma = decoder.draft_length()  # a chain budget of another name (bild: max_small_steps)
    return int(gamma) if isinstance(gamma, int) and not isinstance(gamma, bool) else None


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def sample_seed(seed: int, sample_id: str, turn: int) -> int:
    """A 63-bit seed for one generation, independent of order, slice and warm-up."""
    digest = hashlib.sha256(f"{seed}\x00{sample_id}\x00{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


# --------------------------------------------------------------------------- stop strings


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


# --------------------------------------------------------------------------- the window


def _generate_timed(decoder: Any, input_ids: list[int], device, max_new_tokens: int, eos, generator):
    synchronize(device)
    t0 = time.perf_counter()
    gen = decoder.generate(input_ids, max_new_tokens=max_new_tokens, eos_token_ids=eos, generator=generator)
    synchronize(device)
    return gen, time.perf_counter() - t0


def warm_up(
    decoder: Any,
    prompts: Sequence[list[int]],
    *,
    device,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    seed: int,
    min_generations: int = PROTOCOL.warmup_generations,
    min_seconds: float = PROTOCOL.warmup_seconds,
) -> dict[str, Any]:
    """Generate on ``prompts`` (cycled) until both minimums are met."""
    if not prompts or (min_generations <= 0 and min_seconds <= 0):
        return {"generations": 0, "seconds": 0.0}
    start, count = time.perf_counter(), 0
    while count < min_generations or time.perf_counter() - start < min_seconds:
        generator = make_generator(sample_seed(seed, "__warmup__", count), device)
        _generate_timed(decoder, list(prompts[count % len(prompts)]), device, max_new_tokens, eos_token_ids, generator)
        count += 1
    return {"generations": count, "seconds": time.perf_counter() - start}


def run_window(
    decoder: Any,
    samples: Sequence[Sample],
    *,
    tokenizer: Any,
    eos_token_ids: Sequence[int],
    max_new_tokens: int,
    seed: int,
    device: torch.device | str = "cpu",
    chat: bool | None = None,
    formatter: Formatter | None = None,
    meter: EnergyMeter | None = None,
    warmup_samples: Sequence[Sample] = (),
    warmup_generations: int = PROTOCOL.warmup_generations,
    warmup_seconds: float = PROTOCOL.warmup_seconds,
    idle_seconds: float = PROTOCOL.idle_seconds,
    time_budget_s: float | None = None,
    stop_strings: Sequence[str] = (),
    max_turns: int | None = None,
    probe: Callable[[], float] | None = None,
) -> WindowResult:
    """Warm up, measure idle power, then decode ``samples`` inside one timed, metered window.

    ``formatter(sample, turn, previous_answers) -> Prompt`` builds prompts (default: the dataset's
    own formatting via ``pipeline.data.format_sample`` with ``chat``). Multi-turn samples are answered
    turn by turn (``max_turns`` caps them). Without warm-up samples the warm-up reuses the first
    samples' prompts (recorded as ``warmup.on_measured_samples``). ``probe()`` (milliseconds, e.g.
    ``probe_step_ms`` of the target) runs right before the window opens and right after it closes, outside it:
    the summary's ``probe_before_ms`` and ``probe_after_ms``.
    """
    if formatter is None:
        if chat is None:
            raise ValueError("pass `chat` (the pair's prompt style) or a `formatter`")

        def formatter(sample: Sample, turn: int, answers: Sequence[str]) -> Prompt:
            return format_sample(sample, tokenizer, chat=chat, turn=turn, answers=answers)

    device = torch.device(device)
    meter = meter or NullMeter("no energy meter given")
    eos = [int(t) for t in eos_token_ids]

    # 1. first-turn prompts, outside the window
    first_prompts = [formatter(s, 0, ()) for s in samples]
    warm_source = list(warmup_samples)
    warm_prompts = [formatter(s, 0, ()).input_ids for s in warm_source]
    on_measured = False
    if not warm_prompts:
        warm_prompts, on_measured = [p.input_ids for p in first_prompts[:3]], True

    # 2. warm-up, 3. idle power
    warm = warm_up(
        decoder,
        warm_prompts,
        device=device,
        max_new_tokens=max_new_tokens,
        eos_token_ids=eos,
        seed=seed,
        min_generations=warmup_generations,
        min_seconds=warmup_seconds,
    )
    warm["on_measured_samples"] = on_measured
    synchronize(device)
    idle = meter.measure_idle(idle_seconds) if (meter.available and idle_seconds > 0) else None
    probes = {"probe_before_ms": float(probe())} if probe is not None else {}

    # 4. the window
    records: list[GenerationRecord] = []
    finished, exhausted, decode_s = 0, False, 0.0
    reset_peak_memory(device)
    synchronize(device)
    meter.start()
    window_t0 = time.perf_counter()
    for sample, first in zip(samples, first_prompts):
        if time_budget_s is not None and time.perf_counter() - window_t0 >= time_budget_s:
            exhausted = True
            break
        answers: list[str] = []
        n_turns = sample.num_turns if max_turns is None else min(sample.num_turns, max_turns)
        for turn in range(n_turns):
            prompt = first if turn == 0 else formatter(sample, turn, answers)  # off the decode clock
            generator = make_generator(sample_seed(seed, sample.id, turn), device)
            gen, dt = _generate_timed(decoder, prompt.input_ids, device, max_new_tokens, eos, generator)
            decode_s += dt
            records.append(
                GenerationRecord(
                    id=sample.id,
                    turn=turn,
                    prompt_style=prompt.style,
                    prompt_text=prompt.text,
                    prompt_ids=list(prompt.input_ids),
                    tokens=list(gen.tokens),
                    new_tokens=len(gen.tokens),
                    steps=gen.steps,
                    draft_steps=gen.draft_steps,
                    accepted=list(gen.accepted),
                    decode_s=dt,
                    hit_eos=bool(gen.tokens) and gen.tokens[-1] in eos,
                    answer_prefix=prompt.answer_prefix,
                    category=sample.category,
                    drafted=list(gen.drafted),
                    prefill_s=float(getattr(decoder, "prefill_seconds", lambda: 0.0)()),
                )
            )
            if turn + 1 < n_turns:
                answers.append(tokenizer.decode(gen.tokens, skip_special_tokens=True))
        finished += 1
    synchronize(device)
    window_s = time.perf_counter() - window_t0
    reading = meter.stop()
    memory = peak_memory(device)
    if probe is not None:
        probes["probe_after_ms"] = float(probe())

    # 7. after the window: detokenise, cut at stop strings
    for rec in records:
        text, counted = (
            cut_at_stop(tokenizer, rec.tokens, stop_strings)
            if stop_strings
            else (tokenizer.decode(rec.tokens, skip_special_tokens=True), rec.new_tokens)
        )
        rec.text = tokenizer.decode(rec.tokens, skip_special_tokens=True)
        rec.prediction = rec.answer_prefix + text
        rec.counted_tokens = counted

    return WindowResult(
        records=records,
        window_s=window_s,
        decode_s=decode_s,
        samples_total=len(samples),
        samples_finished=finished,
        time_budget_s=time_budget_s,
        budget_exhausted=exhausted,
        warmup=warm,
        energy=reading,
        idle=idle,
        peak_memory=memory,
        device=environment_info(device),
        settings={
            "max_new_tokens": max_new_tokens,
            "seed": seed,
            "eos_token_ids": eos,
            "stop_strings": list(stop_strings),
            "meter": meter.info(),
            "idle_seconds": idle_seconds,
            "warmup_generations_min": warmup_generations,
            "warmup_seconds_min": warmup_seconds,
            "draft_length": _draft_length(decoder),
        },
        probe=probes,
    )


def step_times(
    model: Any, prompt: Sequence[int], gamma: int, device: torch.device | str, reps: int = 20
) -> tuple[float, float]:
    """Median single-token step time and median (gamma + 1)-token forward time, batch 1, with a KV cache.

    The costs behind Leviathan's bound (t_ar or t_draft, and t_verify); measured outside any window.
    """
    device = torch.device(device)
    prompt = list(prompt)
    cm = CachedModel(model)
    single: list[float] = []
    block: list[float] = []
    with torch.inference_mode():
        cm.prefill(prompt)
        length = cm.length
        for _ in range(reps):
            for keep, out in ((1, single), (gamma + 1, block)):
                synchronize(device)
                t0 = time.perf_counter()
                cm.forward(prompt[-keep:], keep=keep)
                synchronize(device)
                out.append(time.perf_counter() - t0)
                cm.rollback(length)
    return statistics.median(single), statistics.median(block)


def step_costs(
    target: Any, draft: Any, prompt: Sequence[int], gamma: int, device: torch.device | str, reps: int = 20
) -> dict[str, float]:
    """Leviathan's costs in seconds: ``t_ar`` and ``t_draft`` (single-token steps of target and draft)
    and ``t_verify`` (one target forward of gamma + 1 tokens), medians of ``reps``."""
    t_ar, t_verify = step_times(target, prompt, gamma, device, reps=reps)
    t_draft, _ = step_times(draft, prompt, gamma, device, reps=reps)
    return {"t_ar": t_ar, "t_draft": t_draft, "t_verify": t_verify}


def drafter_costs(decoder: Any, prompt: Sequence[int], device: torch.device | str, reps: int = 10) -> dict[str, float]:
    """Leviathan's costs of a draft-based decoder, each drafter its own: ``t_ar`` and ``t_verify`` of the
    target (as ``step_costs``) and ``t_draft``, the decoder's drafter's own cost of one draft token
    (``Drafter.step_cost``: a draft-model step, an EAGLE head step with its LM-head row, one n-gram lookup
    per token), with the gamma of the decoder (its tree depth for tree methods)."""
    gamma = _draft_length(decoder) or int(getattr(decoder, "tree_depth", 1))
    t_ar, t_verify = step_times(decoder.target.model, prompt, gamma, device, reps=reps)
    t_draft = decoder.drafter_impl.step_cost(
        decoder.target, list(prompt), gamma, decoder.warper, reps=reps, sync=lambda: synchronize(device)
    )
    return {"t_ar": t_ar, "t_draft": t_draft, "t_verify": t_verify}


# --------------------------------------------------------------------------- the machine's speed

PROBE_TOKENS = 32  # the probe's prompt: ids 1..32 (modulo the vocabulary), the same probe everywhere
DISTURBED_SLOWDOWN = 1.5  # a probe this many times the calibrated step: the machine was disturbed


def probe_step_ms(model: Any, device: torch.device | str, reps: int = 10) -> float:
    """The target's single-token step after a fixed ``PROBE_TOKENS``-token prompt (median of ``reps``,
    milliseconds): the machine's speed as the pair sees it, comparable between the sweep's calibration and
    every cell of the pair."""
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or PROBE_TOKENS + 1)
    prompt = [1 + i % (vocab - 1) for i in range(PROBE_TOKENS)] if vocab > 1 else [0] * PROBE_TOKENS
    return 1e3 * step_times(model, prompt, 1, device, reps=reps)[0]


def disturbance(
    probes_ms: Sequence[float], calibrated_ms: float, threshold: float = DISTURBED_SLOWDOWN
) -> dict[str, float]:
    """``step_slowdown`` (the slowest probe over the calibrated step) and ``disturbed`` (1.0 when it is at
    least ``threshold``, else 0.0); NaN for both without a finite calibration or probe."""
    values = [float(v) for v in probes_ms if v is not None and math.isfinite(float(v)) and float(v) > 0]
    if not values or not (calibrated_ms is not None and math.isfinite(calibrated_ms) and calibrated_ms > 0):
        return {"step_slowdown": math.nan, "disturbed": math.nan}
    slowdown = max(values) / float(calibrated_ms)
    return {"step_slowdown": slowdown, "disturbed": 1.0 if slowdown >= threshold else 0.0}


def predictions_for_scoring(result: WindowResult) -> list[dict[str, Any]]:
    """Per-sample predictions in the scorers' JSONL shape (multi-turn samples: the list of answers)."""
    by_id: dict[str, list[GenerationRecord]] = {}
    for rec in result.records:
        by_id.setdefault(rec.id, []).append(rec)
    out = []
    for sid, recs in by_id.items():
        recs.sort(key=lambda r: r.turn)
        prediction: Any = recs[0].prediction if len(recs) == 1 else [r.prediction for r in recs]
        out.append({"id": sid, "prediction": prediction, "format": recs[0].prompt_style})
    return out
