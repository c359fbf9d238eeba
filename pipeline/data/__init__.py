"""Datasets: one loader module per dataset, one task spec per dataset, and the calls the sweep makes.

    samples = load_dataset("spider", path="data/spider", limit=50)
    prompt = format_sample(samples[0], tokenizer, chat=pair.spec.chat)

What a dataset is (its loader, prompt format, stop strings, scorer and the fields it writes, its
version) is its task spec, ``task:`` in ``conf/dataset/<name>.yaml`` (``pipeline.data.tasks``). A
loader module defines ``NAME``, ``load(path=None, split=..., **options) -> list[Sample]`` and
``continuation(sample, turn, answers)``; modules whose chat wording differs from the raw turn define
``chat_user_texts(sample)``. ``path`` comes from the config (``dataset.path``); without it the loader
uses the Hub via ``datasets`` or a package's copy.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from pipeline.data.base import Prompt, Sample, format_prompt, prediction_text, take_slice
from pipeline.data.tasks import TaskSpec, TaskSpecError, task_names, task_spec

__all__ = [
    "Prompt",
    "Sample",
    "TaskSpec",
    "TaskSpecError",
    "builtin_task",
    "format_prompt",
    "format_sample",
    "load_dataset",
    "prediction_text",
    "stop_strings",
    "task_names",
    "task_spec",
]


@lru_cache(maxsize=None)
def builtin_task(name: str) -> TaskSpec:
    """The task of a dataset of this repository's ``conf/dataset/`` (read once per process)."""
    return task_spec(name)


def load_dataset(
    name: str,
    path: str | Path | None = None,
    split: str | None = None,
    *,
    start: int = 0,
    limit: int | None = None,
    ids: Iterable[str] | None = None,
    task: TaskSpec | None = None,
    **options: Any,
) -> list[Sample]:
    """Samples of dataset ``name`` from ``path`` (local) or the Hub, sliced by ``ids`` or ``start``/``limit``.

    ``options`` go to the dataset's loader (``database_dir`` for Spider, ``groups`` for Spec-Bench...);
    ``task``: the dataset's task spec (default: the one in this repository's ``conf/dataset/<name>.yaml``).
    """
    samples = (task or builtin_task(name)).load(path, split, **options)
    return take_slice(samples, start=start, limit=limit, ids=ids)


def format_sample(sample: Sample, tokenizer: Any, *, chat: bool, turn: int = 0, answers: Sequence[str] = ()) -> Prompt:
    """The prompt for ``turn`` of ``sample`` as its dataset's task formats it (chat template or continuation)."""
    return builtin_task(sample.dataset).format(sample, tokenizer, chat=chat, turn=turn, answers=answers)


def stop_strings(dataset: str, chat: bool) -> tuple[str, ...]:
    """Stop strings for counting tokens of continuation prompts (none for chat: EOS ends a turn)."""
    return builtin_task(dataset).stops(chat)
