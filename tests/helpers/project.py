"""A project folder for sweep, cell and tracking tests: a tiny pair on disk and a conf/ copy.

``make_project(tmp)`` writes a tiny random Llama target and draft (``save_pretrained``) with an offline
word-level tokenizer (with a chat template), a tiny MT-Bench-format question file, and a copy of the
repository's ``conf/`` extended with ``pair/tiny.yaml``, ``dataset/tiny_mt.yaml`` and ``sweep/tiny.yaml``.
Cells on it take a second or two of compute.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers.models import tiny_llama
from helpers.paths import REPO
from helpers.tokenizers import word_tokenizer
from pipeline import sweep


def make_project(root: Path) -> Path:
    """A project folder (conf/ + models/ + data/) for sweeps on tiny models; returns it."""
    root = Path(root)
    if (root / "conf" / "sweep" / "tiny.yaml").exists():
        return root
    tok = word_tokenizer()
    for name, seed, layers in (("target", 0, 2), ("draft", 0, 1)):  # draft = target's first layer: acceptance > 0
        model = tiny_llama(seed, vocab=len(tok), layers=layers, max_positions=4096, bos=1, eos=2, scale=8.0)
        model.save_pretrained(root / "models" / name)
        tok.save_pretrained(root / "models" / name)
    data = root / "data" / "tiny_mt"
    data.mkdir(parents=True)
    rows = [
        {"question_id": 100 + i, "category": "writing", "turns": [f"write a python function {i}", "return the value"]}
        for i in range(6)
    ]
    (data / "question.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    shutil.copytree(REPO / "conf", root / "conf")
    (root / "conf" / "pair" / "tiny.yaml").write_text(
        "name: tiny\nchat: true\ndtype: float32\ndevice: cpu\n"
        f"target:\n  id: {root / 'models' / 'target'}\ndraft:\n  id: {root / 'models' / 'draft'}\n"
    )
    (root / "conf" / "dataset" / "tiny_mt.yaml").write_text(
        "name: mt_bench\npath: data/tiny_mt\nsplit: null\nstart: 0\nlimit: 2\nids: null\n"
        "max_new_tokens: 8\nmax_turns: null\ntime_budget_s: null\noptions: {}\n"
    )
    (root / "conf" / "sweep" / "tiny.yaml").write_text(
        "# @package _global_\n"
        "sweep:\n  name: tiny\n  methods: [spd, block]\n  method_overrides: {}\n  baseline: ar\n"
        "  pairs: [tiny]\n"
        "  datasets: [{dataset: humaneval, limit: 2, max_new_tokens: 8}, tiny_mt]\n"
        "  seeds: [0]\n"
        "measure: {warmup_generations: 1, warmup_seconds: 0.0, warmup_samples: 1, idle_seconds: 0.0, "
        "energy_meter: none}\n"
        # test projects check scheduling, resume and logging, not speed: two tiny cells at a time on the
        # two CPUs (cpu_isolation: shared); tests of the isolation modes set them explicitly
        "cluster: {cell_timeout_s: 300, max_in_flight: 2, cpu_isolation: shared, cpus_per_cell: 1}\n"
    )
    return root


def overrides(root: Path, *extra: str) -> list[str]:
    """Overrides that keep MLflow inside ``root`` and the output quiet."""
    return [
        "sweep=tiny",
        f"tracking.uri=sqlite:///{root}/mlflow.db",
        f"tracking.artifact_root={root}/mlruns",
        "progress=false",
        *extra,
    ]


def run_sweep(root: Path, *extra: str):
    cfg = sweep.compose(overrides(root, *extra), root / "conf")
    return sweep.run(cfg, root=root)
