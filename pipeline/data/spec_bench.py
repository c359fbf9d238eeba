"""Spec-Bench (Xia et al. 2024): 480 prompts in six task groups (the offline copy: 464, 64 MT-Bench).

Groups: multi-turn conversation (the 80 MT-Bench questions in their 8 categories), translation,
summarization (CNN/DailyMail), question answering, mathematical reasoning, retrieval-augmented
generation. Sample id: ``question_id``. References are kept where the file has them (summaries,
translations, GSM8K solutions) so ROUGE can score the summarization group offline.

Source: ``hemingkx/Spec-Bench`` on GitHub, ``data/spec_bench/question.jsonl``; there is no official
Hub copy, so ``path`` (that file, or its folder) is required unless ``hub_id`` names a mirror.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pipeline.data.base import Sample, default_continuation, load_hub_rows, read_json_records
from pipeline.data.mt_bench import CATEGORIES as MT_BENCH_CATEGORIES

NAME = "spec_bench"
GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def group_of(category: str) -> str:
    """The Spec-Bench task group of a category (the 8 MT-Bench categories form one group)."""
    return "mt_bench" if category in MT_BENCH_CATEGORIES else category


def load(
    path: str | Path | None = None,
    split: str | None = None,
    groups: Sequence[str] | None = None,
    hub_id: str | None = None,
) -> list[Sample]:
    """The prompts, optionally restricted to some task ``groups``."""
    if path is not None:
        path = Path(path)
        rows = read_json_records(path if path.is_file() else path / "question.jsonl")
    elif hub_id:
        rows = load_hub_rows(hub_id, split or "test")
    else:
        raise ValueError(
            "Spec-Bench has no official Hub copy: set `dataset.path` to its question.jsonl "
            "(github.com/hemingkx/Spec-Bench, data/spec_bench/question.jsonl) or `hub_id` to a mirror"
        )
    if groups is not None:
        unknown = set(groups) - set(GROUPS)
        if unknown:
            raise ValueError(f"unknown Spec-Bench groups {sorted(unknown)}; valid: {list(GROUPS)}")
    samples = []
    for r in rows:
        group = group_of(r["category"])
        if groups is not None and group not in groups:
            continue
        ref = r.get("reference")
        samples.append(
            Sample(
                id=str(r["question_id"]),
                dataset=NAME,
                turns=list(r["turns"]),
                category=r["category"],
                reference=(ref[0] if isinstance(ref, list) and len(ref) == 1 else ref),
                meta={"group": group},
            )
        )
    return samples


def continuation(sample: Sample, turn: int, answers: Sequence[str]) -> tuple[str, str]:
    return default_continuation(sample, turn, answers)
