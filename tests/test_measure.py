"""The measurement window: protocol, records, decode time apart from everything else, the time budget,
per-sample seeding, stop strings, peak memory and energy records, with real decoders on tiny models."""

from __future__ import annotations

import dataclasses
import inspect
import math
import time

import pytest
import torch
import yaml

from helpers.models import tiny_llama
from helpers.paths import DATA
from helpers.tokenizers import offline_tokenizer
from pipeline.data import format_sample, load_dataset
from pipeline.data.base import Sample
from pipeline.decoding import build_decoder
from pipeline.measure import costs, records, window
from pipeline.measure.bounds import alpha_from_accepted, expected_tokens, leviathan_bound
from pipeline.measure.meters import RaplMeter
from pipeline.sweep import CONF_DIR

torch.set_num_threads(1)

LM = dict(max_positions=4096, bos=1, eos=2, scale=8.0)  # peaked: speculative drafts get accepted sometimes


@pytest.fixture(scope="module")
def tokenizer():
    return offline_tokenizer()


@pytest.fixture(scope="module")
def models(tokenizer):
    vocab = len(tokenizer)
    return tiny_llama(0, vocab=vocab, **LM), tiny_llama(
        0, vocab=vocab, layers=1, **LM
    )  # draft = same weights: high acceptance


def _samples(n: int = 3, turns: int = 1) -> list[Sample]:
    words = ["apples", "rivers", "engines", "violins", "glaciers"]
    return [
        Sample(id=f"s{i}", dataset="spec_bench", turns=[f"Tell me about {words[i]}."] + ["And more?"] * (turns - 1))
        for i in range(n)
    ]


def _window(decoder, samples, tokenizer, **kw):
    kw.setdefault("warmup_generations", 1)
    kw.setdefault("warmup_seconds", 0.0)
    kw.setdefault("idle_seconds", 0.0)
    return window.run_window(
        decoder,
        samples,
        tokenizer=tokenizer,
        chat=True,
        eos_token_ids=[tokenizer.eos_token_id],
        max_new_tokens=kw.pop("max_new_tokens", 6),
        seed=kw.pop("seed", 0),
        device="cpu",
        **kw,
    )


def test_records_and_summary(models, tokenizer):
    target, _ = models
    decoder = build_decoder("ar", target, None, temperature=0.0)
    result = _window(decoder, _samples(3), tokenizer)
    s = result.summary()
    assert len(result.records) == 3 and s["samples_finished"] == s["samples_total"] == 3
    rec = result.records[0]
    assert rec.prompt_style == "chat" and "<|im_start|>" in rec.prompt_text
    assert rec.new_tokens == len(rec.tokens) and 1 <= rec.new_tokens <= 6
    assert rec.steps == rec.new_tokens and rec.draft_steps == 0 and rec.accepted == [1] * rec.new_tokens
    assert rec.text == tokenizer.decode(rec.tokens, skip_special_tokens=True) == rec.prediction
    assert s["new_tokens"] == sum(r.new_tokens for r in result.records)
    assert 0 < s["decode_s"] <= s["window_s"]
    assert s["tokens_per_s"] == pytest.approx(s["new_tokens"] / s["decode_s"])
    assert s["target_steps"] == sum(r.steps for r in result.records) and s["prefills"] == 3
    assert s["warmup_generations"] == 1 and result.warmup["on_measured_samples"] is True
    # CPU: no device-memory figure, and energy recorded as unavailable (no RAPL here) or measured
    assert s["peak_memory_allocated_bytes"] is None and s["peak_memory_process_max_rss_bytes"] > 0
    if not result.energy.available:
        assert s["energy_j"] is None and s["j_per_token"] is None and s["energy_unavailable_reason"]
    assert result.device["torch"] == torch.__version__ and "git_commit" in result.device


@pytest.mark.parametrize("method", ["ar", "spd"])
def test_prefill_time_is_inside_decode_time_and_reported_apart(models, tokenizer, method):
    """A generation's time to write its prompt into the caches (target and draft) is recorded, is part of
    its decode time, and the decode rate without it (the bench's short prompts hide it) is in the summary."""
    target, draft = models
    decoder = build_decoder(method, target, draft if method == "spd" else None, temperature=0.0)
    result = _window(decoder, _samples(3), tokenizer)
    s = result.summary()
    assert all(0 < r.prefill_s < r.decode_s for r in result.records)
    assert s["prefill_s"] == pytest.approx(sum(r.prefill_s for r in result.records))
    assert s["tokens_per_s_decode"] == pytest.approx(s["new_tokens"] / (s["decode_s"] - s["prefill_s"]))
    assert s["tokens_per_s_decode"] > s["tokens_per_s"]
    models_of = [m for m in (decoder.target, getattr(decoder, "draft", None)) if m is not None]
    assert decoder.prefill_seconds() == pytest.approx(sum(m.prefill_s for m in models_of)) and len(models_of) == (
        2 if method == "spd" else 1
    )
    for m in models_of:
        m.reset()
    assert decoder.prefill_seconds() == 0.0


def test_speculative_decoder_counts(models, tokenizer):
    target, draft = models
    decoder = build_decoder("spd", target, draft, temperature=0.0, gamma=3)
    ar = build_decoder("ar", target, None, temperature=0.0)
    spec = _window(decoder, _samples(2), tokenizer, max_new_tokens=10)
    base = _window(ar, _samples(2), tokenizer, max_new_tokens=10)
    assert [r.tokens for r in spec.records] == [r.tokens for r in base.records]  # lossless at temperature 0
    s = spec.summary()
    assert s["draft_steps"] > 0
    assert s["accepted_per_step"] == pytest.approx(s["new_tokens"] / s["target_steps"])


def test_same_seed_same_output_independent_of_slice_and_warmup(models, tokenizer):
    target, _ = models
    decoder = build_decoder("ar", target, None, temperature=1.0, top_k=0, top_p=1.0)
    samples = _samples(3)
    full = _window(decoder, samples, tokenizer, max_new_tokens=8, seed=7)
    alone = _window(decoder, samples[2:], tokenizer, max_new_tokens=8, seed=7, warmup_generations=3)
    assert full.records[2].tokens == alone.records[0].tokens
    other = _window(decoder, samples[2:], tokenizer, max_new_tokens=8, seed=8)
    assert other.records[0].tokens != alone.records[0].tokens


def test_non_decode_work_is_outside_decode_time(models, tokenizer):
    """Formatting the second turn (inside the window) does not count as decode time."""
    target, _ = models
    decoder = build_decoder("ar", target, None, temperature=0.0)

    def slow_formatter(sample, turn, answers):
        if turn > 0:
            time.sleep(0.3)  # stands for detokenising and re-tokenising a long conversation
        return format_sample(sample, tokenizer, chat=True, turn=turn, answers=answers)

    result = _window(decoder, _samples(2, turns=2), tokenizer, formatter=slow_formatter)
    s = result.summary()
    assert len(result.records) == 4 and [r.turn for r in result.records] == [0, 1, 0, 1]
    assert s["other_in_window_s"] >= 0.6
    assert s["decode_s"] == pytest.approx(sum(r.decode_s for r in result.records))
    assert s["tokens_per_s"] > s["tokens_per_s_window"]
    # the second turn's prompt holds the first answer
    first_answer = tokenizer.decode(result.records[0].tokens, skip_special_tokens=True)
    assert first_answer in result.records[1].prompt_text


class _SlowDecoder:
    """A real decoder that also waits, to make the time budget deterministic."""

    def __init__(self, inner, pause_s):
        self.inner, self.pause_s = inner, pause_s
        self.name, self.target, self.prefill_seconds = inner.name, inner.target, inner.prefill_seconds
        # a loop of its own (as beam's): the engine calls this generate, request by request
        self.capabilities = dataclasses.replace(inner.capabilities, loop="own")

    def generate(self, input_ids, **kw):
        time.sleep(self.pause_s)
        return self.inner.generate(input_ids, **kw)


def test_time_budget_records_how_many_finished(models, tokenizer):
    target, _ = models
    # each generation waits 1 s and decodes in well under 0.5 s even on a loaded machine: the budget of 1.5 s is
    # left after the first generation and spent after the second
    decoder = _SlowDecoder(build_decoder("ar", target, None, temperature=0.0), 1.0)
    result = _window(decoder, _samples(5), tokenizer, time_budget_s=1.5, warmup_generations=0)
    s = result.summary()
    assert s["budget_exhausted"] is True and s["samples_total"] == 5
    assert s["samples_finished"] == 2 and len(result.records) == 2
    unlimited = _window(decoder, _samples(2), tokenizer, warmup_generations=0)
    assert unlimited.summary()["budget_exhausted"] is False


def test_warmup_honours_both_minimums(models, tokenizer):
    target, _ = models
    decoder = build_decoder("ar", target, None, temperature=0.0)
    prompts = [format_sample(s, tokenizer, chat=True).input_ids for s in _samples(2)]
    out = window.warm_up(
        decoder, prompts, device="cpu", max_new_tokens=2, eos_token_ids=[2], seed=0, min_generations=3, min_seconds=0.0
    )
    assert out["generations"] == 3
    out = window.warm_up(
        decoder, prompts, device="cpu", max_new_tokens=2, eos_token_ids=[2], seed=0, min_generations=1, min_seconds=0.3
    )
    assert out["seconds"] >= 0.3 and out["generations"] >= 1


def test_stop_strings_cut_text_and_counted_tokens(tokenizer):
    ids = tokenizer("    return x + 1\n\ndef other():\n    pass", add_special_tokens=False)["input_ids"]
    text, counted = records.cut_at_stop(tokenizer, ids, ["\ndef "])
    assert text == "    return x + 1\n"
    assert tokenizer.decode(ids[:counted]).find("\ndef ") >= 0
    assert tokenizer.decode(ids[: counted - 1]).find("\ndef ") < 0
    assert records.cut_at_stop(tokenizer, ids, ["zzz"]) == (tokenizer.decode(ids), len(ids))


def test_energy_record_with_an_available_meter(models, tokenizer, tmp_path):
    """With a readable counter (a RAPL tree here) idle power and J/token are filled in."""
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "name").write_text("package-0")
    (zone / "energy_uj").write_text("1000")
    (zone / "max_energy_range_uj").write_text("100000000")
    target, _ = models
    decoder = build_decoder("ar", target, None, temperature=0.0)
    result = _window(decoder, _samples(1), tokenizer, meter=RaplMeter([zone]), idle_seconds=0.05)
    s = result.summary()
    assert result.idle is not None and result.idle.available and s["idle_power_w"] == 0.0
    assert s["energy_available"] and s["j_per_token"] == 0.0 and s["dynamic_j_per_token"] == 0.0


def test_predictions_for_scoring_shapes(models, tokenizer):
    target, _ = models
    decoder = build_decoder("ar", target, None, temperature=0.0)
    result = _window(decoder, _samples(1, turns=2) + _samples(2)[1:], tokenizer, max_turns=2)
    preds = records.predictions_for_scoring(result)
    assert isinstance(preds[0]["prediction"], list) and len(preds[0]["prediction"]) == 2
    assert preds[0]["format"] == "chat" and isinstance(preds[1]["prediction"], str)


def test_continuation_prompt_answer_prefix(models, tokenizer):
    """Base-model prompts: Spider's continuation ends with SELECT, which the prediction starts with."""
    target, _ = models
    decoder = build_decoder("ar", target, None, temperature=0.0)
    samples = load_dataset("spider", DATA / "spider", limit=1)
    result = window.run_window(
        decoder,
        samples,
        tokenizer=tokenizer,
        chat=False,
        eos_token_ids=[2],
        max_new_tokens=4,
        seed=0,
        warmup_generations=0,
        warmup_seconds=0,
        idle_seconds=0,
        stop_strings=[";"],
    )
    rec = result.records[0]
    assert rec.prompt_style == "continuation" and rec.prompt_text.endswith("SELECT")
    assert rec.prediction.startswith("SELECT")


def test_the_protocol_has_one_default_and_the_config_repeats_it():
    """pipeline.measure.records.Protocol holds the protocol's defaults (once); conf/config.yaml's `measure:` repeats
    them for Hydra's overrides and must not drift; run_window's and warm_up's defaults are the Protocol's."""
    configured = yaml.safe_load((CONF_DIR / "config.yaml").read_text())["measure"]
    defaults = dataclasses.asdict(records.Protocol())
    assert configured == {k: v for k, v in defaults.items() if k in configured}
    assert set(defaults) - set(configured) == {"costs"}  # an optional key of a sweep (plan.OPTIONAL_KEYS)
    params = inspect.signature(window.run_window).parameters
    assert [params[k].default for k in ("warmup_generations", "warmup_seconds", "idle_seconds")] == [3, 10.0, 10.0]
    assert records.Protocol.from_config({"warmup_seconds": 0.0, "threads": None, "unknown": 1}) == records.Protocol(
        warmup_seconds=0.0
    )


def test_the_machine_probe_brackets_the_window_and_flags_a_slow_machine(models, tokenizer):
    target, draft = models
    dec = build_decoder("ar", target, None)
    calls = []

    def probe() -> float:  # a machine that is quiet before the window and loaded after it
        calls.append(time.perf_counter())
        return 10.0 if len(calls) == 1 else 25.0

    result = window.run_window(
        dec,
        _samples(2),
        tokenizer=tokenizer,
        chat=False,
        eos_token_ids=[2],
        max_new_tokens=4,
        seed=0,
        warmup_generations=0,
        warmup_seconds=0.0,
        idle_seconds=0.0,
        probe=probe,
    )
    s = result.summary()
    assert (s["probe_before_ms"], s["probe_after_ms"]) == (10.0, 25.0) and len(calls) == 2
    # the window judges itself: its probes moved 2.5x (too few iterations here for the in-loop quarters)
    assert (s["step_drift"], s["disturbed"]) == (2.5, 1.0)
    assert costs.step_drift([], float("nan"), 1, [10.5, 11.0])["disturbed"] == 0.0
    assert math.isnan(costs.step_drift([], float("nan"), 1, [])["disturbed"])  # NaN: nothing to compare
    assert (
        "probe_before_ms"
        not in window.run_window(
            dec,
            _samples(1),
            tokenizer=tokenizer,
            chat=False,
            eos_token_ids=[2],
            max_new_tokens=2,
            seed=0,
            warmup_generations=0,
            warmup_seconds=0.0,
            idle_seconds=0.0,
        ).summary()
    )
    assert costs.probe_step_ms(target, "cpu", reps=3) > 0
    assert costs.probe_step_ms(tiny_llama(0, vocab=8), "cpu", reps=2) > 0  # a vocabulary smaller than the probe prompt


def test_a_slowdown_injected_inside_a_window_is_flagged_and_a_steady_window_is_not(models, tokenizer, monkeypatch):
    """The window judges its own step (``costs.step_drift``): a target pass that becomes 6x slower half-way through
    the window is seen by the loop's clock and flags the cell; the same window without it is not flagged. Time is
    injected (the loop's clock reads a counter that only the target's pass advances: 10 ms, then 60 ms), so the
    verdict does not depend on the machine's load; the probes are held equal."""
    from pipeline.decoding import packed, phase_clock  # noqa: PLC0415

    target, _ = models
    decoder = build_decoder("ar", target, None, temperature=0.0)
    fake = {"t": 0.0, "n": 0, "slow_after": None}
    step, init = packed.SoloCache.step, phase_clock.PhaseClock.__init__

    def paced(self, groups):
        fake["n"] += 1
        after = fake["slow_after"]
        fake["t"] += 0.010 if after is None or fake["n"] < after else 0.060
        return step(self, groups)

    def injected(self, device=None, now=None):
        init(self, device, now=lambda: fake["t"])

    monkeypatch.setattr(packed.SoloCache, "step", paced)
    monkeypatch.setattr(phase_clock.PhaseClock, "__init__", injected)

    def run() -> dict:
        fake["n"] = 0
        return _window(
            decoder, _samples(2), tokenizer, max_new_tokens=24, warmup_generations=0, probe=lambda: 10.0
        ).summary()

    steady = run()
    assert steady["disturbed"] == 0.0 and steady["step_drift"] == pytest.approx(1.0), steady["step_drift"]
    fake["slow_after"] = 24  # half of the window's 48 steps
    slowed = run()
    assert slowed["disturbed"] == 1.0 and slowed["step_drift"] == pytest.approx(6.0), slowed["step_drift"]


# pipeline/measure/bounds.py: Leviathan's arithmetic (the bench and the analysis read it)
def test_bound_formulas():
    assert leviathan_bound(0.0, 4, 0.0) == pytest.approx(1.0)
    assert leviathan_bound(1.0, 4, 0.0) == pytest.approx(5.0)
    # Leviathan et al., section 3: alpha 0.8, gamma 4, c 0.05 -> (1 - .8^5) / (.2 * 1.2)
    assert leviathan_bound(0.8, 4, 0.05) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    # steps emitting 1 (first draft rejected), 3 (two accepted, third rejected), 4 (all 3 accepted + bonus)
    assert alpha_from_accepted([1, 3, 4], gamma=3) == pytest.approx((0 + 2 + 3) / (1 + 3 + 3))
