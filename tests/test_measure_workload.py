"""The measurement window under a workload (run_window(workload=...), BatchedDecoder.run(arrivals=...)): requests
wait for their arrival and a slot, keep the tokens they get offline, and the window reports the serving metrics.
Only order and counts are checked here, no speed."""

from __future__ import annotations

from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from helpers.tokenizers import offline_tokenizer
from helpers.windows import WARP, tiny_pair, window_kwargs, window_samples
from pipeline.bench.serving import ServingBench, serving_markdown
from pipeline.decoding import build_decoder
from pipeline.measure.records import request_metrics
from pipeline.measure.window import run_window
from pipeline.measure.workload import Workload

torch.set_num_threads(1)
SERVING_NAMES = {
    "rate",
    "ttft_s_p50",
    "ttft_s_p90",
    "ttft_s_p99",
    "tpot_ms_p50",
    "tpot_ms_p90",
    "tpot_ms_p99",
    "e2e_s_p50",
    "e2e_s_p90",
    "e2e_s_p99",
    "queue_s_p50",
    "queue_s_p99",
    "throughput_tok_s",
    "request_throughput_rps",
    "goodput_rps",
    "mean_batch_occupancy",
}


@pytest.fixture(scope="module")
def tokenizer():
    return offline_tokenizer()


@pytest.fixture(scope="module")
def models(tokenizer):
    return tiny_pair(tokenizer)


def _decoder(models, method):
    return build_decoder(method, *(models if method != "ar" else (models[0], None)), **WARP)


def test_requests_arrive_as_drawn_keep_their_tokens_and_pair_across_methods(models, tokenizer):
    workload = Workload.from_config(
        {"kind": "poisson", "rate": 40.0, "requests": 5, "max_concurrency": 2}, {"tpot_ms": 1e6, "ttft_s": 1e6}
    )
    times = workload.arrival_times(5, seed=3)
    samples = window_samples(6)
    seen = {}
    for method in ("ar", "spd"):
        decoder = _decoder(models, method)
        offline = run_window(decoder, samples[:5], batch_size=2, **window_kwargs(tokenizer))
        served = run_window(decoder, samples, batch_size=2, workload=workload, **window_kwargs(tokenizer))
        # the slice's first `requests` samples, each with the tokens it gets offline (its own generator)
        assert [(r.id, r.tokens) for r in served.records] == [(r.id, r.tokens) for r in offline.records]
        arrivals = [r.arrival_s for r in served.records]
        assert arrivals == pytest.approx(list(times), abs=1e-9)
        # nobody is admitted before its arrival, and the first tokens come after it
        assert all(r.queue_s >= 0 and r.ttft_s >= 0 for r in served.records)
        s = served.summary()
        assert SERVING_NAMES <= set(s) and s["rate"] == 40.0 and s["requests"] == 5
        assert s["ttft_s_p50"] <= s["ttft_s_p99"] and s["e2e_s_p50"] <= s["e2e_s_p99"]
        assert 0 < s["mean_batch_occupancy"] <= 2 + 1e-9  # at most max_concurrency requests in a slot
        assert s["goodput_rps"] == pytest.approx(s["request_throughput_rps"])  # objectives nobody misses
        assert served.settings["workload"]["kind"] == "poisson"
        assert "workload" not in offline.settings and "rate" not in offline.summary()
        # the cell's request metrics measure from arrival under a workload
        metrics = request_metrics(served.records)
        assert metrics["ttft_s_p50"] == s["ttft_s_p50"] and "e2e_s_p50" in metrics
        assert "e2e_s_p50" not in request_metrics(offline.records)
        seen[method] = arrivals
    assert seen["ar"] == seen["spd"]  # the same arrivals for every method of a cell group


def test_a_closed_workload_serves_every_turn(models, tokenizer):
    workload = Workload.from_config({"kind": "closed", "clients": 2})
    result = run_window(
        _decoder(models, "ar"), window_samples(4, turns=2), batch_size=2, workload=workload, **window_kwargs(tokenizer)
    )
    assert result.summary()["samples_finished"] == 4 and len(result.records) == 8
    assert all(r.arrival_s is not None and r.queue_s >= 0 for r in result.records)
    assert sum(r.arrival_s == 0.0 for r in result.records) == 2  # two clients send at the window's start


def test_a_workload_wider_than_the_cells_batch_is_refused(models, tokenizer):
    workload = Workload.from_config({"kind": "poisson", "rate": 1.0, "max_concurrency": 4})
    with pytest.raises(ValueError, match="workload.max_concurrency=4 exceeds the cell's batch size"):
        run_window(
            _decoder(models, "ar"), window_samples(4), batch_size=2, workload=workload, **window_kwargs(tokenizer)
        )


def test_the_serving_bench_rows_carry_the_serving_names(models):
    """``python -m pipeline.bench workload=poisson ...`` (pipeline/bench/serving.py) on the tiny models: every row has
    the names of the serving metrics, ar's speedup over itself is 1 and the table is drawn."""
    cfg = OmegaConf.create(
        {"methods": ["ar", "spd"], "modes": ["sample"], "max_new_tokens": 6, "seed": 0, "warmup": 1, "repeats": 2}
    )
    bench = SimpleNamespace(
        prompts=[[1, 5, 6, 7], [1, 9, 10]],
        eos=[],
        device=torch.device("cpu"),
        pair=SimpleNamespace(target=models[0], draft=models[1], assets=None),
        ctx=None,
        method_params=lambda method, mode: dict(WARP),
    )
    workload = Workload.from_config({"kind": "poisson", "rate": 50.0, "requests": 5, "max_concurrency": 2})
    rows = ServingBench(bench, cfg, workload).run()
    assert [(r.method, r.mode) for r in rows] == [("ar", "sample"), ("spd", "sample")]
    for row in rows:
        values = asdict(row)
        assert SERVING_NAMES - {"queue_s_p90"} <= set(values) and "speedup" in values
        assert all(values[k] is not None for k in SERVING_NAMES) and values["rate"] == 50.0
        assert row.ttft_s_p50 <= row.ttft_s_p99 and row.requests == 5 and row.max_concurrency == 2
    assert rows[0].speedup == pytest.approx(1.0) and rows[1].speedup > 0
    md = serving_markdown("x", rows, cfg, "python -m pipeline.bench workload=poisson", {"device": "cpu"})
    assert "| spd | sample |" in md and "poisson at 50 requests/s" in md
