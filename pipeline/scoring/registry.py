"""The scorers a cell can run, by the name a dataset module gives in ``SCORER``.

A scorer takes the dataset config of the cell, the measured samples and the predictions
(``pipeline.measure.predictions_for_scoring``) and returns the scorer's result (``score``, ``metric``,
per-sample ``details``), or None where there is nothing to score (no references, no judge).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

from pipeline.data.base import Sample
from pipeline.data.mt_bench import load_judge_prompts
from pipeline.scoring import humaneval, mt_bench, rouge, spider

Predictions = list[dict[str, Any]]


class Scorer(Protocol):
    def __call__(
        self, dataset: Mapping[str, Any], samples: Sequence[Sample], predictions: Predictions, *,
        judge: Mapping[str, Any] | None = None, max_turns: int | None = None,
    ) -> dict[str, Any] | None: ...


def score_humaneval(dataset, samples, predictions, *, judge=None, max_turns=None):
    """pass@1 of the completions, executed in the sandbox."""
    problems = {s.id: {"task_id": s.id, **s.reference} for s in samples}
    return humaneval.score_predictions(predictions, problems, workers=1, ks=(1,))


def score_spider(dataset, samples, predictions, *, judge=None, max_turns=None):
    """Execution accuracy of the SQL against the gold query's result."""
    return spider.score_predictions(predictions, {s.id: s for s in samples})


def score_rouge(dataset, samples, predictions, *, judge=None, max_turns=None):
    """ROUGE-L against the references; None when a sample has none (the offline CNN/DM sample)."""
    refs = {s.id: s.reference for s in samples if s.reference}
    if len(refs) < len(samples):
        return None
    return rouge.score_predictions(predictions, refs)


def score_mt_bench(dataset, samples, predictions, *, judge=None, max_turns=None):
    """The MT-Bench judge's single-answer grades; None without ``judge.enabled`` (speed only)."""
    if not (judge and judge.get("enabled")):
        return None
    cfg = {k: v for k, v in judge.items() if k != "enabled"}
    templates = load_judge_prompts(dataset.get("path"))
    turns = tuple(range(1, (max_turns or 2) + 1))
    return mt_bench.judge_predictions(predictions, {s.id: s for s in samples}, mt_bench.make_judge(cfg), templates, turns=turns)


SCORERS: dict[str, Scorer] = {
    "humaneval": score_humaneval,
    "spider": score_spider,
    "rouge": score_rouge,
    "mt_bench": score_mt_bench,
}


def scorer_for(name: str | None) -> Scorer | None:
    """The scorer a dataset module names in ``SCORER`` (None: the dataset is measured for speed only)."""
    if name is None:
        return None
    if name not in SCORERS:
        raise ValueError(f"unknown scorer {name!r}; registered scorers: {sorted(SCORERS)} (pipeline/scoring/registry.py)")
    return SCORERS[name]
