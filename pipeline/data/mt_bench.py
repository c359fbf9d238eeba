"""MT-Bench (Zheng et al. 2023): 80 two-turn questions in 8 categories, judged by an LLM.

Sample id: the ``question_id``. The second turn is answered after the first, with the first answer in
the context. ``reference`` holds the reference answers (GPT-4's, used by FastChat for math, reasoning
and coding) where the data has them.

Local layout (FastChat's): ``question.jsonl``, ``reference_answer/gpt-4.jsonl``, ``judge_prompts.jsonl``.
Hub: ``HuggingFaceH4/mt_bench_prompts`` (prompts and references).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from pipeline.data.base import Sample, default_continuation, load_hub_rows, read_json_records

NAME = "mt_bench"
HUB_ID = "HuggingFaceH4/mt_bench_prompts"
CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def _root(path: Path) -> Path:
    return path.parent if path.is_file() else path


def load_references(path: str | Path, model: str = "gpt-4") -> dict[str, list[str]]:
    """Reference answers by question id (``reference_answer/<model>.jsonl`` under the data folder)."""
    ref_file = _root(Path(path)) / "reference_answer" / f"{model}.jsonl"
    if not ref_file.exists():
        return {}
    refs = {}
    for row in read_json_records(ref_file):
        refs[str(row["question_id"])] = list(row["choices"][0]["turns"])
    return refs


def load(path: str | Path | None = None, split: str | None = None, reference_model: str = "gpt-4") -> list[Sample]:
    """Questions with their two turns, category and reference answers (if present)."""
    if path is not None:
        path = Path(path)
        qfile = path if path.is_file() else path / "question.jsonl"
        rows = read_json_records(qfile)
        refs = load_references(path, reference_model)
        return [
            Sample(
                id=str(r["question_id"]),
                dataset=NAME,
                turns=list(r["turns"]),
                category=r["category"],
                reference=refs.get(str(r["question_id"])) or r.get("reference") or None,
            )
            for r in rows
        ]
    rows = load_hub_rows(HUB_ID, split or "train")
    return [
        Sample(
            id=str(r["prompt_id"]),
            dataset=NAME,
            turns=list(r["prompt"]),
            category=r["category"],
            # per turn, as the local files have it (dropping empty entries would shift later turns)
            reference=list(r["reference"]) if any(r.get("reference") or []) else None,
        )
        for r in rows
    ]


def continuation(sample: Sample, turn: int, answers: Sequence[str]) -> tuple[str, str]:
    return default_continuation(sample, turn, answers)


def load_judge_prompts(path: str | Path | None) -> dict[str, dict]:
    """FastChat's judge prompts by name, from ``judge_prompts.jsonl`` next to the questions."""
    if path is None:
        raise ValueError("the judge prompts file (FastChat's judge_prompts.jsonl) is needed: pass its path")
    path = Path(path)
    candidates = (
        [path] if path.suffix == ".jsonl" and path.name.startswith("judge") else [_root(path) / "judge_prompts.jsonl"]
    )
    for c in candidates:
        if c.exists():
            return {d["name"]: d for d in (json.loads(l) for l in c.read_text().splitlines() if l.strip())}
    raise FileNotFoundError(f"judge_prompts.jsonl not found at {candidates[0]}")
