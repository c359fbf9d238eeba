"""CNN/DailyMail summarization (See et al. 2017).

Hub: ``abisee/cnn_dailymail`` config ``3.0.0`` (``article``, ``highlights``, ``id``): references for
ROUGE. Local path: the same columns in jsonl/json/csv/parquet, or the Spec-Bench sample
(``specbench_question_id``, ``article``, ``prompt``), which has no highlights: speed only (reference None).
Sample id: the row's ``id``, else ``specbench_question_id``, else the row position.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pipeline.data.base import Sample, load_hub_rows, read_table

NAME = "cnn_dm"
HUB_ID = "abisee/cnn_dailymail"
HUB_CONFIG = "3.0.0"
INSTRUCTION = "Summarize: {article}"  # Spec-Bench's wording


def load(path: str | Path | None = None, split: str | None = "test") -> list[Sample]:
    rows = read_table(path, split) if path is not None else load_hub_rows(HUB_ID, split or "test", HUB_CONFIG)
    samples = []
    for index, r in enumerate(rows):
        article = r.get("article")
        if article is None:
            raise ValueError(f"row {index} has no `article` field (keys: {sorted(r)})")
        sid = r.get("id", r.get("specbench_question_id", index))
        samples.append(
            Sample(
                id=str(sid),
                dataset=NAME,
                turns=[INSTRUCTION.format(article=article.strip())],
                reference=r.get("highlights"),
                meta={"article": article},
            )
        )
    return samples


def continuation(sample: Sample, turn: int, answers: Sequence[str]) -> tuple[str, str]:
    """The article then ``TL;DR:`` (Radford et al. 2019's zero-shot summarization cue)."""
    return f"{sample.meta['article'].strip()}\n\nTL;DR:", ""
