"""Speed, acceptance and latency broken down by a dataset's categories, and acceptance and speedup against the
sampling temperature (``categories.md``, ``temperature.md`` of the report).

Per category (MT-Bench's 8, Spec-Bench's tasks: a record's ``category``), from the generations of every finished
cell: per (pair, dataset, method label, category) the generations, tokens/s (the category's new tokens over its
requests' ``decode_s``), tokens per target step, the latency p50 in a slot, and the speedup: per seed the category's
tokens/s over ar's on the same category, their mean and 95% t-interval over seeds.

Per temperature (``sweep.temperatures``: labels ``spd (T=0.7)``, ``pipeline.cell_types.temperature_label``): per
(pair, dataset, method label, temperature) tokens per step and the speedup over ar at the same temperature
(``stats.add_ratios``: paired by seed, batch, rate and temperature), mean and 95% t-interval over seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import schema, stats
from analysis.serving import interval
from pipeline.cell_types import split_temperature_label
from pipeline.measure.workload import percentiles

CATEGORY_COLUMNS = ["pair", "dataset", "method", "category", "generations", "tokens_per_s", "tokens_per_step",
                    "latency_s_p50", "speedup", "low", "high"]  # fmt: skip
TEMPERATURE_COLUMNS = ["pair", "dataset", "method", "temperature", "seeds", "tokens_per_step", "speedup", "low", "high"]


def _f(v: float, d: int = 2) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:.{d}f}"


def has_categories(samples: pd.DataFrame) -> bool:
    """Whether the generations carry more than one category (a dataset that has them)."""
    return "category" in samples and samples["category"].dropna().nunique() > 1


def by_category(samples: pd.DataFrame) -> pd.DataFrame:
    """One row per (pair, dataset, method label, category): the module doc's columns."""
    data = samples.dropna(subset=["category"]).copy()
    if data.empty:
        return pd.DataFrame(columns=CATEGORY_COLUMNS)
    data["method"] = data["label"].astype(str).map(lambda label: split_temperature_label(label)[0])
    keys = ["pair", "dataset", "method", "category"]
    per_seed = data.groupby([*keys, "seed"], as_index=False)[["new_tokens", "decode_s"]].sum()
    per_seed["rate"] = per_seed["new_tokens"] / per_seed["decode_s"]
    base = per_seed[per_seed["method"] == schema.BASELINE][["pair", "dataset", "category", "seed", "rate"]]
    per_seed = per_seed.merge(base.rename(columns={"rate": "ar_rate"}), on=["pair", "dataset", "category", "seed"],
                              how="left")  # fmt: skip
    per_seed["speedup"] = per_seed["rate"] / per_seed["ar_rate"]
    gains = {key: g["speedup"] for key, g in per_seed.groupby(keys, sort=True)}
    rows = []
    for key, g in data.groupby(keys, sort=True):
        mean, low, high = interval(gains[key])
        steps = g["steps"].sum()
        rows.append(
            dict(
                zip(keys, key),
                generations=len(g),
                tokens_per_s=float(g["new_tokens"].sum() / g["decode_s"].sum()),
                tokens_per_step=float(g["new_tokens"].sum() / steps) if steps else math.nan,
                latency_s_p50=percentiles(g["decode_s"], (50,), "latency_s")["latency_s_p50"],
                speedup=mean,
                low=low,
                high=high,
            )
        )
    return pd.DataFrame(rows, columns=CATEGORY_COLUMNS)


def categories_markdown(samples: pd.DataFrame) -> str:
    t = by_category(samples)
    lines = [
        "# Per category",
        "",
        "Per method and category: tokens/s over the category's requests, tokens per target step, latency p50 in a "
        "slot, and the speedup over ar on the same category (per seed, mean and 95% t-interval over seeds).",
        "",
        "| pair | dataset | method | category | generations | tokens/s | tokens/step | latency p50 s "
        "| speedup [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in t.itertuples():
        lines.append(
            f"| {r.pair} | {r.dataset} | {r.method} | {r.category} | {r.generations} | {_f(r.tokens_per_s)} | "
            f"{_f(r.tokens_per_step)} | {_f(r.latency_s_p50, 3)} | {_f(r.speedup)} [{_f(r.low)}, {_f(r.high)}] |"
        )
    return "\n".join(lines) + "\n"


def with_temperature(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with ``speedup`` (over ar at the same temperature), ``method_label`` and ``temperature`` (NaN off the
    temperature axis)."""
    out = stats.add_ratios(runs) if "speedup" not in runs else runs.copy()
    split = out["label"].astype(str).map(split_temperature_label)
    out["method_label"] = split.map(lambda t: t[0])
    out["temperature"] = split.map(lambda t: math.nan if t[1] is None else t[1]).astype(float)
    return out


def varies(runs: pd.DataFrame) -> bool:
    """Whether the sweep has a temperature axis (more than one temperature in its labels)."""
    return len(runs) > 0 and with_temperature(runs)["temperature"].dropna().nunique() > 1


def by_temperature(runs: pd.DataFrame) -> pd.DataFrame:
    data = with_temperature(runs)
    data = data[np.isfinite(data["temperature"])]
    rows = []
    for (pair, dataset, method, t), g in data.groupby(["pair", "dataset", "method_label", "temperature"], sort=True):
        mean, low, high = interval(g["speedup"])
        rows.append(
            {
                "pair": pair,
                "dataset": dataset,
                "method": method,
                "temperature": float(t),
                "seeds": int(g["seed"].nunique()),
                "tokens_per_step": float(g["accepted_per_step"].mean()),
                "speedup": mean,
                "low": low,
                "high": high,
            }
        )
    return pd.DataFrame(rows, columns=TEMPERATURE_COLUMNS)


def temperature_markdown(runs: pd.DataFrame) -> str:
    t = by_temperature(runs)
    lines = [
        "# Acceptance and speedup against temperature",
        "",
        "Tokens per target step (acceptance) and tokens/s over ar's at the same temperature (per seed; mean and 95% "
        "t-interval over seeds).",
        "",
        "| pair | dataset | method | temperature | seeds | tokens/step | speedup [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in t.itertuples():
        lines.append(
            f"| {r.pair} | {r.dataset} | {r.method} | {r.temperature:g} | {r.seeds} | {_f(r.tokens_per_step)} | "
            f"{_f(r.speedup)} [{_f(r.low)}, {_f(r.high)}] |"
        )
    return "\n".join(lines) + "\n"
