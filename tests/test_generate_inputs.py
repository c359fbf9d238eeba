"""``python -m pipeline.generate``: bad prompt, max_new_tokens or seed rejected before any model loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from helpers.paths import REPO
from pipeline import generate


def _cfg(**overrides):
    base = {
        "prompt": "Hello",
        "max_new_tokens": 8,
        "seed": 0,
        "method": {"name": "ar"},
        "pair": {"name": "nonexistent"},
    }
    base.update(overrides)
    return OmegaConf.create(base)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"prompt": 123}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"prompt": "  "}, "prompt"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": "many"}, "max_new_tokens"),
        ({"max_new_tokens": 1.5}, "max_new_tokens"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"seed": -1}, "seed"),
        ({"seed": "x"}, "seed"),
        ({"seed": 2**63}, "seed"),
    ],
)
def test_bad_inputs_rejected_before_models_load(monkeypatch, overrides, field):
    def no_loading(*_a, **_k):
        raise AssertionError("a model was loaded before the inputs were checked")

    monkeypatch.setattr(generate, "load_pair", no_loading)
    monkeypatch.setattr(generate.PairSpec, "from_config", no_loading)
    with pytest.raises(ValueError, match=field):
        generate.run(_cfg(**overrides))


def test_good_inputs_pass_the_check(monkeypatch):
    # the bounds are inclusive: 1 new token, the largest seed, a prompt with spaces around its text
    for overrides in ({}, {"max_new_tokens": 1}, {"seed": 2**63 - 1}, {"seed": 0}, {"prompt": "  Hello  "}):
        assert generate.check_inputs(_cfg(**overrides)) is None

    class PairReachedError(Exception):
        pass

    def reached(*_a, **_k):
        raise PairReachedError

    # and run() goes on past the check to the pair's models
    monkeypatch.setattr(generate.PairSpec, "from_config", reached)
    with pytest.raises(PairReachedError):
        generate.run(_cfg())


def test_cli_prompt_number_is_a_clear_error_not_a_traceback():
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.generate", "prompt=123"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 2
    assert "prompt must be a string" in out.stderr and "Traceback" not in out.stderr


def test_cli_a_model_not_on_this_machine_is_one_line_not_a_traceback():
    """Issue 57 (the trust round's note): a pair whose weights this machine cannot reach offline (the Hub is off,
    HF_HUB_OFFLINE=1) ends with exit 2 and one line naming the model, as bad input does, not a RuntimeError's
    traceback after the loading began."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.generate", "pair=llama3-8b-1b", "max_new_tokens=2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and out.stderr.strip().count("\n") <= 2
