"""The measurement window of a cell with ``batch_size > 1`` (docs/DESIGN.md section 5, batched).

The protocol of ``measure.run_window`` (prompts formatted before the window, warm-up, idle power, one timed and
metered window, stop strings and detokenisation after it), with the samples decoded ``batch_size`` at a time by
the batched engine (``decoding/batched.py``): every request is in the queue at the window's start (an offline
batch), a finished request's slot takes the next one at once, and a multi-turn sample's next turn joins the
queue when its previous turn ends (formatted then, off no clock: the batch goes on meanwhile).

Per request: ``decode_s`` is its time in a slot (its latency once admitted), ``queue_s`` its wait for a slot,
``ttft_s`` its time to the first token. ``decode_s`` of the window is the engine's wall time (formatting of
later turns excluded), so ``tokens_per_s`` is the throughput over all requests. Randomness: each request's
generator is seeded from ``(seed, sample id, turn)`` as at batch 1, so its tokens do not depend on its companions.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any, Callable, Sequence

import numpy as np
import torch

from pipeline.data import format_sample
from pipeline.data.base import Sample
from pipeline.decoding.batched import BatchedDecoder, BatchedGeneration, BatchRequest
from pipeline.decoding.warping import make_generator
from pipeline.device import environment_info, peak_memory, reset_peak_memory, synchronize
from pipeline.energy import EnergyMeter, NullMeter
from pipeline.measure import (
    PROTOCOL,
    Formatter,
    GenerationRecord,
    WindowResult,
    _draft_length,
    cut_at_stop,
    sample_seed,
)

PERCENTILES = (50, 90, 99)


def warm_up_batched(
    engine: BatchedDecoder,
    prompts: Sequence[list[int]],
    *,
    device,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    seed: int,
    min_generations: int,
    min_seconds: float,
) -> dict[str, Any]:
    """Batches of ``batch_size`` warm-up prompts (cycled) until both minimums are met."""
    if not prompts or (min_generations <= 0 and min_seconds <= 0):
        return {"generations": 0, "seconds": 0.0}
    start, count = time.perf_counter(), 0
    while count < min_generations or time.perf_counter() - start < min_seconds:
        batch = [list(prompts[(count + i) % len(prompts)]) for i in range(engine.batch_size)]
        gens = [make_generator(sample_seed(seed, "__warmup__", count + i), device) for i in range(len(batch))]
        engine.generate(batch, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids, generators=gens)
        synchronize(device)
        count += len(batch)
    return {"generations": count, "seconds": time.perf_counter() - start}


def run_window_batched(
    decoder: Any,
    samples: Sequence[Sample],
    *,
    batch_size: int,
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
    """``measure.run_window`` with ``batch_size`` requests decoding together (see the module doc); ``probe`` as there
    (the machine's speed right before and after the window)."""
    if formatter is None:
        if chat is None:
            raise ValueError("pass `chat` (the pair's prompt style) or a `formatter`")

        def formatter(sample: Sample, turn: int, answers: Sequence[str]):
            return format_sample(sample, tokenizer, chat=chat, turn=turn, answers=answers)

    engine = BatchedDecoder(decoder, batch_size)
    device = torch.device(device)
    meter = meter or NullMeter("no energy meter given")
    eos = [int(t) for t in eos_token_ids]
    first_prompts = [formatter(s, 0, ()) for s in samples]
    warm_prompts = [formatter(s, 0, ()).input_ids for s in warmup_samples]
    on_measured = False
    if not warm_prompts:
        warm_prompts, on_measured = [p.input_ids for p in first_prompts[:3]], True
    warm = warm_up_batched(
        engine,
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

    records: list[tuple[int, int, GenerationRecord]] = []
    answers: dict[int, list[str]] = {}
    queue: deque = deque()
    state = {"next": 0, "open": 0, "exhausted": False, "off_clock": 0.0, "finished": 0}
    ready: dict[int, float] = {}  # request id -> when it joined the queue

    def turns(i: int) -> int:
        n = samples[i].num_turns
        return n if max_turns is None else min(n, max_turns)

    def enqueue(i: int, turn: int, prompt) -> None:
        rid = len(ready)
        ready[rid] = time.perf_counter()
        queue.append(
            BatchRequest(
                prompt.input_ids,
                max_new_tokens,
                make_generator(sample_seed(seed, samples[i].id, turn), device),
                tag=(i, turn, prompt, rid),
            )
        )
        state["open"] += 1

    def top_up() -> None:  # new samples while slots would idle, until the slice or the budget ends
        while state["open"] < batch_size and state["next"] < len(samples):
            if time_budget_s is not None and time.perf_counter() - window_t0 >= time_budget_s:
                state["exhausted"] = True
                return
            i = state["next"]
            state["next"] += 1
            enqueue(i, 0, first_prompts[i])

    def finish(request: BatchRequest, gen: BatchedGeneration) -> None:
        t0 = time.perf_counter()
        i, turn, prompt, rid = request.tag
        state["open"] -= 1
        sample = samples[i]
        records.append(
            (
                i,
                turn,
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
                    decode_s=gen.finished_at - gen.admitted_at,
                    hit_eos=bool(gen.tokens) and gen.tokens[-1] in eos,
                    answer_prefix=prompt.answer_prefix,
                    category=sample.category,
                    drafted=list(gen.drafted),
                    queue_s=gen.admitted_at - ready[rid],
                    ttft_s=gen.first_token_at - gen.admitted_at,
                ),
            )
        )
        if turn + 1 < turns(i):
            answers.setdefault(i, []).append(tokenizer.decode(gen.tokens, skip_special_tokens=True))
            enqueue(i, turn + 1, formatter(sample, turn + 1, answers[i]))
        else:
            state["finished"] += 1
        top_up()
        state["off_clock"] += time.perf_counter() - t0

    reset_peak_memory(device)
    synchronize(device)
    meter.start()
    window_t0 = time.perf_counter()
    top_up()
    engine.run(queue, eos_token_ids=eos, on_finish=finish)
    synchronize(device)
    window_s = time.perf_counter() - window_t0
    reading = meter.stop()
    memory = peak_memory(device)
    if probe is not None:
        probes["probe_after_ms"] = float(probe())

    out = [rec for *_, rec in sorted(records, key=lambda r: (r[0], r[1]))]
    for rec in out:
        text, counted = (
            cut_at_stop(tokenizer, rec.tokens, stop_strings)
            if stop_strings
            else (tokenizer.decode(rec.tokens, skip_special_tokens=True), rec.new_tokens)
        )
        rec.text = tokenizer.decode(rec.tokens, skip_special_tokens=True)
        rec.prediction = rec.answer_prefix + text
        rec.counted_tokens = counted
    return WindowResult(
        records=out,
        window_s=window_s,
        decode_s=window_s - state["off_clock"],
        samples_total=len(samples),
        samples_finished=state["finished"],
        time_budget_s=time_budget_s,
        budget_exhausted=state["exhausted"],
        warmup=warm,
        energy=reading,
        idle=idle,
        peak_memory=memory,
        device=environment_info(device),
        probe=probes,
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
            "batch_size": batch_size,
        },
    )


def _percentiles(values: Sequence[float], name: str) -> dict[str, float]:
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    return {f"{name}_p{q}": float(np.percentile(arr, q)) if arr.size else math.nan for q in PERCENTILES}


def request_metrics(records: Sequence[GenerationRecord]) -> dict[str, float]:
    """Per-request latency metrics of a window, at any batch size: percentiles of the latency in a slot
    (``latency_s``: ``decode_s``), of the time per output token after the first (``tpot_ms``), of the time to the
    first token (``ttft_s``; at batch 1 the prompt's prefill plus one step) and of the wait for a slot (``queue_s``)."""
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
