"""Cell and CellResult: typed, picklable, and the MLflow layout of a cell unchanged by them.

``tests/golden/cell_configs.json.gz`` holds what the planner logged for every cell of two shipped sweeps
before cells were typed (the dict ``config`` that ``_make_cell`` stored beside the fields): the MLflow
params of a cell are that config flattened, and ``cell_config.yaml`` is that config. ``Cell.config`` is
computed from the fields and must give the same names and values (paths under the repository are
written ``<repo>``). A change here changes the MLflow layout that stores and the analysis rely on.
The draft-based cells were re-recorded once for HARNESS_VERSION 3 (drafters as plugins: ``method.drafter``
became the drafter's scope, ``method.drafter.kind`` ..., and ``max_ngram``/``min_ngram`` left cells whose
drafter is not ngram); the other cells' entries are those of before. For HARNESS_VERSION 4 every entry's key,
``harness_version`` and the new ``weights`` (the content fingerprints of the local weights the cell reads)
were re-recorded; nothing else of any entry changed. For HARNESS_VERSION 5 every entry's key, ``harness_version``
and the new ``batch_size`` (after ``seed``) were re-recorded; nothing else changed. For HARNESS_VERSION 6 (the
loop's own clock) every entry's key and ``harness_version`` were re-recorded; nothing else changed.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import pickle
from pathlib import Path

import pytest
import yaml

from helpers.cells import make_cell
from helpers.paths import REPO
from pipeline import sweep
from pipeline.cell_types import STATUS_FAILED, STATUS_FINISHED, Cell, CellResult
from pipeline.decoding import cpu_kernels
from pipeline.tracking import Tracker, flatten
from pipeline.tracking.layout import param_value

GOLDEN = json.loads(gzip.decompress((REPO / "tests" / "golden" / "cell_configs.json.gz").read_bytes()))
CASES = {
    # the smoke sweep as it was when the golden file was recorded (2 samples x 64 tokens, every method at its
    # conf/method gamma): the layout is what is pinned here, not the smoke sweep's current settings
    "judged": [
        "sweep=smoke",
        "data_root=data",
        "judge.enabled=true",
        "judge.kind=openai",
        "judge.base_url=http://a:1/v1",
        "judge.model=m",
        "seeds=[0]",
        "sweep.methods=[ar,spd,block,mtad]",
        "sweep.datasets=[{dataset: humaneval, limit: 2, max_new_tokens: 64},"
        "{dataset: mt_bench, limit: 2, max_new_tokens: 64, max_turns: 1}]",
    ],
    # the methods of all_methods when the file was recorded: a fixed list, so that adding a method edits no pin here
    "all_methods": [
        "sweep=all_methods",
        "data_root=data",
        "sweep.methods=[ar,beam,mtjd,spd,block,mtad,bild,spectr,specinfer,mcss,typical,"
        "{method: typical, drafter: medusa, label: 'typical(medusa)'},medusa]",
    ],
}


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, list[Cell]]:
    # the capability the golden keys were made under (as conftest.bf16_cpu)
    patch = pytest.MonkeyPatch()
    for name in ("PIPELINE_CPU_BF16", "PIPELINE_BF16_KERNELS"):
        patch.delenv(name, raising=False)
    patch.setattr(cpu_kernels, "_cpu_flags", lambda: frozenset({"avx512_bf16", "avx512f"}))
    root = tmp_path_factory.mktemp("layout")
    (root / "data").symlink_to(REPO / "data", target_is_directory=True)
    try:
        return {case: sweep.expand(sweep.compose(overrides), root).cells for case, overrides in CASES.items()}
    finally:
        patch.undo()


def _portable(config: dict) -> dict:
    return json.loads(json.dumps(config).replace(str(REPO), "<repo>"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_planned_cells_give_the_logged_config_of_before(case, plans):
    cells = plans[case]
    got = [
        {
            "label": c.label,
            "dataset": c.dataset_name,
            "seed": c.seed,
            "key": c.key,
            "baseline": c.baseline,
            "config": _portable(c.config),
        }
        for c in cells
    ]
    assert [g["key"] for g in got] == [g["key"] for g in GOLDEN[case]]
    for mine, before in zip(got, GOLDEN[case]):
        assert mine == before, mine["label"]
        assert list(mine["config"]) == list(
            before["config"]
        )  # the same order too (cell_config.yaml sorts; JSON does not)
        assert flatten(mine["config"]) == flatten(before["config"])  # the params


def test_a_logged_cell_has_the_params_and_cell_config_of_before(plans, tmp_path):
    """Through MLflow: params and cell_config.yaml of a judged MT-Bench cell and of a scored HumanEval cell."""
    golden = {(g["label"], g["dataset"]): g["config"] for g in GOLDEN["judged"]}
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "layout", str(tmp_path / "mlruns"))
    for cell in plans["judged"]:
        if cell.label != "spd":
            continue
        run_id = tracker.log_cell(cell, CellResult(cell.key, status=STATUS_FINISHED, metrics={"tokens_per_s": 1.0}))
        run = tracker.client.get_run(run_id)
        expected = golden[(cell.label, cell.dataset_name)]
        assert {k: v.replace(str(REPO), "<repo>") for k, v in run.data.params.items()} == {
            k: param_value(v) for k, v in flatten(expected).items()
        }
        text = Path(tracker.client.download_artifacts(run_id, "cell_config.yaml", str(tmp_path / run_id))).read_text()
        assert _portable(yaml.safe_load(text)) == expected
        assert (
            run.data.tags["cell_key"] == cell.key
            and run.data.tags["label"] == "spd"
            and run.data.tags["sweep"] == "smoke"
        )
    tracker.close()


def test_config_is_computed_from_the_fields_not_stored():
    cell = make_cell(seed=1, params={"gamma": 4, "tau": 0.5}, method="mtad", label="mtad(tau=0.5)")
    assert "config" not in {f.name for f in dataclasses.fields(Cell)}
    moved = dataclasses.replace(cell, seed=2, params={"gamma": 5})
    assert moved.config["seed"] == 2 and moved.config["method"] == {"name": "mtad", "config": "mtad", "gamma": 5}
    assert cell.config["seed"] == 1 and cell.config["method"]["tau"] == 0.5  # the original is untouched
    with pytest.raises(dataclasses.FrozenInstanceError):
        cell.seed = 3  # type: ignore[misc]


def test_cell_and_result_pickle_as_ray_sends_them():
    cell = dataclasses.replace(
        make_cell(fault={"kind": "raise"}), isolation={"mode": "pinned", "threads": 1, "cores": [0]}
    )
    result = CellResult(
        cell.key, status=STATUS_FAILED, stage="generate", metrics={"cell_wall_s": 0.5}, error="E: x", traceback="tb"
    )
    assert pickle.loads(pickle.dumps(cell)) == cell
    back = pickle.loads(pickle.dumps(result))
    assert back == result and not back.finished and back.records == [] and back.scores is None
    assert CellResult("k").status == STATUS_FAILED and CellResult("k", status=STATUS_FINISHED).finished
