"""Spec-Bench export: a sweep's cells as Spec-Bench answer files that its own ``evaluation/speed.py``
reads with the speed-up and mean accepted tokens of our report's per-category leaderboard.

The store is made through ``pipeline.tracking`` with Spec-Bench questions of every task group (ids and
categories from the project's data/spec_bench), methods ar and spd, seeds 0 and 1 (Spec-Bench's
"runs"). ``speed`` is Spec-Bench's function (hemingkx/Spec-Bench, evaluation/speed.py, Apache-2.0),
vendored as published in ``helpers/vendor/spec_bench.py`` with only its printing left out; it
re-tokenises the baseline's answers with a tokenizer that adds a BOS token, as Vicuna's does (hence
its ``- 1``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from analysis import specbench
from analysis.report import write_report
from helpers.cells import make_cell
from helpers.paths import REPO
from helpers.vendor.spec_bench import speed
from pipeline.cell_types import STATUS_FINISHED, CellResult, cell_key
from pipeline.tracking import Tracker

WORDS = [f"w{i}" for i in range(40)]
SEEDS = (0, 1)


def _tokenizer_dir(path: Path) -> Path:
    vocab = {w: i for i, w in enumerate(["[UNK]", "<s>", "</s>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>").save_pretrained(
        path
    )
    return path


def _questions() -> list[dict]:
    """Two Spec-Bench questions of every task group (MT-Bench ones with both turns)."""
    rows = [json.loads(line) for line in (REPO / "data" / "spec_bench" / "question.jsonl").read_text().splitlines()]
    picked, seen = [], {}
    for r in rows:
        group = specbench.group_of(r["category"])
        if seen.get(group, 0) < 2:
            seen[group] = seen.get(group, 0) + 1
            picked.append(r)
    assert set(seen) == set(specbench.GROUPS)
    return picked


def _records(label: str, seed: int, questions: list[dict]) -> list[dict]:
    rng = random.Random(f"{label}-{seed}")
    out = []
    for q in questions:
        for turn in range(len(q["turns"])):
            n = rng.randint(5, 30)
            if label == "ar":
                accepted = [1] * n
            else:
                accepted, left = [], n
                while left:
                    accepted.append(min(left, rng.randint(1, 4)))
                    left -= accepted[-1]
            rate = (10.0 if label == "ar" else 17.0) * rng.uniform(0.7, 1.3)
            text = " ".join(rng.choice(WORDS) for _ in range(n))
            out.append(
                {
                    "id": str(q["question_id"]),
                    "turn": turn,
                    "category": q["category"],
                    "new_tokens": n,
                    "steps": len(accepted),
                    "draft_steps": 0,
                    "accepted": accepted,
                    "decode_s": n / rate,
                    "tokens_per_s": rate,
                    "text": text,
                    "hit_eos": False,
                }
            )
    return out


def _build_store(root: Path) -> str:
    uri = f"sqlite:///{root}/mlflow.db"
    tracker = Tracker(uri, "sb", str(root / "mlruns"))
    tracker.start_parent("sb run", {"sweep": "sb"}, {})
    questions = _questions()
    for label in ("ar", "spd"):
        for seed in SEEDS:
            ds = {"name": "spec_bench", "limit": len(questions), "max_new_tokens": 32}
            identity = {"method": label, "dataset": ds, "seed": seed}
            key = cell_key(identity)
            cell = make_cell(
                key, sweep="sb", label=label, method=label, params={}, pair={"name": "tiny"}, dataset=ds, seed=seed
            )
            records = _records(label, seed, questions)
            tokens, decode = sum(r["new_tokens"] for r in records), sum(r["decode_s"] for r in records)
            metrics = {
                "tokens_per_s": tokens / decode,
                "decode_s": decode,
                "new_tokens": tokens,
                "accepted_per_step": tokens / sum(r["steps"] for r in records),
            }
            tracker.log_cell(
                cell,
                CellResult(
                    key,
                    status=STATUS_FINISHED,
                    stage="done",
                    metrics=metrics,
                    records=records,
                    score_metric="speed_only",
                    device={"device": "cpu"},
                ),
            )
    tracker.end_parent("FINISHED", {})
    return uri


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("specbench")
    uri = _build_store(root)
    written = write_report("sb", uri, root / "report", notebooks=(), n_boot=20, log=lambda *a: None)
    return root, written


def test_answer_files_have_spec_benchs_format(report):
    _, written = report
    files = written["specbench"]["files"]
    assert set(files) == {("tiny", label, seed) for label in ("ar", "spd") for seed in SEEDS}
    path = files[("tiny", "spd", 1)]
    assert path.parent.name == "run_1" and path.name == "tiny-spd.jsonl"
    lines = specbench.read_answers(path)
    questions = {q["question_id"]: q for q in _questions()}
    assert [a["question_id"] for a in lines] == list(questions)  # ints, in the dataset's order
    records = _records("spd", 1, _questions())
    for a in lines:
        q = questions[a["question_id"]]
        assert a["category"] == q["category"] and a["model_id"] == "tiny-spd"
        (choice,) = a["choices"]
        mine = [r for r in records if r["id"] == str(q["question_id"])]
        assert len(choice["turns"]) == len(q["turns"]) == len(choice["wall_time"]) == len(choice["new_tokens"])
        assert choice["turns"] == [r["text"] for r in mine]
        assert choice["new_tokens"] == [r["new_tokens"] for r in mine]
        assert choice["wall_time"] == pytest.approx([r["decode_s"] for r in mine])
        assert choice["accept_lengths"] == [x for r in mine for x in r["accepted"]]
        assert choice["decoding_steps"] == [len(r["accepted"]) for r in mine]
        assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"])


def test_spec_benchs_speed_py_gives_the_reports_leaderboard(report, tmp_path):
    root, written = report
    tok = str(_tokenizer_dir(tmp_path / "tok"))
    board = written["specbench"]["board"].set_index(["label", "task"])
    files = written["specbench"]["files"]
    assert set(board.index.get_level_values("task")) == {*specbench.GROUPS, "overall"}
    for task in (*specbench.GROUPS, "overall"):
        ratios, accepts = [], []
        for seed in SEEDS:  # speed.py's get_mean_speedup: run k of the method against run k of the baseline
            _, _, ratio, acc = speed(files[("tiny", "spd", seed)], files[("tiny", "ar", seed)], tok, task=task)
            ratios.append(ratio)
            accepts.extend(acc)
        assert board.at[("spd", task), "speedup"] == pytest.approx(np.mean(ratios), rel=1e-9)
        assert board.at[("spd", task), "speedup_std"] == pytest.approx(np.std(ratios, ddof=1), rel=1e-9)
        assert board.at[("spd", task), "mean_accepted_tokens"] == pytest.approx(np.mean(accepts), rel=1e-12)
        assert (
            board.at[("ar", task), "speedup"] == pytest.approx(1.0)
            and board.at[("ar", task), "mean_accepted_tokens"] == 1.0
        )
    text = (root / "report" / "specbench" / "leaderboard.md").read_text()
    assert "Multi-turn Conversation" in text and "#Mean Accepted Tokens" in text
    overall = board.at[("spd", "overall"), "speedup"]
    assert f"{overall:.2f}x" in text.split("| spd |")[1].splitlines()[0]


def test_categories_come_from_the_data_for_records_without_them(tmp_path):
    questions = _questions()
    records = [{k: v for k, v in r.items() if k != "category"} for r in _records("spd", 0, questions)]
    data = specbench._categories_from_data(REPO / "data" / "spec_bench", "spec_bench")
    lines = specbench.answers_from_records(records, "m", categories=data)
    assert [a["category"] for a in lines] == [q["category"] for q in questions]


def test_cli_without_spec_bench_cells_is_a_clear_error(report, capsys):
    root, _ = report
    assert (
        specbench.main(
            [
                "--sweep",
                "sb",
                "--tracking-uri",
                f"sqlite:///{root}/mlflow.db",
                "--dataset",
                "humaneval",
                "--out",
                str(root / "x"),
            ]
        )
        == 2
    )
    assert "no finished humaneval cells" in capsys.readouterr().err
