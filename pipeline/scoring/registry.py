"""The scorers a task can name (``task.scorer.name`` in ``conf/dataset/<name>.yaml``), each declaring itself.

A :class:`Scorer` says what it computes (``score``), the per-sample fields it writes (``fields``:
a task's ``score_fields`` must be among them), whether it needs the sweep's ``judge:`` (``uses_judge``:
only then does a cell carry the judge, and a judge change re-scores its logged generations), how to
check that judge's config when the sweep is planned (``check``), what to reach before any model loads
(``preflight``, e.g. the judge's HTTP endpoint) and how a run records who scored it (``identity``).

``score(dataset, samples, predictions, *, judge, max_turns, **params)`` takes the cell's dataset config,
the measured samples, the predictions (``pipeline.measure.records.predictions_for_scoring``) and the task's
``scorer.params``; it returns the scorer's result (``score``, ``metric``, per-sample ``details``) or None
where there is nothing to score (no references, no judge). A task names a scorer of ``SCORERS`` (the
project's one registry type, ``pipeline.registry.Registry``: a taken name is an error) or, for a scorer
outside this package, ``"module:attribute"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from pipeline.data.base import Sample
from pipeline.data.mt_bench import load_judge_prompts
from pipeline.registry import Registry
from pipeline.scoring import humaneval, judges, mt_bench, rouge, spider

Predictions = list[dict[str, Any]]
ScoreFn = Callable[..., "dict[str, Any] | None"]


def _no_judge(judge: Mapping[str, Any] | None) -> None:
    return None


@dataclass(frozen=True)
class Scorer:
    """A scorer and what it declares: the fields it writes, its judge and its checks."""

    name: str
    score: ScoreFn
    fields: tuple[str, ...]
    # the per-sample field (one of ``fields``) that is a sample's own score (the analysis's per-sample value)
    sample_value: str | None = None
    higher_is_better: bool = True  # the direction of its score (tables mark the best by it)
    uses_judge: bool = False
    check: Callable[[Mapping[str, Any] | None], Any] = _no_judge
    """Plan time, no network: raise ValueError on a judge config that cannot work."""
    preflight: Callable[[Mapping[str, Any] | None], Any] = _no_judge
    """Before any model loads: reach what scoring will need (ValueError naming the fix)."""
    identity: Callable[[Mapping[str, Any] | None], dict[str, Any] | None] = _no_judge
    """Who scores (the run's ``judge`` tag): a scorer whose identity changes scores the logged generations again."""

    def unscored_metric(self) -> str:
        """The run's ``score_metric`` when ``score`` returned None: ``speed_only`` without a judge, else ``none``."""
        return "speed_only" if self.uses_judge else "none"


def score_humaneval(
    dataset, samples: Sequence[Sample], predictions: Predictions, *, judge=None, max_turns=None, **params
):
    """pass@1 of the completions, executed in the sandbox."""
    problems = {s.id: {"task_id": s.id, **s.reference} for s in samples}
    return humaneval.score_predictions(predictions, problems, **{"workers": 1, "ks": (1,), **params})


def score_spider(dataset, samples: Sequence[Sample], predictions: Predictions, *, judge=None, max_turns=None, **params):
    """Execution accuracy of the SQL against the gold query's result."""
    return spider.score_predictions(predictions, {s.id: s for s in samples}, **params)


def score_rouge(dataset, samples: Sequence[Sample], predictions: Predictions, *, judge=None, max_turns=None, **params):
    """ROUGE-L against the references; None when a sample has none (the offline CNN/DM sample)."""
    refs = {s.id: s.reference for s in samples if s.reference}
    if len(refs) < len(samples):
        return None
    return rouge.score_predictions(predictions, refs, **params)


def score_mt_bench(
    dataset, samples: Sequence[Sample], predictions: Predictions, *, judge=None, max_turns=None, **params
):
    """The MT-Bench judge's single-answer grades; None without ``judge.enabled`` (speed only)."""
    if not (judge and judge.get("enabled")):
        return None
    cfg = {k: v for k, v in judge.items() if k != "enabled"}
    templates = load_judge_prompts(dataset.get("path"))
    turns = tuple(range(1, (max_turns or 2) + 1))
    return mt_bench.judge_predictions(
        predictions, {s.id: s for s in samples}, judges.make_judge(cfg), templates, turns=turns, **params
    )


def _scorer_problem(entry: Any) -> str | None:
    if not isinstance(entry, Scorer):
        return f"is a {type(entry).__name__}, not a pipeline.scoring.registry.Scorer"
    if entry.sample_value is not None and entry.sample_value not in entry.fields:
        return f"sample_value {entry.sample_value!r} is not one of its fields {list(entry.fields)}"
    return None


SCORERS: Registry[Scorer] = Registry("scorer", check=_scorer_problem)
for _scorer in (
    Scorer("humaneval", score_humaneval, fields=("passed", "result"), sample_value="passed"),
    Scorer("spider", score_spider, fields=("correct", "sql", "error", "timed_out"), sample_value="correct"),
    Scorer("rouge", score_rouge, fields=rouge.ROUGE_TYPES, sample_value="rougeL"),
    Scorer(
        "mt_bench",
        score_mt_bench,
        fields=("score", "judgment"),
        sample_value="score",
        uses_judge=True,
        check=judges.judge_identity,
        preflight=judges.preflight,
        identity=judges.judge_identity,
    ),
):
    SCORERS.register(_scorer)


def scorer_for(name: str | None) -> Scorer | None:
    """The scorer a task names (None: the task is measured for speed only); ``module:attribute`` is imported."""
    if name is None:
        return None
    return SCORERS.get(name)


def check_task_scorer(task: Any) -> Scorer | None:
    """A task's scorer, checked: it exists and declares every field the task copies onto records."""
    scorer = scorer_for(task.scorer)
    if scorer is not None:
        undeclared = sorted(set(task.score_fields) - set(scorer.fields))
        if undeclared:
            raise ValueError(
                f"task {task.name!r}: score field(s) {undeclared} are not written by scorer {scorer.name!r} "
                f"(it writes {list(scorer.fields)}); fix task.scorer.fields in conf/dataset/{task.name}.yaml"
            )
    elif task.score_fields:
        raise ValueError(f"task {task.name!r}: score fields {list(task.score_fields)} without a scorer")
    return scorer
