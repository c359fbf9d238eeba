"""Head folders (Medusa, EAGLE, EAGLE-3) are checked against their weights' shapes before anything is built.

Issue 36 item 9: a 2 MB Medusa folder whose config said ``hidden_size: 20000`` took 1.96 GB and 11.6 s before a
wall of size-mismatch errors; EAGLE heads loaded the same way. The check reads the safetensors header only and
builds the module the config describes on the meta device.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest
import torch

from helpers.models import tiny_llama
from pipeline.decoding import checkpoints
from pipeline.decoding.eagle import EagleHead, eagle_config, load_eagle, load_eagle_head, save_eagle_head
from pipeline.decoding.eagle3 import Eagle3Head, eagle3_config, load_eagle3_head, save_eagle3_head
from pipeline.decoding.medusa_heads import CONFIG_FILE, MedusaHeads, load_medusa_heads, save_medusa_heads


def _edit(path: Path, **changes) -> None:
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_a_medusa_config_bigger_than_its_weights_is_refused_before_building(tmp_path, monkeypatch):
    save_medusa_heads(MedusaHeads(16, 2), tmp_path, dtype=torch.float32)
    _edit(tmp_path / CONFIG_FILE, hidden_size=20000)
    read = []
    monkeypatch.setattr(checkpoints.LazyState, "__getitem__", lambda self, key: read.append(key))
    before = _peak_mb()
    with pytest.raises(
        ValueError,
        match=r"Medusa heads at .*: medusa_config.json does not match the weights "
        r"\(blocks.0.0.linear.bias: the config gives \[20000\], the file holds \[16\]",
    ):
        load_medusa_heads(tmp_path)
    assert read == []  # no tensor was read: the shapes come from the header
    assert _peak_mb() - before < 200  # 2 heads of 20000 x 20000 float32 would be 3.2 GB


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"num_heads": 5}, r"says 5 head\(s\) x 1 layer\(s\) \(10 tensors\), the weights hold 4"),
        ({"num_heads": 10**9}, r"says 1000000000 head\(s\)"),  # refused before even a meta build of a billion modules
        ({"hidden_size": -3}, r"medusa_config.json has hidden_size=-3; it must be a positive integer"),
        ({"num_layers": "2"}, r"num_layers='2'; it must be a positive integer"),
    ],
)
def test_medusa_configs_that_cannot_match_are_refused_with_the_file(tmp_path, changes, message):
    save_medusa_heads(MedusaHeads(16, 2), tmp_path, dtype=torch.float32)
    _edit(tmp_path / CONFIG_FILE, **changes)
    with pytest.raises(ValueError, match=message):
        load_medusa_heads(tmp_path)


def test_the_shipped_and_saved_heads_still_load(tmp_path):
    heads = MedusaHeads(16, 3, num_layers=2)
    save_medusa_heads(heads, tmp_path, dtype=torch.float32)
    again = load_medusa_heads(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(heads.state_dict().values(), again.state_dict().values()))


def test_an_eagle_config_wider_than_its_weights_is_refused_before_building(tmp_path):
    target = tiny_llama(6, vocab=64, hidden=32, layers=1)
    save_eagle_head(EagleHead(eagle_config(target.config)), tmp_path, dtype=torch.float32)
    _edit(tmp_path / "config.json", hidden_size=20000, intermediate_size=80000)
    before = _peak_mb()
    with pytest.raises(
        ValueError,
        match=r"EAGLE head at .*: config.json does not match the weights \(.*fc.weight: the config gives "
        r"\[20000, 40000\], the file holds \[32, 64\]",
    ):
        load_eagle_head(tmp_path)
    assert _peak_mb() - before < 200
    with pytest.raises(ValueError, match="does not match the weights"):
        load_eagle(tmp_path)


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
def test_an_eagle3_config_wider_than_its_weights_is_refused_before_building(tmp_path, layout):
    target = tiny_llama(31, vocab=48, hidden=32, layers=8, heads=4, kv_heads=2)
    head = Eagle3Head(eagle3_config(target.config), 48)
    head.t2d.fill_(True)  # a head over the whole vocabulary: draft id i is target id i
    save_eagle3_head(head, tmp_path, layout=layout, dtype=torch.float32, verifier="tiny")
    load_eagle3_head(tmp_path)  # as written, it loads
    config = json.loads((tmp_path / "config.json").read_text())
    layer = config.get("transformer_layer_config", config)
    layer.update(intermediate_size=200000)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match=r"EAGLE-3 head at .*: config.json does not match the weights \(.*mlp.*the config gives "
        r"\[200000, 32\]",
    ):
        load_eagle3_head(tmp_path)
