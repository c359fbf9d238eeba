"""The measurement window of one cell, at every batch size (docs/DESIGN.md section 5).

    result = run_window(decoder, samples, tokenizer=tok, chat=True, eos_token_ids=[2],
                        max_new_tokens=128, seed=0, device="cuda", meter=make_energy_meter("cuda"),
                        warmup_samples=held_out, time_budget_s=600)

Protocol:

1. Prompts are formatted and tokenised before the window (first turns; a later turn of a multi-turn
   sample needs the previous answer, so it is formatted inside the window, off the decode clock).
2. Warm-up on samples that are not measured: at least ``warmup_generations`` and ``warmup_seconds``.
3. Idle power with the models resident (``idle_seconds``), when an energy meter is available.
4. One window over the slice: synchronise the device, read ``perf_counter`` and the energy counter;
   decode every sample; synchronise; read both again. ``decode_s`` is the time requests spent decoding (below),
   so ``window_s - decode_s`` is everything else that happened inside the window.
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
sample's output does not depend on the warm-up, the slice, the budget or its companions.

Batch size: one window for every ``batch_size``. The samples are decoded by the loop (``decoding/batched.py``, chains
and trees) ``batch_size`` at a time: every request is in the queue at the window's start (an offline batch), a
finished request's slot takes the next one at once, and a multi-turn sample's next turn joins the queue
when its previous turn ends (formatted then, off the decode clock). Per request: ``decode_s`` is its time in a slot
(its latency once admitted; at batch 1 its ``generate`` time), ``prefill_s`` the part spent writing its prompt
into the caches (batch 1; at batch > 1 a prompt rides in its first step), ``queue_s`` its wait for a slot,
``ttft_s`` its time to the first token. ``decode_s`` of the window is the time some request was in a slot, less
what ran off the decode clock meanwhile (formatting a later turn, records: the other requests wait), so
``tokens_per_s`` is the throughput over all requests; at batch 1 it is the sum of the requests' ``decode_s``. A
method with a loop of its own (beam; batch 1 only) is decoded one ``generate`` call at a
time behind the same engine, each bracketed by a device synchronisation.

9. The loop's own clock (``BatchedDecoder.clock``, ``pipeline.decoding.phase_clock``) times every iteration of the
   window in four phases (draft, verify, rule, other) with what it did (rows verified, draft positions, tokens
   emitted, context); the warm-up's iterations (drafting the calibration schedule) come with them. The cell's cost
   model and time breakdown are read off these (``pipeline.measure.costs.cost_model``), never timed beside the loop.

The records, the result and its summary are ``pipeline.measure.records``; step costs ``pipeline.measure.costs``.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Sequence

import torch

from pipeline.data import format_sample
from pipeline.data.base import Prompt, Sample
from pipeline.decoding.batched import BatchedDecoder, BatchedGeneration, BatchRequest
from pipeline.decoding.warping import make_generator
from pipeline.device import environment_info, peak_memory, reset_peak_memory, synchronize
from pipeline.measure.costs import draft_length
from pipeline.measure.energy import EnergyMeter, NullMeter
from pipeline.measure.meters import IdleReading
from pipeline.measure.records import PROTOCOL, GenerationRecord, WindowResult, cut_at_stop, sample_seed
from pipeline.measure.workload import Workload

Formatter = Callable[[Sample, int, Sequence[str]], Prompt]


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
    batch_size: int = 1,
) -> dict[str, Any]:
    """Generate on ``prompts`` (cycled), ``batch_size`` at a time, until both minimums are met, drafting the
    calibration schedule (``BatchedDecoder(calibrate=True)``: every draft length from gamma down to 0 in turn), so
    that the loop's clock sees the target's pass at several row counts (``iterations``: its records, the cost model's
    calibration, ``measure.costs.cost_model``) and an ``auto`` draft cost is measured before the window opens."""
    if not prompts or (min_generations <= 0 and min_seconds <= 0):
        return {"generations": 0, "seconds": 0.0, "iterations": []}
    engine = BatchedDecoder(decoder, batch_size, calibrate=True)
    start, count = time.perf_counter(), 0
    while count < min_generations or time.perf_counter() - start < min_seconds:
        queue = deque(
            BatchRequest(
                list(prompts[(count + i) % len(prompts)]),
                max_new_tokens,
                make_generator(sample_seed(seed, "__warmup__", count + i), device),
            )
            for i in range(batch_size)
        )
        engine.run(queue, eos_token_ids=eos_token_ids)
        synchronize(device)
        count += batch_size
    return {"generations": count, "seconds": time.perf_counter() - start, "iterations": engine.clock.records()}


@dataclass
class _Window:
    """What both windows share: their settings, and what happened before the window opened (first-turn prompts,
    warm-up, idle power, the probe before)."""

    tokenizer: Any
    formatter: Formatter
    device: torch.device
    meter: EnergyMeter
    eos: list[int]
    max_new_tokens: int
    seed: int
    idle_seconds: float
    warmup_generations: int
    warmup_seconds: float
    time_budget_s: float | None
    stop_strings: Sequence[str]
    probe: Callable[[], float] | None
    first_prompts: list[Prompt] = field(default_factory=list)
    warm: dict[str, Any] = field(default_factory=dict)
    idle: IdleReading | None = None
    probes: dict[str, float] = field(default_factory=dict)
    t0: float = 0.0

    def prepare(self, samples: Sequence[Sample], warmup_samples: Sequence[Sample], warm: Callable[..., dict]) -> None:
        """1. first-turn prompts, outside the window; 2. warm-up (``warm``: ``warm_up`` with its decoder and
        batch size); 3. idle power; the probe before."""
        self.first_prompts = [self.formatter(s, 0, ()) for s in samples]
        warm_prompts = [self.formatter(s, 0, ()).input_ids for s in warmup_samples]
        on_measured = False
        if not warm_prompts:
            warm_prompts, on_measured = [p.input_ids for p in self.first_prompts[:3]], True
        self.warm = warm(
            warm_prompts,
            device=self.device,
            max_new_tokens=self.max_new_tokens,
            eos_token_ids=self.eos,
            seed=self.seed,
            min_generations=self.warmup_generations,
            min_seconds=self.warmup_seconds,
        )
        self.warm["on_measured_samples"] = on_measured
        synchronize(self.device)
        meter = self.meter
        self.idle = meter.measure_idle(self.idle_seconds) if (meter.available and self.idle_seconds > 0) else None
        self.probes = {"probe_before_ms": float(self.probe())} if self.probe is not None else {}

    def open(self) -> None:
        """4. the window opens: synchronise, start the meter and the clock."""
        reset_peak_memory(self.device)
        synchronize(self.device)
        self.meter.start()
        self.t0 = time.perf_counter()

    def over_budget(self) -> bool:
        return self.time_budget_s is not None and time.perf_counter() - self.t0 >= self.time_budget_s


def _window(
    tokenizer: Any,
    chat: bool | None,
    formatter: Formatter | None,
    device: torch.device | str,
    meter: EnergyMeter | None,
    eos_token_ids: Sequence[int],
    **settings: Any,
) -> _Window:
    """The shared settings of a window; ``formatter`` by default the dataset's own formatting with ``chat``."""
    if formatter is None:
        if chat is None:
            raise ValueError("pass `chat` (the pair's prompt style) or a `formatter`")

        def formatter(sample: Sample, turn: int, answers: Sequence[str]) -> Prompt:
            return format_sample(sample, tokenizer, chat=chat, turn=turn, answers=answers)

    return _Window(
        tokenizer=tokenizer,
        formatter=formatter,
        device=torch.device(device),
        meter=meter or NullMeter("no energy meter given"),
        eos=[int(t) for t in eos_token_ids],
        **settings,
    )


def _finish_window(
    w: _Window,
    decoder: Any,
    records: list[GenerationRecord],
    *,
    samples_total: int,
    samples_finished: int,
    budget_exhausted: bool,
    decode_s: float,
    engine: BatchedDecoder,
    **settings: Any,
) -> WindowResult:
    """The window closes (synchronise, read clock and meter, peak memory, the probe after); 7. after it:
    detokenise, cut at stop strings."""
    synchronize(w.device)
    window_s = time.perf_counter() - w.t0
    reading = w.meter.stop()
    memory = peak_memory(w.device)
    if w.probe is not None:
        w.probes["probe_after_ms"] = float(w.probe())
    tokenizer = w.tokenizer
    for rec in records:
        text, counted = (
            cut_at_stop(tokenizer, rec.tokens, w.stop_strings)
            if w.stop_strings
            else (tokenizer.decode(rec.tokens, skip_special_tokens=True), rec.new_tokens)
        )
        rec.text = tokenizer.decode(rec.tokens, skip_special_tokens=True)
        rec.prediction = rec.answer_prefix + text
        rec.counted_tokens = counted
    iterations = engine.clock.records()
    calibration = w.warm.pop("iterations", [])
    return WindowResult(
        records=records,
        window_s=window_s,
        decode_s=decode_s,
        iterations=iterations,
        calibration=calibration,
        clock_transitions=engine.clock.transitions,
        samples_total=samples_total,
        samples_finished=samples_finished,
        time_budget_s=w.time_budget_s,
        budget_exhausted=budget_exhausted,
        warmup=w.warm,
        energy=reading,
        idle=w.idle,
        peak_memory=memory,
        device=environment_info(w.device),
        settings={
            "max_new_tokens": w.max_new_tokens,
            "seed": w.seed,
            "eos_token_ids": w.eos,
            "stop_strings": list(w.stop_strings),
            "meter": w.meter.info(),
            "idle_seconds": w.idle_seconds,
            "warmup_generations_min": w.warmup_generations,
            "warmup_seconds_min": w.warmup_seconds,
            "draft_length": draft_length(decoder),
            **settings,
        },
        probe=w.probes,
    )


def _record(sample: Sample, turn: int, prompt: Prompt, gen: Any, eos: Sequence[int], **timing: Any) -> GenerationRecord:
    """One generation's record (``timing``: ``decode_s`` and what else its window measured)."""
    return GenerationRecord(
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
        hit_eos=bool(gen.tokens) and gen.tokens[-1] in eos,
        answer_prefix=prompt.answer_prefix,
        category=sample.category,
        drafted=list(gen.drafted),
        **timing,
    )


@dataclass
class _Progress:
    """The window's queue as it goes: the next sample to start, requests open, finished samples, whether the
    budget ended it, the time spent off the decode clock (formatting later turns, records, topping up)."""

    next: int = 0
    open: int = 0
    finished: int = 0
    exhausted: bool = False
    off_clock: float = 0.0


def run_window(
    decoder: Any,
    samples: Sequence[Sample],
    *,
    tokenizer: Any,
    eos_token_ids: Sequence[int],
    max_new_tokens: int,
    seed: int,
    batch_size: int = 1,
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
    workload: Workload | None = None,
) -> WindowResult:
    """Warm up, measure idle power, then decode ``samples``, ``batch_size`` at a time, inside one timed, metered
    window (see the module doc).

    ``workload`` (``pipeline.measure.workload``; None or offline: every request queued when the window opens): the
    first ``workload.requests`` samples' first turns arrive as it says (``Arrivals``, replayed on the wall clock into
    the engine), each record with its ``arrival_s``, its ``queue_s`` from its arrival; the summary adds the serving
    metrics. A time budget does not apply to it (the arrivals are the schedule).

    ``formatter(sample, turn, previous_answers) -> Prompt`` builds prompts (default: the dataset's
    own formatting via ``pipeline.data.format_sample`` with ``chat``). Multi-turn samples are answered
    turn by turn (``max_turns`` caps them). Without warm-up samples the warm-up reuses the first
    samples' prompts (recorded as ``warmup.on_measured_samples``). ``probe()`` (milliseconds, e.g.
    ``probe_step_ms`` of the target) runs right before the window opens and right after it closes, outside it:
    the summary's ``probe_before_ms`` and ``probe_after_ms``.
    """
    engine = BatchedDecoder(decoder, batch_size)
    serving = workload is not None and not workload.offline
    if serving:
        workload.check_slots(batch_size, "the cell's batch size")  # type: ignore[union-attr]
        samples = samples[: workload.count(len(samples))]  # type: ignore[union-attr]
    w = _window(
        tokenizer,
        chat,
        formatter,
        device,
        meter,
        eos_token_ids,
        max_new_tokens=max_new_tokens,
        seed=seed,
        idle_seconds=idle_seconds,
        warmup_generations=warmup_generations,
        warmup_seconds=warmup_seconds,
        time_budget_s=time_budget_s,
        stop_strings=stop_strings,
        probe=probe,
    )
    w.prepare(samples, warmup_samples, partial(warm_up, decoder, batch_size=batch_size))
    device, eos = w.device, w.eos

    records: list[tuple[int, int, GenerationRecord]] = []
    answers: dict[int, list[str]] = {}
    queue: deque = deque()
    state = _Progress()
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
        state.open += 1

    def top_up() -> None:  # new samples while slots would idle, until the slice or the budget ends
        while not serving and state.open < batch_size and state.next < len(samples):
            if w.over_budget():
                state.exhausted = True
                return
            i = state.next
            state.next += 1
            enqueue(i, 0, w.first_prompts[i])

    def finish(request: BatchRequest, gen: BatchedGeneration) -> None:
        t0 = time.perf_counter()
        i, turn, prompt, rid = request.tag
        arrived = arrivals.arrival_of(request) if arrivals is not None else None
        if arrived is not None:
            ready[rid] = arrived
        state.open -= 1
        # requests still in flight: this callback holds them up (off the decode clock); a workload's: other
        # conversations released and not finished (those still to arrive wait for their time, not for this)
        others = state.open > 0 if arrivals is None else arrivals.open > 1
        spans.append((gen.admitted_at, gen.finished_at))
        sample = samples[i]
        timing = {
            "decode_s": gen.finished_at - gen.admitted_at,
            "prefill_s": gen.prefill_s,
            "queue_s": gen.admitted_at - ready[rid],
            "ttft_s": gen.first_token_at - gen.admitted_at,
            **({"arrival_s": ready[rid] - w.t0} if serving else {}),
        }
        records.append((i, turn, _record(sample, turn, prompt, gen, eos, **timing)))
        if turn + 1 < turns(i):
            answers.setdefault(i, []).append(tokenizer.decode(gen.tokens, skip_special_tokens=True))
            enqueue(i, turn + 1, w.formatter(sample, turn + 1, answers[i]))
        else:
            state.finished += 1
            if arrivals is not None:
                arrivals.finished()
        top_up()
        if others:
            state.off_clock += time.perf_counter() - t0

    spans: list[tuple[float, float]] = []  # each request's time in a slot
    arrivals = None
    if serving:  # the first turns arrive as the workload says (the queue's requests, built before the window opens)
        for i in range(len(samples)):
            enqueue(i, 0, w.first_prompts[i])
        arrivals = workload.arrivals(list(queue), seed)  # type: ignore[union-attr]
        queue.clear()
    w.open()
    top_up()
    if arrivals is not None:
        arrivals.start(w.t0)
    engine.run(queue, eos_token_ids=eos, on_finish=finish, arrivals=arrivals)
    return _finish_window(
        w,
        decoder,
        [rec for *_, rec in sorted(records, key=lambda r: (r[0], r[1]))],
        samples_total=len(samples),
        samples_finished=state.finished,
        budget_exhausted=state.exhausted,
        decode_s=_covered(spans) - state.off_clock,
        engine=engine,
        batch_size=batch_size,
        **({"workload": workload.to_dict()} if serving else {}),  # type: ignore[union-attr]
    )


def _covered(spans: list[tuple[float, float]]) -> float:
    """The time covered by at least one of ``spans`` (the union of the intervals)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total
