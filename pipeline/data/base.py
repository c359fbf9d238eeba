"""Samples and prompt formatting shared by every dataset.

A :class:`Sample` is what a dataset yields: an id (the one its scorer and saved predictions use), the
user turns, and what the scorer needs (``reference``). Prompt formatting is per pair: a chat model gets
its tokenizer's chat template, a base model a plain continuation prompt that the dataset defines. The
formatted text and its style are returned together so that a cell can record both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from pipeline.prompts import encode_chat, encode_continuation


@dataclass
class Sample:
    """One evaluation item.

    ``turns`` are the user messages; a multi-turn sample (MT-Bench) is answered turn by turn, each
    turn seeing the previous answers. ``reference`` is whatever the scorer compares against (tests,
    gold SQL, reference answers, summaries) and is ``None`` where the source has none.
    ``answer_prefix`` is text the continuation prompt ends with that belongs to the answer (Spider's
    ``SELECT``): the text to score is ``answer_prefix + generated text`` (see :func:`prediction_text`).
    """

    id: str
    dataset: str
    turns: list[str]
    category: str | None = None
    reference: Any = None
    system: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_turns(self) -> int:
        return len(self.turns)


@dataclass
class Prompt:
    """A formatted prompt: its text, its token ids and how it was built."""

    text: str
    input_ids: list[int]
    style: str  # "chat" or "continuation"
    answer_prefix: str = ""


ContinuationFormatter = Callable[[Sample, int, Sequence[str]], tuple[str, str]]


def default_continuation(sample: Sample, turn: int, answers: Sequence[str]) -> tuple[str, str]:
    """A plain dialogue transcript for base models; returns ``(text, answer_prefix)``."""
    parts = []
    if sample.system:
        parts.append(sample.system.strip() + "\n\n")
    for i in range(turn + 1):
        parts.append(f"User: {sample.turns[i].strip()}\n\nAssistant:")
        if i < turn:
            parts.append(f" {answers[i].strip()}\n\n")
    return "".join(parts), ""


def chat_messages(
    sample: Sample, turn: int = 0, answers: Sequence[str] = (), *, user_texts: Sequence[str] | None = None
) -> list[dict[str, str]]:
    """The chat transcript for answering ``turn`` (0-based) given the previous ``answers``."""
    if turn >= sample.num_turns:
        raise ValueError(f"sample {sample.id!r} has {sample.num_turns} turn(s); turn {turn} asked")
    if len(answers) < turn:
        raise ValueError(f"turn {turn} needs the {turn} previous answer(s), got {len(answers)}")
    users = list(user_texts) if user_texts is not None else sample.turns
    messages: list[dict[str, str]] = []
    if sample.system:
        messages.append({"role": "system", "content": sample.system})
    for i in range(turn + 1):
        messages.append({"role": "user", "content": users[i]})
        if i < turn:
            messages.append({"role": "assistant", "content": answers[i]})
    return messages


def format_prompt(
    sample: Sample,
    tokenizer: Any,
    *,
    chat: bool,
    turn: int = 0,
    answers: Sequence[str] = (),
    continuation: ContinuationFormatter | None = None,
    chat_user_texts: Sequence[str] | None = None,
) -> Prompt:
    """Format ``sample`` for turn ``turn``: chat template when ``chat``, else the continuation prompt.

    ``continuation`` is the dataset's own continuation formatter (the dataset modules pass it; see
    :func:`pipeline.data.format_sample`); ``chat_user_texts`` lets a dataset phrase the user turns
    differently for chat models (an instruction around a HumanEval prompt).
    """
    if chat:
        messages = chat_messages(sample, turn, answers, user_texts=chat_user_texts)
        text, ids = encode_chat(tokenizer, messages)
        return Prompt(text=text, input_ids=ids, style="chat")
    fmt = continuation or default_continuation
    text, prefix = fmt(sample, turn, answers)
    return Prompt(text=text, input_ids=encode_continuation(tokenizer, text), style="continuation", answer_prefix=prefix)


def prediction_text(prompt: Prompt, generated_text: str) -> str:
    """The text a scorer receives for one answer: the prompt's answer prefix plus the generation."""
    return prompt.answer_prefix + generated_text


def read_json_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``.jsonl`` / ``.json`` (list or ``{"data": [...]}``) file."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl" or (text.lstrip()[:1] == "{" and "\n{" in text.strip()):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    if isinstance(data, dict):
        for key in ("data", "rows", "examples"):
            if isinstance(data.get(key), list):
                return data[key]
        raise ValueError(f"{path}: a JSON object without a list under data/rows/examples")
    return data


def read_table(path: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    """Rows of a local file (jsonl, json, csv, parquet) or of a Hub-layout directory of such files."""
    path = Path(path)
    if path.is_dir():
        files = sorted(
            p for p in path.rglob("*") if p.suffix in {".jsonl", ".json", ".parquet", ".csv"} and p.is_file()
        )
        if split:
            chosen = [p for p in files if split in p.stem or split in p.parent.name]
            files = chosen or files
        if not files:
            raise FileNotFoundError(f"no jsonl/json/csv/parquet files under {path}")
        rows: list[dict[str, Any]] = []
        for f in files:
            rows.extend(read_table(f))
        return rows
    if path.suffix in {".jsonl", ".json"}:
        return read_json_records(path)
    if path.suffix in {".parquet", ".csv"}:
        import pandas as pd  # noqa: PLC0415 - only .csv/.parquet data (the shipped data are JSON): ~1 s not paid by every cell

        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        return frame.to_dict(orient="records")
    raise ValueError(f"unsupported data file {path} (expected .jsonl, .json, .csv or .parquet)")


def load_hub_rows(hub_id: str, split: str, name: str | None = None) -> list[dict[str, Any]]:
    """Rows of a Hub dataset through ``datasets`` (cached copies work with HF_HUB_OFFLINE=1)."""
    import datasets  # noqa: PLC0415 - Hub datasets only (offline runs never get here): 0.4-1.8 s of import

    try:
        ds = datasets.load_dataset(hub_id, name, split=split)
    except Exception as err:  # noqa: BLE001 - re-raised with the way out
        raise RuntimeError(
            f"cannot load {hub_id!r} (split {split!r}) from the Hugging Face Hub: {err}. "
            "Point `dataset.path` at a local copy instead."
        ) from err
    return [dict(row) for row in ds]


def take_slice(
    samples: list[Sample], start: int = 0, limit: int | None = None, ids: Iterable[str] | None = None
) -> list[Sample]:
    """Select samples by ids (kept in the dataset's order) or by ``[start, start + limit)``."""
    if ids is not None:
        wanted = {str(i) for i in ids}
        chosen = [s for s in samples if s.id in wanted]
        missing = wanted - {s.id for s in chosen}
        if missing:
            raise KeyError(f"unknown sample ids: {sorted(missing)[:10]}")
        return chosen
    if start < 0 or (limit is not None and limit < 0):
        raise ValueError("start and limit must be non-negative")
    end = None if limit is None else start + limit
    return samples[start:end]
