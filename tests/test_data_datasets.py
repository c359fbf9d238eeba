"""Datasets: registry, offline loading of every dataset, ids the scorers use, slicing, local-file formats."""

from __future__ import annotations

import json

import pytest

from helpers.paths import DATA
from pipeline import sweep
from pipeline.data import load_dataset, stop_strings, task_names, task_spec


def test_every_dataset_has_a_task_spec_and_unknown_names_are_refused():
    shipped = {"chatalpaca", "chatgpt_prompts", "cnn_dm", "humaneval", "mt_bench", "spec_bench", "spider"}
    assert shipped <= set(task_names()) and task_names() == sorted(task_names())  # a new dataset joins: no pin to edit
    for name in task_names():
        task = task_spec(name)
        module = task.loader_module()
        assert (
            task.name == module.NAME == name and callable(module.load) and callable(task.prompt_module().continuation)
        )
    with pytest.raises(ValueError, match="datasets with a task: .*'humaneval'"):
        load_dataset("gsm8k")


def test_humaneval_from_the_package():
    samples = load_dataset("humaneval")
    assert len(samples) == 164 and samples[0].id == "HumanEval/0"
    ref = samples[0].reference
    assert ref["entry_point"] == "has_close_elements" and "def check" in ref["test"]
    assert samples[0].turns[0] == ref["prompt"]


def test_spider_ids_are_positions_in_dev_json():
    samples = load_dataset("spider", DATA / "spider")
    dev = json.loads((DATA / "spider" / "dev.json").read_text())
    assert len(samples) == len(dev) == 710
    for i in (0, 355, 709):
        assert samples[i].id == str(i) and samples[i].turns == [dev[i]["question"]]
        assert samples[i].reference["query"] == dev[i]["query"]
    schema = samples[0].meta["schema"]
    assert schema.startswith("CREATE TABLE") and schema.count("CREATE TABLE") == 4


def test_spider_needs_databases():
    with pytest.raises(ValueError, match="databases"):
        load_dataset("spider")


def test_mt_bench_two_turns_and_references():
    samples = load_dataset("mt_bench", DATA / "mt_bench")
    assert len(samples) == 64 and all(s.num_turns == 2 for s in samples)
    by_cat = {}
    for s in samples:
        by_cat.setdefault(s.category, []).append(s)
    assert len(by_cat) == 8 and all(len(v) == 8 for v in by_cat.values())
    assert all(s.reference for s in by_cat["math"]) and not any(s.reference for s in by_cat["writing"])
    assert samples[0].id == "81"


def test_spec_bench_groups_and_references():
    samples = load_dataset("spec_bench", DATA / "spec_bench")
    assert len(samples) == 464
    groups = {}
    for s in samples:
        groups.setdefault(s.meta["group"], []).append(s)
    assert set(groups) == {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}
    assert all(len(groups[g]) == 80 for g in groups if g != "mt_bench") and len(groups["mt_bench"]) == 64
    summ = load_dataset("spec_bench", DATA / "spec_bench", groups=["summarization"])
    assert len(summ) == 80 and all(isinstance(s.reference, str) and s.reference for s in summ)
    with pytest.raises(ValueError, match="groups"):
        load_dataset("spec_bench", DATA / "spec_bench", groups=["poetry"])
    with pytest.raises(ValueError, match="no official Hub copy"):
        load_dataset("spec_bench")


def test_cnn_dm_offline_sample_is_speed_only():
    samples = load_dataset("cnn_dm", DATA / "cnn_dailymail_sample" / "specbench_cnndm_80.jsonl")
    assert len(samples) == 80 and samples[0].id == "241"
    assert samples[0].reference is None and samples[0].turns[0].startswith("Summarize: ")


def test_cnn_dm_with_highlights_from_a_local_file(tmp_path):
    rows = [{"id": "abc", "article": "A long article.", "highlights": "Short."}]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (s,) = load_dataset("cnn_dm", path)
    assert s.id == "abc" and s.reference == "Short."


def test_chatgpt_prompts_and_chatalpaca_local_files(tmp_path):
    csv = tmp_path / "prompts.csv"
    csv.write_text('act,prompt\nLinux Terminal,"I want you to act as a linux terminal."\nPoet,"Write a poem."\n')
    samples = load_dataset("chatgpt_prompts", csv)
    assert [s.id for s in samples] == ["0", "1"] and samples[0].category == "Linux Terminal"
    conv = tmp_path / "chatalpaca-10k.json"
    conv.write_text(
        json.dumps(
            {
                "id": "7",
                "conversations": [
                    {"from": "human", "value": "Hi"},
                    {"from": "gpt", "value": "Hello"},
                    {"from": "human", "value": "More"},
                ],
            }
        )
        + "\n"
        + json.dumps({"id": "8", "conversations": [{"from": "human", "value": "Q"}]})
        + "\n"
    )
    samples = load_dataset("chatalpaca", conv)
    assert [(s.id, s.turns) for s in samples] == [("7", ["Hi"]), ("8", ["Q"])]
    assert load_dataset("chatalpaca", conv, max_turns=None)[0].turns == ["Hi", "More"]


def test_chatgpt_prompts_and_chatalpaca_are_reachable_from_a_sweep(tmp_path):
    """Both had a loader but no dataset config, so no sweep could name them; now each is a task of its own."""
    (tmp_path / "prompts.csv").write_text(
        'act,prompt\nPoet,"Write a poem."\nChef,"Plan a dinner."\nCoach,"Plan a run."\n'
    )
    (tmp_path / "chatalpaca-10k.json").write_text(
        "".join(
            json.dumps({"id": str(i), "conversations": [{"from": "human", "value": f"Q{i}"}]}) + "\n" for i in range(3)
        )
    )
    for name, path in (("chatgpt_prompts", tmp_path / "prompts.csv"), ("chatalpaca", tmp_path / "chatalpaca-10k.json")):
        cfg = sweep.compose(
            [
                "sweep=smoke",
                "data_root=data",
                "seeds=[0]",
                "sweep.methods=[ar]",
                f"dataset={name}",
                f"dataset.path={path}",
                "dataset.limit=2",
            ]
        )
        plan = sweep.expand(cfg)
        assert {c.dataset_name for c in plan.cells} == {name} and plan.sample_counts == {f"{name}[0:2]": 2}
        assert plan.cells[0].dataset["task"]["scorer"] is None  # measured for speed only


def test_slicing():
    assert [s.id for s in load_dataset("humaneval", start=10, limit=2)] == ["HumanEval/10", "HumanEval/11"]
    assert [s.id for s in load_dataset("humaneval", ids=["HumanEval/5", "HumanEval/1"])] == [
        "HumanEval/1",
        "HumanEval/5",
    ]
    with pytest.raises(KeyError):
        load_dataset("humaneval", ids=["HumanEval/999"])


def test_stop_strings_only_for_continuation_prompts():
    assert stop_strings("humaneval", chat=True) == ()
    assert "\ndef " in stop_strings("humaneval", chat=False)
