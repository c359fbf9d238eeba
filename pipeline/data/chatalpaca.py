"""ChatAlpaca (Bian et al. 2023): multi-turn conversations grown from Alpaca instructions, speed only.

Source: ``cascip/ChatAlpaca`` on GitHub (``chatalpaca-10k.json``/``-20k.json``: one JSON object per
line, ``{"id", "conversations": [{"from": "human"|"gpt", "value"}]}``); ShareGPT-style ``messages``
(``role``/``content``) are read too. A Hub mirror can be named with ``hub_id``. The user turns are
kept (``max_turns`` of them, default 1: the first instruction, as the speed papers use it).
Sample id: the record's ``id``, else its position.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pipeline.data.base import Sample, default_continuation, load_hub_rows, read_table

NAME = "chatalpaca"
_USER = {"human", "user"}


def _user_turns(row: dict) -> list[str]:
    conv = row.get("conversations") or row.get("conversation") or row.get("messages")
    if conv is None:
        if row.get("instruction"):
            return [(row["instruction"] + ("\n\n" + row["input"] if row.get("input") else "")).strip()]
        raise ValueError(f"record has no conversations/messages/instruction (keys: {sorted(row)})")
    turns = []
    for msg in conv:
        who = msg.get("from", msg.get("role"))
        text = msg.get("value", msg.get("content"))
        if who in _USER and text:
            turns.append(str(text))
    return turns


def load(
    path: str | Path | None = None,
    split: str | None = "train",
    hub_id: str | None = None,
    max_turns: int | None = 1,
) -> list[Sample]:
    if path is not None:
        rows = read_table(path, split)
    elif hub_id:
        rows = load_hub_rows(hub_id, split or "train")
    else:
        raise ValueError(
            "ChatAlpaca has no official Hub copy: set `dataset.path` to chatalpaca-10k.json or -20k.json "
            "(github.com/cascip/ChatAlpaca) or `hub_id` to a mirror"
        )
    samples = []
    for index, r in enumerate(rows):
        turns = _user_turns(r)
        if not turns:
            continue
        if max_turns is not None:
            turns = turns[:max_turns]
        samples.append(Sample(id=str(r.get("id", index)), dataset=NAME, turns=turns))
    return samples


def continuation(sample: Sample, turn: int, answers: Sequence[str]) -> tuple[str, str]:
    return default_continuation(sample, turn, answers)
