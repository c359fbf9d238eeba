"""Configuration errors name the valid keys; method defaults are written once (code and YAML agree)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline import sweep
from pipeline.data import DATASETS, dataset_module
from pipeline.decoding import METHODS, method_class
from pipeline.models import PairSpec, pair_config
from pipeline.scoring.registry import SCORERS, scorer_for

CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize("method", sorted(METHODS))
def test_method_yaml_lists_every_parameter_with_the_code_default(method):
    path = CONF / "method" / f"{method}.yaml"
    assert path.exists(), f"registered method {method!r} has no conf/method/{method}.yaml"
    written = yaml.safe_load(path.read_text())
    assert written.pop("name") == method
    defaults = {k: p.default for k, p in method_class(method).all_params().items()}
    assert written == defaults, f"conf/method/{method}.yaml and {method_class(method).__name__}'s Param defaults differ"


def test_every_method_yaml_names_a_registered_method():
    for path in CONF.glob("method/*.yaml"):
        assert yaml.safe_load(path.read_text())["name"] in METHODS, path


def test_a_misspelt_pair_key_is_refused_with_the_valid_keys():
    cfg = pair_config("smollm2-offline")
    cfg["meduza"] = cfg.pop("medusa")
    with pytest.raises(ValueError, match=r"unknown pair config key\(s\) \['meduza'\]; valid keys: .*'medusa'"):
        PairSpec.from_config(cfg)
    PairSpec.from_config(pair_config("smollm2-offline"))  # the shipped one is fine


@pytest.mark.parametrize(
    "override, message",
    [
        ("+sweep.method=spd", r"unknown key\(s\) \['method'\] under `sweep:`; valid keys: \['name', 'methods'"),
        ("+measure.warmup_secs=1", r"unknown key\(s\) \['warmup_secs'\] in `measure:`.*'warmup_seconds'"),
        ("+judge.modle=x", r"unknown key\(s\) \['modle'\] in `judge:`.*'model'"),
        ("+cluster.max_in_fligt=2", r"unknown key\(s\) \['max_in_fligt'\] in `cluster:`.*'max_in_flight'"),
        ("+pair.meduza=models/x", r"unknown pair config key\(s\) \['meduza'\]"),
        ("+dataset.limt=2", r"dataset 'humaneval': unknown key\(s\) \['limt'\].*'limit'"),
    ],
)
def test_unknown_keys_in_any_group_are_refused_before_ray(override, message, tmp_path):
    overrides = ["sweep=all_methods", "pair=smollm2-offline", "dataset=humaneval", "method=spd", override]
    with pytest.raises(sweep.SweepConfigError, match=message):
        sweep.expand(sweep.compose(overrides), tmp_path)


def test_every_dataset_names_a_registered_scorer_or_none():
    named = {dataset_module(name).SCORER for name in DATASETS}
    assert named - {None} <= set(SCORERS)
    assert {"humaneval", "spider", "rouge", "mt_bench"} <= named
    with pytest.raises(ValueError, match="registered scorers"):
        scorer_for("bleu")
