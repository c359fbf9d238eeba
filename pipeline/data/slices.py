"""The measured slice of a dataset config and the warm-up samples taken from outside it."""

from __future__ import annotations

from typing import Any, Mapping

from pipeline.data import load_dataset
from pipeline.data.base import Sample, take_slice


def load_slice(dataset: Mapping[str, Any]) -> tuple[list[Sample], list[Sample], list[Sample]]:
    """(measured samples, warm-up samples from outside the slice, all samples) of a dataset config."""
    options = dict(dataset.get("options") or {})
    everything = load_dataset(dataset["name"], dataset.get("path"), dataset.get("split"), **options)
    measured = take_slice(everything, start=int(dataset.get("start") or 0), limit=dataset.get("limit"), ids=dataset.get("ids"))
    chosen = {s.id for s in measured}
    n_warm = int(dataset.get("warmup_samples", 3))
    if dataset.get("ids") is None:  # prefer the samples right after the slice
        end = int(dataset.get("start") or 0) + len(measured)
        rest = everything[end:] + everything[: int(dataset.get("start") or 0)]
    else:
        rest = everything
    warm = [s for s in rest if s.id not in chosen][:n_warm]
    return measured, warm, everything
