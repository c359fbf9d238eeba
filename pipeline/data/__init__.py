"""Datasets: one module per dataset, a registry, and the two calls the sweep makes.

    samples = load_dataset("spider", path="data/spider", limit=50)
    prompt = format_sample(samples[0], tokenizer, chat=pair.spec.chat)

Every module defines ``NAME``, ``SCORER`` (the scorer module name or None), ``STOP_STRINGS``,
``load(path=None, split=..., **options) -> list[Sample]`` and ``continuation(sample, turn, answers)``;
modules whose chat wording differs from the raw turn define ``chat_user_texts(sample)``.
``path`` comes from the config (``dataset.path``); without it the loader uses the Hub via ``datasets``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Sequence

from pipeline.data.base import Prompt, Sample, format_prompt, prediction_text, take_slice

DATASETS: dict[str, str] = {
    "humaneval": "pipeline.data.humaneval",
    "spider": "pipeline.data.spider",
    "mt_bench": "pipeline.data.mt_bench",
    "spec_bench": "pipeline.data.spec_bench",
    "cnn_dm": "pipeline.data.cnn_dm",
    "chatgpt_prompts": "pipeline.data.chatgpt_prompts",
    "chatalpaca": "pipeline.data.chatalpaca",
}

__all__ = [
    "DATASETS",
    "Prompt",
    "Sample",
    "dataset_module",
    "format_sample",
    "load_dataset",
    "prediction_text",
    "stop_strings",
]


def dataset_module(name: str) -> ModuleType:
    """The module implementing dataset ``name``."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid datasets: {sorted(DATASETS)}")
    return importlib.import_module(DATASETS[name])


def load_dataset(
    name: str,
    path: str | Path | None = None,
    split: str | None = None,
    *,
    start: int = 0,
    limit: int | None = None,
    ids: Iterable[str] | None = None,
    **options: Any,
) -> list[Sample]:
    """Samples of dataset ``name`` from ``path`` (local) or the Hub, sliced by ``ids`` or ``start``/``limit``.

    ``options`` go to the dataset's loader (``database_dir`` for Spider, ``groups`` for Spec-Bench...).
    """
    module = dataset_module(name)
    kwargs = dict(options)
    if split is not None:
        kwargs["split"] = split
    samples = module.load(path, **kwargs)
    return take_slice(samples, start=start, limit=limit, ids=ids)


def format_sample(
    sample: Sample, tokenizer: Any, *, chat: bool, turn: int = 0, answers: Sequence[str] = ()
) -> Prompt:
    """The prompt for ``turn`` of ``sample``: chat template (chat pairs) or the dataset's continuation."""
    module = dataset_module(sample.dataset)
    user_texts = module.chat_user_texts(sample) if chat and hasattr(module, "chat_user_texts") else None
    return format_prompt(
        sample,
        tokenizer,
        chat=chat,
        turn=turn,
        answers=answers,
        continuation=module.continuation,
        chat_user_texts=user_texts,
    )


def stop_strings(dataset: str, chat: bool) -> tuple[str, ...]:
    """Stop strings for counting tokens of continuation prompts (none for chat: EOS ends a turn)."""
    return () if chat else tuple(dataset_module(dataset).STOP_STRINGS)
