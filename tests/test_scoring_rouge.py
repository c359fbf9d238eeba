"""ROUGE scorer: rouge-score F1 per sample, seeded bootstrap, references by id, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.paths import REPO
from pipeline.data import load_dataset
from pipeline.scoring import rouge

SPEC_BENCH = REPO / "data" / "spec_bench"


def test_identical_and_disjoint_texts():
    scores = rouge.rouge_per_sample(["the cat sat on the mat", "alpha beta"], ["the cat sat on the mat", "gamma delta"])
    assert scores[0]["rougeL"] == pytest.approx(1.0)
    assert scores[1]["rougeL"] == 0.0


def test_rouge_l_matches_hand_computation():
    # LCS("a b c d", "a c d e") = "a c d" (3); P = 3/4, R = 3/4, F = 0.75
    scores = rouge.rouge_per_sample(["a c d e"], ["a b c d"], types=("rougeL",), use_stemmer=False)
    assert scores[0]["rougeL"] == pytest.approx(0.75)


def test_multiple_references_take_the_best():
    scores = rouge.rouge_per_sample(["the cat sat"], [["a dog ran", "the cat sat"]])
    assert scores[0]["rougeL"] == pytest.approx(1.0)


def test_bootstrap_is_seeded_and_brackets_the_mean():
    values = [0.1, 0.5, 0.3, 0.9, 0.2, 0.4, 0.7]
    a = rouge.bootstrap_interval(values, seed=3)
    assert a == rouge.bootstrap_interval(values, seed=3)
    assert a != rouge.bootstrap_interval(values, seed=4)
    assert a[0] < sum(values) / len(values) < a[1]
    assert rouge.bootstrap_interval([0.5] * 5) == (0.5, 0.5)


def test_score_predictions_reports_mean_and_interval():
    refs = {"1": "the cat sat on the mat", "2": "dogs bark loudly at night"}
    preds = [{"id": "1", "prediction": "the cat sat on a mat"}, {"id": "2", "prediction": "cats sleep"}]
    result = rouge.score_predictions(preds, refs, seed=0, resamples=200)
    assert result["metric"] == "rougeL" and result["num_samples"] == 2
    per = [d["rougeL"] for d in result["details"]]
    assert result["score"] == pytest.approx(sum(per) / 2)
    lo, hi = result["rougeL"]["ci"]
    assert lo <= result["score"] <= hi


def test_missing_reference_is_an_error():
    with pytest.raises(KeyError, match="no reference"):
        rouge.score_predictions([{"id": "7", "prediction": "x"}], {"7": None})


def test_cli_on_spec_bench_summaries(tmp_path):
    samples = load_dataset("spec_bench", SPEC_BENCH, groups=["summarization"], limit=3)
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"id": s.id, "prediction": s.reference}) + "\n" for s in samples))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.scoring.rouge",
            "--dataset",
            "spec_bench",
            "--data",
            str(SPEC_BENCH),
            "--predictions",
            str(preds),
            "--resamples",
            "100",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["num_samples"] == 3 and result["score"] == pytest.approx(1.0)


def test_readme_command_without_dataset_reads_spec_bench(tmp_path):
    # the README's form: `python -m pipeline.scoring.rouge --data data/spec_bench --predictions ...`
    samples = load_dataset("spec_bench", SPEC_BENCH, groups=["summarization"], limit=2)
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"id": s.id, "prediction": s.reference}) + "\n" for s in samples))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.scoring.rouge",
            "--data",
            str(SPEC_BENCH),
            "--predictions",
            str(preds),
            "--resamples",
            "50",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout)["score"] == pytest.approx(1.0)


def test_data_no_reference_dataset_reads_is_a_clear_error(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"id": "1"}\n')
    preds = tmp_path / "preds.jsonl"
    preds.write_text('{"id": "1", "prediction": "x"}\n')
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.scoring.rouge", "--data", str(tmp_path), "--predictions", str(preds)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "pass --dataset" in out.stderr and "Traceback" not in out.stderr
