"""Spider (Yu et al. 2018) text-to-SQL, scored by execution on the SQLite databases.

Sample id: the 0-based position of the question in ``dev.json`` (as a string). The prompt is the
database schema as its CREATE TABLE statements (read from the database file itself) followed by the
question. Base models continue after ``SELECT`` (the answer prefix); chat models answer in a code block.

Layout of ``path``: ``dev.json`` (or ``<split>.json``) and ``database/<db_id>/<db_id>.sqlite``, the
official release layout. The Hub copy (``xlangai/spider``) has the questions but no databases: pass
``database_dir`` with it.
"""

from __future__ import annotations

import sqlite3
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from pipeline.data.base import Sample, load_hub_rows, read_json_records

NAME = "spider"
HUB_ID = "xlangai/spider"

CONTINUATION_TEMPLATE = (
    "{schema}\n\n-- Using valid SQLite, answer the following question for the tables provided above.\n"
    "-- Question: {question}\nSELECT"
)
CHAT_TEMPLATE = (
    "{schema}\n\nUsing valid SQLite, answer the following question for the tables provided above.\n"
    "Question: {question}\nAnswer with a single SQL query in a ```sql code block."
)


def database_path(database_dir: str | Path, db_id: str) -> Path:
    return Path(database_dir) / db_id / f"{db_id}.sqlite"


@lru_cache(maxsize=256)
def schema_ddl(db_path: str) -> str:
    """The CREATE TABLE statements of a database, in file order, read through a read-only connection."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "AND sql IS NOT NULL ORDER BY rowid"
        ).fetchall()
    finally:
        conn.close()
    return "\n\n".join(_normalise_ddl(r[0]) for r in rows)


def _normalise_ddl(sql: str) -> str:
    lines = [line.rstrip() for line in sql.strip().splitlines()]
    return "\n".join(line for line in lines if line.strip()) + ";"


def load(
    path: str | Path | None = None,
    split: str | None = "dev",
    database_dir: str | Path | None = None,
) -> list[Sample]:
    """Questions of ``split`` with their gold SQL, database file and schema."""
    split = split or "dev"
    if path is not None:
        root = Path(path)
        questions = root if root.is_file() else root / f"{split}.json"
        rows = read_json_records(questions)
        database_dir = Path(database_dir) if database_dir else (questions.parent / "database")
    else:
        if database_dir is None:
            raise ValueError(
                "Spider needs its SQLite databases: pass `path` (a folder with dev.json and database/) "
                "or `database_dir` together with the Hub questions"
            )
        rows = load_hub_rows(HUB_ID, "validation" if split == "dev" else split)
    samples = []
    for index, row in enumerate(rows):
        db_path = database_path(database_dir, row["db_id"])
        if not db_path.exists():
            raise FileNotFoundError(f"database of question {index} not found: {db_path}")
        samples.append(
            Sample(
                id=str(index),
                dataset=NAME,
                turns=[row["question"]],
                reference={"query": row["query"], "db_id": row["db_id"], "db_path": str(db_path)},
                meta={"schema": schema_ddl(str(db_path))},
            )
        )
    return samples


def continuation(sample: Sample, turn: int, answers: Sequence[str]) -> tuple[str, str]:
    text = CONTINUATION_TEMPLATE.format(schema=sample.meta["schema"], question=sample.turns[0])
    return text, "SELECT"


def chat_user_texts(sample: Sample) -> list[str]:
    return [CHAT_TEMPLATE.format(schema=sample.meta["schema"], question=sample.turns[0])]
