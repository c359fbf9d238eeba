"""The measured slice of a dataset config and the warm-up samples taken from outside it."""

from __future__ import annotations

from typing import Any, Mapping

from pipeline.data import builtin_task
from pipeline.data.base import Sample, take_slice
from pipeline.data.tasks import TaskSpec


def task_of(dataset: Mapping[str, Any]) -> TaskSpec:
    """The task of a dataset config: the spec the planner resolved into it (``task``), else the dataset's own."""
    task = dataset.get("task")
    return TaskSpec.from_dict(task) if task else builtin_task(str(dataset["name"]))


def load_slice(dataset: Mapping[str, Any], warmup_samples: int = 0) -> tuple[list[Sample], list[Sample], list[Sample]]:
    """(measured samples, ``warmup_samples`` warm-up samples from outside the slice, all samples) of a dataset
    config."""
    options = dict(dataset.get("options") or {})
    everything = task_of(dataset).load(dataset.get("path"), dataset.get("split"), **options)
    measured = take_slice(
        everything, start=int(dataset.get("start") or 0), limit=dataset.get("limit"), ids=dataset.get("ids")
    )
    chosen = {s.id for s in measured}
    n_warm = int(warmup_samples)
    if dataset.get("ids") is None:  # prefer the samples right after the slice
        end = int(dataset.get("start") or 0) + len(measured)
        rest = everything[end:] + everything[: int(dataset.get("start") or 0)]
    else:
        rest = everything
    warm = [s for s in rest if s.id not in chosen][:n_warm]
    return measured, warm, everything
