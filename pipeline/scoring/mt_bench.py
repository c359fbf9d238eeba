"""MT-Bench single-answer grading with FastChat's judge prompts, by an HTTP or a local judge.

Follows ``fastchat/llm_judge`` (Zheng et al. 2023): turn 1 is judged with ``single-v1`` (or
``single-math-v1`` with the reference answer for math, reasoning and coding), turn 2 with the
``-multi-turn`` forms that show the whole conversation; the judge runs at temperature 0; the score is
parsed from the judge's LAST ``[[rating]]`` with the last ``[rating]`` as fallback (FastChat's patterns;
FastChat takes the first, which an answer that writes "Rating: [[10]]" wins as soon as the judge quotes
it); a rating that is not a number from 1 to 10 written plainly (``[[100]]``, ``[[07]]``, ``[[0]]``, 5,000
digits) makes that judgment unparseable, as does one the judge could not give (below). Unparseable
judgments are counted and excluded from the means. Scores are reported per turn, per category and overall.

Failures: a judgment whose request the endpoint refuses (HTTP 400, 413, 422) or answers with something
that is not a chat completion, after the retries, is lost alone (``error`` in its details, counted in
``num_failed``); an endpoint that cannot be reached, times out (``timeout_s`` is the whole request's
limit, however slowly the answer trickles in), answers 408/409/429/5xx or breaks off (``IncompleteRead``)
after the retries, or refuses with another client error (401, 403, 404: every request would be refused),
fails the scoring run (``JudgeUnavailableError``): the sweep keeps the generations and judges them again when
the judge is back, as it does when every judgment failed.

The judge is configured apart from the pair being measured:

- ``OpenAIJudge``: any OpenAI-compatible ``/chat/completions`` endpoint; the key is read from the
  environment variable the config names (never stored, printed or logged);
- ``TransformersJudge``: a local causal LM with a chat template, greedy decoding.

(both in ``pipeline.scoring.judges``, the HTTP request with its total time limit in
``pipeline.scoring.judge_http``). The judge's model name and the versions its endpoint reports are recorded with the
scores.
"""

from __future__ import annotations

import argparse
import re
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Iterable, Mapping, Sequence

from pipeline.data import load_dataset
from pipeline.data.mt_bench import load_judge_prompts
from pipeline.scoring import print_json, read_predictions, run_cli
from pipeline.scoring.judges import (
    Judge,
    JudgeUnavailableError,
    JudgmentFailedError,
    OpenAIJudge,
    TransformersJudge,
)

NEED_REF_CATS = ("math", "reasoning", "coding")  # FastChat's categories judged against a reference
# FastChat's one_score_pattern and one_score_pattern_backup (``\d+\.?\d*``), written so that a long run
# of digits is not scanned again and again.
ONE_SCORE = re.compile(r"\[\[(\d+(?:\.\d*)?)\]\]")
ONE_SCORE_BACKUP = re.compile(r"\[(\d+(?:\.\d*)?)\]")
# A rating on MT-Bench's 1-10 scale, written plainly: no leading zero, at most 16 characters.
VALID_RATING = re.compile(r"(?:10(?:\.0*)?|[1-9](?:\.\d*)?)")
MAX_RATING_CHARS = 16


# --------------------------------------------------------------------------- parsing and prompts


def parse_rating(judgment: str) -> float | None:
    """The score of a judgment: its last ``[[x]]``, else its last ``[x]``; None (FastChat's -1) when there
    is none or the last one is not a rating from 1 to 10 written plainly (``[[07]]``, ``[[100]]``, ``[[0]]``).

    The last, not the first: the judge gives its verdict at the end, after quoting or discussing the
    answer, which may itself say "Rating: [[10]]". An invalid last verdict is not replaced by an earlier one.
    """
    if not isinstance(judgment, str):
        return None
    for pattern in (ONE_SCORE, ONE_SCORE_BACKUP):
        last = None
        for last in pattern.finditer(judgment):  # noqa: B007 - the last match is the one kept
            pass
        if last is not None:
            numeral = last.group(1)
            if len(numeral) > MAX_RATING_CHARS or not VALID_RATING.fullmatch(numeral):
                return None
            return float(numeral)
    return None


def judge_prompt_name(category: str | None, turn: int, has_reference: bool) -> str:
    """The FastChat template for a question's category and turn (1 or 2)."""
    name = "single-math-v1" if (category in NEED_REF_CATS and has_reference) else "single-v1"
    return name + ("-multi-turn" if turn == 2 else "")


def build_judge_prompt(
    templates: Mapping[str, Mapping[str, str]],
    turns: Sequence[str],
    answers: Sequence[str],
    *,
    category: str | None,
    turn: int,
    reference: Sequence[str] | None = None,
) -> tuple[str, str, str]:
    """``(template name, system prompt, user prompt)`` for judging ``turn`` of one answered question."""
    if category in NEED_REF_CATS and not reference:
        raise ValueError(f"category {category!r} is judged against a reference answer, and none was given")
    name = judge_prompt_name(category, turn, bool(reference))
    template = templates[name]
    kwargs: dict[str, str] = {}
    if reference and category in NEED_REF_CATS:
        kwargs["ref_answer_1"] = reference[0]
        if len(reference) > 1:
            kwargs["ref_answer_2"] = reference[1]
    if turn == 1:
        user = template["prompt_template"].format(question=turns[0], answer=answers[0], **kwargs)
    else:
        user = template["prompt_template"].format(
            question_1=turns[0], question_2=turns[1], answer_1=answers[0], answer_2=answers[1], **kwargs
        )
    return name, template["system_prompt"], user


# --------------------------------------------------------------------------- scoring


def _answers(prediction: Any) -> list[str]:
    if isinstance(prediction, str):
        return [prediction]
    if isinstance(prediction, Mapping) and "turns" in prediction:
        return list(prediction["turns"])
    return list(prediction)


def judge_predictions(
    predictions: Iterable[Mapping[str, Any]],
    samples: Mapping[str, Any],
    judge: Judge,
    templates: Mapping[str, Mapping[str, str]],
    *,
    turns: Sequence[int] = (1, 2),
    workers: int = 1,
) -> dict[str, Any]:
    """Judge each answered question's turns; per-turn, per-category and overall means of valid scores.

    ``predictions``: ``id`` (question_id) and ``prediction`` (the list of answers, one per turn).
    ``samples``: MT-Bench samples by id (``pipeline.data.mt_bench``).
    """
    jobs = []
    for pred in predictions:
        sid = str(pred["id"])
        if sid not in samples:
            raise KeyError(f"unknown MT-Bench question id {sid!r}")
        sample = samples[sid]
        answers = _answers(pred["prediction"])
        for turn in turns:
            if turn > len(answers):
                raise ValueError(f"question {sid}: turn {turn} asked but {len(answers)} answer(s) given")
            name, system, user = build_judge_prompt(
                templates, sample.turns, answers, category=sample.category, turn=turn, reference=sample.reference
            )
            jobs.append((sid, sample.category, turn, name, system, user))

    def run(job):
        sid, category, turn, name, system, user = job
        error = None
        try:
            judgment = judge.complete(system, user)
        except JudgmentFailedError as err:  # this judgment alone is lost
            judgment, error = "", str(err)
        if not isinstance(judgment, str):
            judgment, error = "", f"the judge returned a {type(judgment).__name__}, not text"
        return {
            "id": sid,
            "category": category,
            "turn": turn,
            "judge_prompt": name,
            "score": None if error else parse_rating(judgment),
            "judgment": judgment,
            "error": error,
        }

    if workers > 1 and len(jobs) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(run, job) for job in jobs]
            wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f.done() and not f.cancelled() and f.exception() is not None), None)
            if failed is not None:  # the judge is gone: the requests not yet sent are not sent
                pool.shutdown(wait=True, cancel_futures=True)
                err = failed.exception()
                assert err is not None  # chosen for having one
                raise err
            details = [f.result() for f in futures]
    else:
        details = [run(job) for job in jobs]
    errors = [d["error"] for d in details if d["error"]]
    if details and len(errors) == len(details):
        raise JudgeUnavailableError(
            f"the judge gave none of the {len(details)} judgment(s); the first failure: {errors[0]}"
        )
    return summarize(details, judge.info())


def summarize(details: list[dict[str, Any]], judge_info: Mapping[str, Any]) -> dict[str, Any]:
    """Means over parsed scores (unparseable judgments, failed ones included, counted and excluded)."""
    valid = [d for d in details if d["score"] is not None]

    def avg(rows):
        return sum(r["score"] for r in rows) / len(rows) if rows else float("nan")

    categories = sorted({d["category"] for d in details if d["category"] is not None})
    turn_ids = sorted({d["turn"] for d in details})
    return {
        "metric": "mt_bench_score",
        "score": avg(valid),
        "per_turn": {str(t): avg([d for d in valid if d["turn"] == t]) for t in turn_ids},
        "per_category": {c: avg([d for d in valid if d["category"] == c]) for c in categories},
        "num_judgments": len(details),
        "num_unparseable": len(details) - len(valid),
        "num_failed": sum(bool(d.get("error")) for d in details),
        "judge": dict(judge_info),
        "details": details,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data", default=None, help="MT-Bench folder (question.jsonl, reference_answer/, judge_prompts.jsonl)"
    )
    parser.add_argument(
        "--predictions", required=True, help="JSONL of {id: question_id, prediction: [answer1, answer2]}"
    )
    parser.add_argument("--judge-prompts", default=None, help="FastChat judge_prompts.jsonl (default: next to --data)")
    judge = parser.add_mutually_exclusive_group(required=True)
    judge.add_argument("--judge-url", help="OpenAI-compatible base URL, e.g. https://api.openai.com/v1")
    judge.add_argument("--judge-local", help="local judge: a pair name (its target), a Hub id or a model folder")
    parser.add_argument("--judge-model", default="gpt-4", help="model name sent to the endpoint")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the key")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="local judge: tokens per judgment")
    parser.add_argument("--turns", default="1,2")
    parser.add_argument("--workers", type=int, default=4, help="parallel requests (HTTP judge)")
    args = parser.parse_args(argv)
    samples = {s.id: s for s in load_dataset("mt_bench", args.data)}
    templates = load_judge_prompts(args.judge_prompts or args.data)
    if args.judge_url:
        the_judge: Judge = OpenAIJudge(args.judge_url, args.judge_model, args.api_key_env)
        workers = args.workers
    else:
        the_judge = TransformersJudge.from_spec(args.judge_local, max_new_tokens=args.max_new_tokens)
        workers = 1
    result = judge_predictions(
        read_predictions(args.predictions),
        samples,
        the_judge,
        templates,
        turns=[int(t) for t in args.turns.split(",")],
        workers=workers,
    )
    print_json(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
