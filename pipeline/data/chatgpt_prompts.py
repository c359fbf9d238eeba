"""ChatGPT prompts ("awesome-chatgpt-prompts"): role-play instructions, single turn, speed only.

Hub: ``fka/awesome-chatgpt-prompts`` (columns ``act``, ``prompt``; mirrored as
``MohamedRashad/ChatGPT-prompts``). Local: any jsonl/json/csv/parquet with a ``prompt`` column.
Sample id: the row position.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pipeline.data.base import Sample, default_continuation, load_hub_rows, read_table

NAME = "chatgpt_prompts"
HUB_ID = "fka/awesome-chatgpt-prompts"
TEXT_FIELDS = ("prompt", "text", "instruction")


def load(path: str | Path | None = None, split: str | None = "train", hub_id: str = HUB_ID) -> list[Sample]:
    rows = read_table(path, split) if path is not None else load_hub_rows(hub_id, split or "train")
    samples = []
    for index, r in enumerate(rows):
        field = next((f for f in TEXT_FIELDS if r.get(f)), None)
        if field is None:
            raise ValueError(f"row {index} has none of the fields {TEXT_FIELDS}")
        samples.append(Sample(id=str(index), dataset=NAME, turns=[str(r[field])], category=r.get("act")))
    return samples


def continuation(sample: Sample, turn: int, answers: Sequence[str]) -> tuple[str, str]:
    return default_continuation(sample, turn, answers)
