"""A small sweep of known runs in a real MLflow store, logged through ``pipeline.tracking.Tracker``.

Sweep ``fixture``: pair ``tiny``; datasets humaneval (scored, energy measured) and mt_bench (speed
only, no energy meter); labels ar, spd, mtad, mtad(tau=0.3) (an ablation over tau); seeds 0, 1, 2;
mtad(tau=0.3) on mt_bench seed 1 failed. Every cell has 4 generations whose pooled tokens/s,
tokens/step, score and perplexity equal the hand-chosen values below.
"""

from __future__ import annotations

import time

from helpers.cells import make_cell
from pipeline.cell_types import STATUS_FAILED, STATUS_FINISHED, Cell, CellResult, cell_key
from pipeline.tracking import Tracker

SWEEP = "fixture"
PAIR = "tiny"
DEVICE = "FakeGPU"
SEEDS = (0, 1, 2)
TOKENS = (20, 40, 60, 80)  # new tokens of the 4 generations of every cell (200 per cell)

# (dataset, label) -> per-seed values
TOKENS_PER_S = {
    ("humaneval", "ar"): (10.0, 12.0, 11.0),
    ("humaneval", "spd"): (20.0, 18.0, 25.0),
    ("humaneval", "mtad"): (30.0, 33.0, 27.0),
    ("humaneval", "mtad(tau=0.3)"): (31.0, 35.0, 29.0),
    ("mt_bench", "ar"): (8.0, 9.0, 10.0),
    ("mt_bench", "spd"): (16.0, 15.0, 17.0),
    ("mt_bench", "mtad"): (20.0, 22.0, 24.0),
    ("mt_bench", "mtad(tau=0.3)"): (21.0, None, 25.0),  # seed 1 failed
}
J_PER_TOKEN = {  # humaneval only (mt_bench: no energy meter)
    "ar": (2.0, 2.2, 2.1),
    "spd": (1.0, 1.2, 0.9),
    "mtad": (0.8, 0.7, 0.9),
    "mtad(tau=0.3)": (0.75, 0.7, 0.8),
}
ACCEPTED_PER_STEP = {
    "ar": (1.0, 1.0, 1.0),
    "spd": (2.0, 2.5, 2.0),
    "mtad": (2.5, 4.0, 2.5),
    "mtad(tau=0.3)": (4.0, 5.0, 4.0),
}
PERPLEXITY = {
    "ar": (3.0, 3.1, 2.9),
    "spd": (3.05, 2.95, 3.0),
    "mtad": (2.5, 2.6, 2.4),
    "mtad(tau=0.3)": (2.8, 2.7, 2.9),
}
PASSED = {  # humaneval per-sample verdicts per seed
    "ar": ((1, 0, 0, 1), (1, 0, 1, 0), (0, 0, 1, 1)),
    "spd": ((1, 0, 1, 1), (0, 0, 1, 0), (1, 0, 0, 1)),
    "mtad": ((1, 1, 1, 0), (1, 1, 0, 1), (1, 1, 1, 1)),
    "mtad(tau=0.3)": ((1, 1, 0, 0), (1, 0, 1, 1), (1, 1, 1, 0)),
}
METHODS = {
    "ar": ("ar", {}),
    "spd": ("spd", {"gamma": 4}),
    "mtad": ("mtad", {"gamma": 4, "tau": 0.5, "num_beams": 4}),
    "mtad(tau=0.3)": ("mtad", {"gamma": 4, "tau": 0.3, "num_beams": 4}),
}


def _cell(label: str, dataset: str, seed: int) -> Cell:
    name, params = METHODS[label]
    params = {"temperature": 1.0, "top_k": 10, "top_p": 0.9, **params}
    ds = {"name": dataset, "limit": 4, "max_new_tokens": 64}
    identity = {"method": {"name": name, "params": params}, "pair": {"name": PAIR}, "dataset": ds, "seed": seed}
    return make_cell(
        cell_key(identity),
        sweep=SWEEP,
        label=label,
        method=name,
        params=params,
        pair={"name": PAIR, "chat": True},
        dataset=ds,
        seed=seed,
        harness="1",
    )


def _result(label: str, dataset: str, seed: int) -> CellResult:
    key = _cell(label, dataset, seed).key
    tps = TOKENS_PER_S[(dataset, label)][seed]
    if tps is None:
        return CellResult(
            key,
            status=STATUS_FAILED,
            stage="generate",
            error="RuntimeError: injected",
            traceback="Traceback ...",
            metrics={"cell_wall_s": 1.0},
        )
    acc = ACCEPTED_PER_STEP[label][seed]
    ppl = PERPLEXITY[label][seed]
    records = []
    for i, n in enumerate(TOKENS):
        steps = n / acc
        assert steps == int(steps)
        rec = {
            "id": f"s{i}",
            "turn": 0,
            "new_tokens": n,
            "steps": int(steps),
            "draft_steps": 0 if label == "ar" else 4 * int(steps),
            "accepted": [acc] * int(steps),
            "decode_s": n / tps,
            "tokens_per_s": tps,
            "perplexity": ppl,
            "hit_eos": False,
        }
        if dataset == "humaneval":
            rec["score_detail"] = {"passed": bool(PASSED[label][seed][i])}
        records.append(rec)
    tokens, decode = sum(TOKENS), sum(r["decode_s"] for r in records)
    metrics = {
        "tokens_per_s": tokens / decode,
        "decode_s": decode,
        "new_tokens": tokens,
        "generations": len(records),
        "target_steps": sum(r["steps"] for r in records),
        "draft_steps": sum(r["draft_steps"] for r in records),
        "accepted_per_step": tokens / sum(r["steps"] for r in records),
        "accepted_per_step_mean_of_samples": acc,
        "perplexity": ppl,
        "energy_available": dataset == "humaneval",
    }
    scores, score_metric = None, "speed_only"
    if dataset == "humaneval":
        jpt = J_PER_TOKEN[label][seed]
        metrics.update(energy_j=jpt * tokens, j_per_token=jpt, dynamic_j_per_token=jpt / 2, idle_power_w=50.0)
        score = sum(PASSED[label][seed]) / len(TOKENS)
        metrics["score"] = score
        scores, score_metric = {"score": score, "metric": "pass@1", "details": []}, "pass@1"
        energy = {"meter": "nvml", "available": True, "energy_j": jpt * tokens}
    else:
        metrics.update(j_per_token=None, energy_j=None)
        energy = {"meter": "none", "available": False, "energy_j": None, "reason": "no energy meter (fixture)"}
    wall = decode + 20.0  # the cell's own time: decode plus load and scoring (the run's Duration column)
    ended = time.time()
    return CellResult(
        key,
        status=STATUS_FINISHED,
        stage="done",
        metrics=metrics,
        records=records,
        scores=scores,
        score_metric=score_metric,
        device={"device": "cuda:0", "gpu_name": DEVICE, "git_commit": "abc"},
        summary=dict(metrics),
        energy=energy,
        started_at=ended - wall,
        ended_at=ended,
    )


def build_store(root) -> str:
    """Log the fixture sweep into ``sqlite:///<root>/mlflow.db`` (artifacts under ``<root>/mlruns``)."""
    uri = f"sqlite:///{root}/mlflow.db"
    tracker = Tracker(uri, SWEEP, str(root / "mlruns"))
    tracker.start_parent("fixture run", {"sweep": SWEEP}, {"cells.total": 24})
    for (dataset, label), values in TOKENS_PER_S.items():
        for seed in SEEDS:
            tracker.log_cell(_cell(label, dataset, seed), _result(label, dataset, seed))
    tracker.end_parent("FINISHED", {"cells_ran": 24})
    return uri


_STORE: dict[str, str] = {}


def store(tmp_path_factory) -> str:
    """The fixture store, built once per test session."""
    if "uri" not in _STORE:
        _STORE["uri"] = build_store(tmp_path_factory.mktemp("analysis_store"))
    return _STORE["uri"]
