"""ROUGE with Google's ``rouge-score`` package: per-sample F1, the mean and a seeded bootstrap interval.

ROUGE-L is the headline figure (``score``); ROUGE-1/2 and ROUGE-Lsum (sentences split on newlines, the
usual CNN/DailyMail variant) come along. Porter stemming is on, as in the summarization literature.
A sample with several references is scored against the best-matching one (``score_multi``).
"""

from __future__ import annotations

import argparse
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pipeline.data import load_dataset
from pipeline.scoring import print_json, read_predictions, run_cli, scorer_package

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
HEADLINE = "rougeL"


def _scorer(types: Sequence[str], use_stemmer: bool):
    # 2.5 s of nltk, paid only by cells that score ROUGE (the registry imports this module in every cell)
    rouge_scorer = scorer_package("rouge_score.rouge_scorer", "rouge_score", "rouge")
    return rouge_scorer.RougeScorer(list(types), use_stemmer=use_stemmer)


def rouge_per_sample(
    predictions: Sequence[str],
    references: Sequence[str | Sequence[str]],
    types: Sequence[str] = ROUGE_TYPES,
    use_stemmer: bool = True,
) -> list[dict[str, float]]:
    """F1 of each ROUGE type for each (prediction, reference) pair."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    scorer = _scorer(types, use_stemmer)
    out = []
    for pred, ref in zip(predictions, references):
        if isinstance(ref, str):
            scores = scorer.score(ref, pred)
        else:
            scores = scorer.score_multi(list(ref), pred)
        out.append({t: float(scores[t].fmeasure) for t in types})
    return out


def bootstrap_interval(
    values: Sequence[float], *, seed: int = 0, resamples: int = 1000, confidence: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (seeded: the same values give the same interval)."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = array[rng.integers(0, array.size, size=(resamples, array.size))].mean(axis=1)
    alpha = (1.0 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def score_predictions(
    predictions: Iterable[Mapping[str, Any]],
    references: Mapping[str, str | Sequence[str]],
    *,
    types: Sequence[str] = ROUGE_TYPES,
    seed: int = 0,
    resamples: int = 1000,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """ROUGE of predictions (``id``, ``prediction``: the summary) against ``references`` by id."""
    predictions = list(predictions)
    missing = [str(p["id"]) for p in predictions if references.get(str(p["id"])) in (None, "", [])]
    if missing:
        raise KeyError(f"no reference for sample ids {missing[:5]} (the dataset copy may lack references)")
    per_sample = rouge_per_sample(
        [p["prediction"] or "" for p in predictions], [references[str(p["id"])] for p in predictions], types
    )
    result: dict[str, Any] = {
        "metric": HEADLINE if HEADLINE in types else types[0],
        "num_samples": len(per_sample),
        "bootstrap": {"seed": seed, "resamples": resamples, "confidence": confidence},
    }
    for t in types:
        values = [s[t] for s in per_sample]
        lo, hi = bootstrap_interval(values, seed=seed, resamples=resamples, confidence=confidence)
        result[t] = {"mean": float(np.mean(values)) if values else float("nan"), "ci": [lo, hi]}
    result["score"] = result[result["metric"]]["mean"]
    result["details"] = [{"id": str(p["id"]), **s} for p, s in zip(predictions, per_sample)]
    return result


REFERENCE_DATASETS = ("cnn_dm", "spec_bench")


def _load_references_dataset(name: str | None, path: str | None, split: str | None) -> list:
    """Samples of ``name``; without a name, of the first reference dataset whose loader reads ``path``."""
    if name or not path:
        return load_dataset(name or "cnn_dm", path, split)
    errors = []
    for candidate in REFERENCE_DATASETS:
        try:
            return load_dataset(candidate, path, split)
        except (ValueError, KeyError, OSError) as err:
            errors.append(f"{candidate}: {err}")
    raise SystemExit(
        f"error: no reference dataset reads {path} ({'; '.join(errors)}); "
        f"pass --dataset {' or --dataset '.join(REFERENCE_DATASETS)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="local dataset path (default: the Hub)")
    parser.add_argument(
        "--dataset",
        default=None,
        choices=REFERENCE_DATASETS,
        help="dataset whose references to use; default: the one that reads --data (cnn_dm from the Hub without --data)",
    )
    parser.add_argument("--split", default=None)
    parser.add_argument("--predictions", required=True, help="JSONL of {id, prediction: summary}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args(argv)
    samples = _load_references_dataset(args.dataset, args.data, args.split)
    references = {s.id: s.reference for s in samples if s.reference}
    result = score_predictions(
        read_predictions(args.predictions, text=True), references, seed=args.seed, resamples=args.resamples
    )
    print_json(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
