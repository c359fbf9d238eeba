"""MT-Bench judge: FastChat prompts and parsing, an OpenAI-compatible server on loopback, the local judge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.judge import JudgeServer
from pipeline.data import load_dataset
from pipeline.data.mt_bench import load_judge_prompts
from pipeline.scoring import mt_bench as mb

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data" / "mt_bench"
KEY_ENV = "PIPELINE_TEST_JUDGE_KEY"
KEY = "sk-test-not-a-real-key"


@pytest.fixture(scope="module")
def samples():
    return {s.id: s for s in load_dataset("mt_bench", DATA)}


@pytest.fixture(scope="module")
def templates():
    return load_judge_prompts(DATA)


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "judgment, score",
    [
        ("The answer is helpful and accurate.\n\nRating: [[8]]", 8.0),
        ("Rating: [[7.5]]", 7.5),
        ("Rating: [[10]]", 10.0),
        ("I would give it [[3]] rather than [[9]]", 3.0),  # first match, as FastChat
        ("Rating: [6]", 6.0),  # fallback form
        ("see [1] for details. Rating: [[4]]", 4.0),  # the double-bracket form wins over an earlier [x]
        ("Rating: 7/10", None),
        ("Rating: [[seven]]", None),
        ("", None),
    ],
)
def test_parse_rating_fastchat_cases(judgment, score):
    assert mb.parse_rating(judgment) == score


def test_judge_prompts_follow_fastchat(samples, templates):
    writing = next(s for s in samples.values() if s.category == "writing")
    math = next(s for s in samples.values() if s.category == "math")
    name, system, user = mb.build_judge_prompt(templates, writing.turns, ["A1", "A2"], category="writing", turn=1)
    assert name == "single-v1" and system == "You are a helpful assistant."
    assert writing.turns[0] in user and "A1" in user and "A2" not in user
    name, system, user = mb.build_judge_prompt(templates, writing.turns, ["A1", "A2"], category="writing", turn=2)
    assert name == "single-v1-multi-turn" and "second user question" in system
    assert writing.turns[1] in user and "A1" in user and "A2" in user
    name, _, user = mb.build_judge_prompt(
        templates, math.turns, ["A1", "A2"], category="math", turn=2, reference=math.reference
    )
    assert name == "single-math-v1-multi-turn"
    assert math.reference[0] in user and math.reference[1] in user
    with pytest.raises(ValueError, match="reference"):
        mb.build_judge_prompt(templates, math.turns, ["A1", "A2"], category="math", turn=1, reference=None)


def test_reference_answers_cover_the_reference_categories(samples):
    for s in samples.values():
        if s.category in mb.NEED_REF_CATS:
            assert s.reference and len(s.reference) == 2, s.id


# ----------------------------------------------------------------------------- HTTP judge


def _reply_by_category(body):
    """Scores that depend on what is judged, so the test can check the aggregation."""
    user = body["messages"][1]["content"]
    if "GOOD" in user and "second" in body["messages"][0]["content"]:
        return "Fine second turn. Rating: [[9]]"
    if "GOOD" in user:
        return "Explanation... Rating: [[8]]"
    if "MEH" in user:
        return "Rating: [4]"  # fallback form
    return "I cannot decide."  # unparseable


def test_http_judge_end_to_end(monkeypatch, samples, templates):
    monkeypatch.setenv(KEY_ENV, KEY)
    writing = [s for s in samples.values() if s.category == "writing"][:2]
    coding = [s for s in samples.values() if s.category == "coding"][:1]
    preds = [
        {"id": writing[0].id, "prediction": ["GOOD one", "GOOD two"]},
        {"id": writing[1].id, "prediction": ["MEH one", "MEH two"]},
        {"id": coding[0].id, "prediction": ["??", "??"]},
    ]
    with JudgeServer(_reply_by_category, fail_first=1, version="-0613", fingerprint="fp_test") as server:
        judge = mb.OpenAIJudge(server.url, "gpt-4", api_key_env=KEY_ENV, retry_sleep_s=0.01)
        result = mb.judge_predictions(preds, samples, judge, templates, workers=2)
    assert all(a == f"Bearer {KEY}" for a in server.auth)
    assert len(server.requests) == 6
    body = server.requests[0]
    assert body["temperature"] == 0 and body["model"] == "gpt-4" and body["messages"][0]["role"] == "system"
    assert result["num_judgments"] == 6 and result["num_unparseable"] == 2
    assert result["per_category"]["writing"] == pytest.approx((8 + 9 + 4 + 4) / 4)
    assert result["per_category"]["coding"] != result["per_category"]["coding"]  # NaN: all excluded
    assert result["per_turn"] == {"1": pytest.approx(6.0), "2": pytest.approx(6.5)}
    assert result["score"] == pytest.approx(25 / 4)
    assert result["judge"]["versions_reported"] == ["gpt-4-0613 (fp_test)"]
    assert KEY not in json.dumps(result) and KEY not in repr(judge)
    prompts = {(d["id"], d["turn"]): d["judge_prompt"] for d in result["details"]}
    assert prompts[(coding[0].id, 1)] == "single-math-v1" and prompts[(coding[0].id, 2)] == "single-math-v1-multi-turn"


def test_http_judge_gives_up_on_client_errors(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with JudgeServer(lambda body: "x") as server:
        judge = mb.OpenAIJudge(server.url + "/wrong", "gpt-4", api_key_env=KEY_ENV, retry_sleep_s=0.01)
        with pytest.raises(RuntimeError, match="HTTP 404"):
            judge.complete("s", "u")
    assert server.auth == [None]  # no key in the environment: no Authorization header


def test_cli_with_http_judge(tmp_path, monkeypatch, samples):
    qid = next(s.id for s in samples.values() if s.category == "roleplay")
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"id": qid, "prediction": ["GOOD", "GOOD"]}) + "\n")
    with JudgeServer(_reply_by_category) as server:
        env = dict(os.environ, **{KEY_ENV: KEY})
        out = subprocess.run(
            [sys.executable, "-m", "pipeline.scoring.mt_bench", "--data", str(DATA), "--predictions", str(preds),
             "--judge-url", server.url, "--api-key-env", KEY_ENV],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=True, env=env,
        )
    result = json.loads(out.stdout)
    assert result["score"] == pytest.approx(8.5) and result["per_category"] == {"roleplay": pytest.approx(8.5)}
    assert KEY not in out.stdout and KEY not in out.stderr


# ----------------------------------------------------------------------------- local judge


def test_local_transformers_judge_on_the_offline_model(samples, templates):
    """End to end with SmolLM2-135M as judge: per-category scores come out (a tiny judge rarely rates)."""
    torch.set_num_threads(1)
    judge = mb.TransformersJudge.from_spec("smollm2-offline", device="cpu", max_new_tokens=24)
    chosen = [next(s for s in samples.values() if s.category == c) for c in ("writing", "math")]
    preds = [{"id": s.id, "prediction": ["Here is my answer.", "And the second one."]} for s in chosen]
    result = mb.judge_predictions(preds, samples, judge, templates)
    assert result["num_judgments"] == 4
    assert set(result["per_category"]) == {"writing", "math"}
    assert result["judge"]["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    for d in result["details"]:
        assert isinstance(d["judgment"], str) and d["judgment"]
        assert d["score"] == mb.parse_rating(d["judgment"])
    assert 0 <= result["num_unparseable"] <= 4
