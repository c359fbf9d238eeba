"""python -m pipeline.bench.profile: one step's wall, host and device time under torch.profiler."""

from __future__ import annotations

import subprocess
import sys

import torch

from helpers.paths import REPO
from pipeline.bench import profile


def test_a_profiled_step_reports_its_time_and_ops():
    a = torch.randn(256, 256)
    calls = []
    stats = profile.profile_step(lambda: a @ a, lambda: calls.append(1), torch.device("cpu"), reps=3)
    assert stats["wall_ms"] > 0 and stats["host_ms"] > 0
    assert stats["device_ms"] is None and stats["launches"] is None and stats["busy"] is None  # no device on a CPU
    assert len(calls) == 2 + 3 + 3  # after() follows every timed and profiled call (2 warm-up, 3 timed, 3 profiled)
    assert stats["top"][0]["op"] in ("aten::mm", "aten::matmul") and stats["top"][0]["calls"] == 1.0
    stats["path"] = "lean"
    md = profile.to_markdown("t", {"target 1 token": stats}, {"device": "cpu"}, "python -m pipeline.bench.profile")
    assert "| target 1 token | lean |" in md and "## target 1 token: the ten ops with the most time" in md


def test_the_bench_and_the_profile_import_without_ray_and_mlflow():
    """A GPU machine's image may have neither (the H200 of 2026-11-26 had neither): the bench, its profile and the
    energy meters must import without them (pipeline.sweep imports its driver and runner lazily)."""
    code = (
        "import sys\n"
        "for m in ('ray', 'mlflow'): sys.modules[m] = None\n"
        "import pipeline.bench.__main__, pipeline.bench.profile, pipeline.measure.energy\n"
        "import pipeline.sweep as s\n"
        "assert callable(s.compose) and callable(s.expand)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
