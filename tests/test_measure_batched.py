"""The measurement window at batch > 1 (pipeline/measure/window.py, run_window with batch_size) and the sweep's
batch-size axis."""

from __future__ import annotations

import pytest
import torch

from helpers.paths import DATA
from helpers.tokenizers import offline_tokenizer
from helpers.windows import WARP, tiny_pair, window_kwargs, window_samples
from pipeline import sweep
from pipeline.decoding import build_decoder
from pipeline.measure.records import request_metrics
from pipeline.measure.window import run_window
from pipeline.sweep import SweepConfigError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tokenizer():
    return offline_tokenizer()


@pytest.fixture(scope="module")
def models(tokenizer):
    return tiny_pair(tokenizer)


@pytest.mark.parametrize("method", ["ar", "spd"])
def test_a_batched_window_gives_every_sample_its_batch_one_tokens(models, tokenizer, method):
    """Same seeds per (sample, turn): the batched window's records are the sequential window's (two turns each)."""
    decoder = build_decoder(method, *(models if method != "ar" else (models[0], None)), **WARP)
    samples = window_samples(5, turns=2)
    alone = run_window(decoder, samples, **window_kwargs(tokenizer))
    together = run_window(decoder, samples, batch_size=3, **window_kwargs(tokenizer))
    assert [(r.id, r.turn, r.tokens, r.steps) for r in together.records] == [
        (r.id, r.turn, r.tokens, r.steps) for r in alone.records
    ]
    assert [r.prompt_text for r in together.records] == [
        r.prompt_text for r in alone.records
    ]  # turn 2 saw turn 1's answer
    s = together.summary()
    assert s["samples_finished"] == 5 and s["generations"] == 10 and 0 < s["decode_s"] <= s["window_s"]
    assert together.settings["batch_size"] == 3
    assert all(r.queue_s is not None and r.queue_s >= 0 and 0 <= r.ttft_s <= r.decode_s for r in together.records)
    metrics = request_metrics(together.records)
    assert metrics["latency_s_p50"] <= metrics["latency_s_p99"] and metrics["tpot_ms_p50"] > 0
    assert set(request_metrics(alone.records)) == set(metrics)  # batch-1 cells report the same columns


def test_a_batched_window_honours_the_time_budget(models, tokenizer):
    decoder = build_decoder("ar", models[0], None, **WARP)
    result = run_window(decoder, window_samples(7), batch_size=2, time_budget_s=0.0, **window_kwargs(tokenizer))
    assert result.budget_exhausted and result.summary()["samples_finished"] == 0


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("batching")
    (root / "data").symlink_to(DATA, target_is_directory=True)
    return root


def test_the_batching_sweep_plans_every_method_at_every_batch_size(project):
    plan = sweep.expand(sweep.compose(["sweep=batching", "data_root=data", "seeds=[0]"]), project)
    got = {(c.label, c.batch_size) for c in plan.cells}
    assert got == {
        (m if b == 1 else f"{m} (batch {b})", b) for m in ("ar", "spd", "block", "mtad") for b in (1, 2, 4, 8, 16)
    }
    assert len({c.key for c in plan.cells}) == len(plan.cells)
    assert all(c.config["batch_size"] == c.batch_size for c in plan.cells)
    assert {c.label for c in plan.cells if c.baseline} == {
        "ar",
        "ar (batch 2)",
        "ar (batch 4)",
        "ar (batch 8)",
        "ar (batch 16)",
    }


@pytest.mark.parametrize(
    "methods,needle",
    [
        ("[ar,beam]", "'beam' cannot decode with batch_size 2: it decodes one sequence"),
    ],
)
def test_a_method_that_cannot_batch_is_refused_at_plan_time(project, methods, needle):
    with pytest.raises(SweepConfigError, match=needle):
        sweep.expand(
            sweep.compose(["sweep=batching", "data_root=data", "seeds=[0]", f"sweep.methods={methods}"]), project
        )


def test_tree_methods_are_planned_above_batch_one(project):
    """The tree methods batch (one packed target forward of every request's tree): a sweep plans them at every
    batch size of its axis, as the chain methods."""
    methods = "[specinfer,mcss,traversal,spectr,{method: typical, tree: true, label: typical-tree}]"
    plan = sweep.expand(
        sweep.compose(
            ["sweep=batching", "data_root=data", "seeds=[0]", "sweep.batch_sizes=[1,2]", f"sweep.methods={methods}"]
        ),
        project,
    )
    got = {(c.label, c.batch_size) for c in plan.cells}
    for label in ("specinfer", "mcss", "traversal", "spectr", "typical-tree"):
        assert {(label, 1), (f"{label} (batch 2)", 2)} <= got


def test_bad_batch_sizes_are_refused(project):
    with pytest.raises(SweepConfigError, match="batch_sizes must be a non-empty list of integers >= 1"):
        sweep.expand(sweep.compose(["sweep=batching", "data_root=data", "sweep.batch_sizes=[0,2]"]), project)


def test_an_entry_of_its_own_batch_sizes_runs_only_there_with_its_baseline(project):
    """``{method: spd, batch_sizes: [1, 4]}``: spd at 1 and 4, another method at the sweep's batch 1 only,
    and the ar baseline at every batch size some entry runs at (the claims sweep's batch axis)."""
    methods = "[{method: spd, gamma: 2, label: spd, batch_sizes: [4, 1]},specinfer]"
    plan = sweep.expand(
        sweep.compose(
            ["sweep=batching", "data_root=data", "seeds=[0]", "sweep.batch_sizes=[1]", f"sweep.methods={methods}"]
        ),
        project,
    )
    got = {(c.label, c.batch_size) for c in plan.cells}
    assert got == {("ar", 1), ("spd", 1), ("specinfer", 1), ("ar (batch 4)", 4), ("spd (batch 4)", 4)}
    # the same cells as the sweep-wide axis plans them: an entry's batch axis is not part of any key
    axis = sweep.expand(sweep.compose(["sweep=batching", "data_root=data", "seeds=[0]"]), project)
    keys = {(c.label, c.batch_size): c.key for c in axis.cells}
    assert all(keys[(c.label, c.batch_size)] == c.key for c in plan.cells if c.label != "specinfer")
    with pytest.raises(SweepConfigError, match=r"sweep entry 'spd': batch_sizes must be a non-empty list"):
        sweep.expand(
            sweep.compose(
                ["sweep=batching", "data_root=data", "seeds=[0]", "sweep.methods=[{method: spd, batch_sizes: [0]}]"]
            ),
            project,
        )
    with pytest.raises(SweepConfigError, match="'beam' cannot decode with batch_size 2"):
        sweep.expand(
            sweep.compose(
                [
                    "sweep=batching",
                    "data_root=data",
                    "seeds=[0]",
                    "sweep.methods=[{method: beam, batch_sizes: [2]}]",
                ]
            ),
            project,
        )


@pytest.mark.parametrize(
    "sizes,needle",
    [
        ("[1000000]", "sweep.batch_sizes has 1000000: at most 256 requests decode together"),
        ("[1,257]", "sweep.batch_sizes has 257: at most 256"),
        ("[-1]", "batch_sizes must be a non-empty list of integers >= 1"),
        ("[x]", "batch_sizes must be a non-empty list of integers >= 1"),
        ("[1.5]", "batch_sizes must be a non-empty list of integers >= 1"),
        ("[true]", "batch_sizes must be a non-empty list of integers >= 1"),
        ("[]", "batch_sizes must be a non-empty list of integers >= 1"),
        ("[64]", "sweep.batch_sizes has 64 but dataset 'humaneval''s slice has 32 requests"),
    ],
)
def test_absurd_batch_sizes_are_refused_before_any_slot_is_forked(project, sizes, needle, monkeypatch):
    """Without `+` (conf/config.yaml declares sweep.batch_sizes); refused at plan time, before any model loads or a
    drafter copy per slot is forked: bounded by MAX_BATCH_SIZE and by the slice's requests."""
    with pytest.raises(SweepConfigError, match=needle.replace("[", r"\[")):
        sweep.expand(sweep.compose(["sweep=batching", "data_root=data", f"sweep.batch_sizes={sizes}"]), project)
