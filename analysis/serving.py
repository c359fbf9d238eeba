"""Offered load as an axis: per method, throughput, TPOT and goodput against the rate, the TPOT gain over ``ar`` at
the same rate, the crossover rate and the load claims (conf/sweep/serving.yaml; ``serving.md``, figure
``serving_vs_rate``).

A workload sweep's cells log ``rate`` (``pipeline.measure.workload``) and are labelled ``spd @ 2/s`` (``spd (batch 4)
@ 2/s`` above batch 1: ``pipeline.sweep.axes.rate_label``); here the label is split back into the method's label.
Per (pair, dataset, method, rate) and seed, the TPOT gain is ar's ``tpot_ms_p50`` over the method's, ar's cell of the
same seed, batch size and rate (the seeds are the independent repeats: their mean and a 95% t-interval). The
crossover rate of a seed is the lowest rate whose gain is below 1 (speculation stops beating ar there); its mean and
t-interval over the seeds that have one, and how many have none (the gain holds at every rate measured).

Predicted for a memory-bound accelerator (``predicted``; A100: ``bounds.GPU_BANDWIDTH_B_S``, compute roof
``bounds.GPU_ROOF_ROWS``): per seed, a method's in-loop acceptance pooled over its cells of every rate (tokens emitted
per request and iteration, draft positions per iteration, tokens per request), the pair's c (draft weights over
target's) and the target's step time there go through ``bounds.predicted_serving``: the occupancy each method's own
speed gives it at each rate (Little's law), its TPOT there, and the lowest rate at which the gain over ar falls below
1, at the sweep's slots and with unbounded slots, with b* (the batch at which a verified row's compute eats the gain).

The load claims (``serving_claims:`` of analysis/claims.yaml):

- ``gain_holds_up_to``: the method's TPOT gain holds up to rate R, R the highest rate up to which the gain's 95%
  interval lies above 1 at every rate (supported with R when there is one, contradicted when the interval lies
  wholly below 1 at the lowest rate, inconclusive otherwise);
- ``never_worse``: the method's TPOT p50 is never worse than the better of its ``references`` (ar and fixed-length
  speculation) at any rate, within its interval: per seed and rate the ratio of its TPOT p50 to the references'
  best, minus 1; contradicted at a rate whose interval lies wholly above ``margin``, supported when no rate is and
  every rate has at least two seeds, otherwise inconclusive.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import yaml
from scipy import stats as sstats

from analysis import schema
from pipeline.cell_types import split_batch_label
from pipeline.measure.bounds import GPU_BANDWIDTH_B_S, GPU_ROOF_ROWS, predicted_serving

CLAIMS_FILE = Path(__file__).resolve().parent / "claims.yaml"
KINDS = ("gain_holds_up_to", "never_worse")
COLUMNS = [
    "pair",
    "dataset",
    "method",
    "rate",
    "seeds",
    "throughput_tok_s",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "ttft_s_p50",
    "goodput_rps",
    "occupancy",
    "gain",
    "low",
    "high",
]


def method_label(label: str) -> str:
    """``spd (batch 4) @ 2/s`` -> ``spd``: the sweep entry's own label."""
    head = label.rsplit(" @ ", 1)[0] if " @ " in label else label
    return split_batch_label(head)[0]


def with_rate(runs: pd.DataFrame) -> pd.DataFrame:
    """The workload cells of ``runs`` (a finite ``rate``) with ``method_label``; empty without any."""
    if "rate" not in runs or not len(runs):
        return runs.iloc[0:0].assign(method_label=pd.Series(dtype=str))
    out = runs[np.isfinite(pd.to_numeric(runs["rate"], errors="coerce").astype(float))].copy()
    out["method_label"] = out["label"].astype(str).map(method_label)
    if "batch_size" not in out:
        out["batch_size"] = 1
    return out


def varies(runs: pd.DataFrame) -> bool:
    """Whether the sweep measured a workload at more than one rate."""
    return with_rate(runs)["rate"].nunique() > 1


def interval(values: Any) -> tuple[float, float, float]:
    """Mean and 95% t-interval of the finite ``values`` (NaN bounds below two values)."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(arr.mean())
    if arr.size < 2:
        return mean, math.nan, math.nan
    half = float(sstats.t.ppf(0.975, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size))
    return mean, mean - half, mean + half


def paired(runs: pd.DataFrame, metric: str = "tpot_ms_p50") -> pd.DataFrame:
    """One row per cell: ``metric`` with ``ar_<metric>`` of ar's cell of the same pair, dataset, seed, batch and
    rate, and ``gain`` = ar's over the cell's."""
    data = with_rate(runs)
    keys = ["pair", "dataset", "seed", "batch_size", "rate"]
    base = data[data["method_label"] == schema.BASELINE][keys + [metric]].drop_duplicates(keys)
    out = data.merge(base.rename(columns={metric: f"ar_{metric}"}), on=keys, how="left")
    out["gain"] = out[f"ar_{metric}"] / out[metric]
    return out


def table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (pair, dataset, method, rate): the means over seeds and the TPOT gain over ar with its 95% interval."""
    rows = []
    for (pair, dataset, method, rate), g in paired(runs).groupby(
        ["pair", "dataset", "method_label", "rate"], sort=True
    ):
        gain, low, high = interval(g["gain"])
        rows.append(
            {
                "pair": pair,
                "dataset": dataset,
                "method": method,
                "rate": float(rate),
                "seeds": int(g["seed"].nunique()),
                "throughput_tok_s": float(g["throughput_tok_s"].mean()),
                "tpot_ms_p50": float(g["tpot_ms_p50"].mean()),
                "tpot_ms_p99": float(g["tpot_ms_p99"].mean()),
                "ttft_s_p50": float(g["ttft_s_p50"].mean()),
                "goodput_rps": float(g["goodput_rps"].mean()),
                "occupancy": float(g["mean_batch_occupancy"].mean()),
                "gain": gain,
                "low": low,
                "high": high,
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def crossover(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (pair, dataset, method): each seed's lowest rate with a TPOT gain below 1; their mean and interval."""
    rows = []
    data = paired(runs)
    for (pair, dataset, method), g in data[data["method_label"] != schema.BASELINE].groupby(
        ["pair", "dataset", "method_label"], sort=True
    ):
        per_seed = []
        for _, s in g.groupby("seed"):
            below = s[s["gain"] < 1.0]["rate"]
            per_seed.append(float(below.min()) if len(below) else math.nan)
        mean, low, high = interval(per_seed)
        rows.append(
            {
                "pair": pair,
                "dataset": dataset,
                "method": method,
                "crossover_rate": mean,
                "low": low,
                "high": high,
                "seeds_with_one": int(np.isfinite(per_seed).sum()),
                "seeds": len(per_seed),
                "lowest_rate": float(g["rate"].min()),
                "highest_rate": float(g["rate"].max()),
            }
        )
    return pd.DataFrame(rows)


PREDICTED_COLUMNS = [
    "pair",
    "dataset",
    "method",
    "seeds",
    "c",
    "step_ms",
    "tokens_per_iteration",
    "drafted_per_iteration",
    "slots",
    "gain_idle",
    "gain_full",
    "occupancy",
    "rate",
    "rate_low",
    "rate_high",
    "rate_unbounded",
    "ar_capacity",
]


def predicted(
    runs: pd.DataFrame,
    samples: pd.DataFrame,
    c_by_pair: dict[str, float],
    step_by_pair: dict[str, float],
    roof_rows: float = GPU_ROOF_ROWS,
) -> pd.DataFrame:
    """Per (pair, dataset, method): the crossover predicted for a memory-bound accelerator (``PREDICTED_COLUMNS``)
    from each seed's cells of every rate (``samples`` with ``iterations``, ``drafted_total``, ``new_tokens``:
    ``claims.add_acceptance_columns``), ``c_by_pair`` (``transfer.gpu_cost_ratios``) and ``step_by_pair`` (seconds,
    ``transfer.gpu_step_seconds``). ``rate``: the mean over seeds of the lowest rate with a gain below 1 at the sweep's
    slots (``rate_low``/``rate_high``: its 95% t-interval; inf when no seed's gain falls below 1, the gain at a full
    batch ``gain_full`` staying above 1); ``rate_unbounded``: the same with unbounded slots, as a server admitting every
    request; ``occupancy``: b*. A load-aware draft length's cells pool its lengths over the rates: its prediction is
    that of a fixed length of their mean. Empty without samples."""
    data = with_rate(runs)
    need = {"run_id", "iterations", "drafted_total", "new_tokens"}
    if data.empty or samples.empty or not need <= set(samples.columns) or "run_id" not in data:
        return pd.DataFrame(columns=PREDICTED_COLUMNS)
    sums = samples.groupby("run_id")[["new_tokens", "iterations", "drafted_total"]].sum()
    counts = samples.groupby("run_id").size()
    rows = []
    for (pair, dataset, method), g in data[data["method_label"] != schema.BASELINE].groupby(
        ["pair", "dataset", "method_label"], sort=True
    ):
        c, step = float(c_by_pair.get(pair, math.nan)), float(step_by_pair.get(pair, math.nan))
        slots = float(pd.to_numeric(g["batch_size"], errors="coerce").max())
        per_seed = []
        for _, s in g.groupby("seed"):
            ids = [r for r in s["run_id"] if r in sums.index]
            if not ids:
                continue
            tokens, iters, drafted = sums.loc[ids].sum()
            if iters <= 0:
                continue
            n = tokens / counts.loc[ids].sum()
            at = dict(tokens=tokens / iters, drafted=drafted / iters, c=c, new_tokens=n, step=step, roof_rows=roof_rows)
            per_seed.append(
                {
                    **predicted_serving(**at, slots=slots),
                    "rate_unbounded": predicted_serving(**at)["rate"],
                    "tokens_per_iteration": tokens / iters,
                    "drafted_per_iteration": drafted / iters,
                }
            )
        if not per_seed:
            continue
        seeds = pd.DataFrame(per_seed)

        def pooled(col: str) -> tuple[float, float, float]:  # inf when any seed has none: the mean would hide it
            vals = seeds[col].astype(float)
            return (math.inf, math.nan, math.nan) if np.isinf(vals).any() else interval(vals)

        rate, low, high = pooled("rate")
        rows.append(
            {
                "pair": pair,
                "dataset": dataset,
                "method": method,
                "seeds": len(seeds),
                "c": c,
                "step_ms": step * 1e3,
                "tokens_per_iteration": float(seeds["tokens_per_iteration"].mean()),
                "drafted_per_iteration": float(seeds["drafted_per_iteration"].mean()),
                "slots": slots,
                "gain_idle": float(seeds["gain_idle"].mean()),
                "gain_full": float(seeds["gain_full"].mean()),
                "occupancy": pooled("occupancy")[0],
                "rate": rate,
                "rate_low": low,
                "rate_high": high,
                "rate_unbounded": pooled("rate_unbounded")[0],
                "ar_capacity": float(seeds["ar_capacity"].mean()),
            }
        )
    return pd.DataFrame(rows, columns=PREDICTED_COLUMNS)


def predicted_markdown(pred: pd.DataFrame, roof_rows: float = GPU_ROOF_ROWS) -> list[str]:
    """``predicted``'s table as markdown lines (none when empty)."""
    if pred.empty:
        return []
    f = lambda v, d=2: "–" if v is None or not math.isfinite(v) else f"{v:.{d}f}"  # noqa: E731
    rate = lambda v: "none" if v == math.inf else f(v, 1)  # noqa: E731
    lines = [
        "",
        f"## Predicted for a memory-bound accelerator (A100: {GPU_BANDWIDTH_B_S / 1e12:.2f} TB/s, compute roof "
        f"{roof_rows:g} rows per step)",
        "",
        "From each seed's in-loop acceptance (pooled over its rates) and the pair's c (draft weights over the "
        "target's): a plain step streams the target's bf16 weights once (step ms), an iteration of g drafts costs g c "
        "+ 1 of them, and each of its rows per request adds 1/roof of one (``bounds.predicted_serving``). At each "
        "offered rate both methods run with the occupancy their own speed gives them (Little's law); the TPOT gain "
        "is ar's over the method's. KV reads, prefill and launch overheads are left out. b*: the batch at which the "
        "two cost the same per token; crossover: the lowest rate with a gain below 1 (mean and 95% t-interval over "
        "seeds; none: the gain at a full batch stays above 1).",
        "",
        "| pair | dataset | method | c | step ms | tokens / iteration | drafts / iteration | gain alone | gain at a "
        "full batch | b* | crossover /s at the slots [95% CI] | crossover /s, unbounded slots | ar's capacity /s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in pred.itertuples():
        lines.append(
            f"| {r.pair} | {r.dataset} | {r.method} | {f(r.c, 3)} | {f(r.step_ms, 3)} | "
            f"{f(r.tokens_per_iteration)} | {f(r.drafted_per_iteration)} | {f(r.gain_idle)} | "
            f"{f(r.gain_full)} ({r.slots:g}) | {'inf' if r.occupancy == math.inf else f(r.occupancy, 1)} | "
            f"{rate(r.rate)}{f' [{f(r.rate_low, 1)}, {f(r.rate_high, 1)}]' if math.isfinite(r.rate) else ''} | "
            f"{rate(r.rate_unbounded)} | "
            f"{f(r.ar_capacity, 1)} |"
        )
    return lines


# ----------------------------------------------------------------------------------------------- claims


def load_serving_claims(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The ``serving_claims:`` of ``path`` (default analysis/claims.yaml), each checked; a list ``method`` expands."""
    path = Path(path) if path else CLAIMS_FILE
    data = yaml.safe_load(path.read_text()) or {}
    out = []
    for i, entry in enumerate(data.get("serving_claims") or []):
        where = f"{path} serving claim {i + 1} ({entry.get('id', '?')})"
        missing = [k for k in ("id", "kind", "wording", "method") if k not in entry]
        if missing:
            raise ValueError(f"{where}: missing {missing} (see the serving_claims: header of analysis/claims.yaml)")
        if entry["kind"] not in KINDS:
            raise ValueError(f"{where}: kind={entry['kind']!r}; use one of {list(KINDS)}")
        if entry["kind"] == "never_worse" and not entry.get("references"):
            raise ValueError(f"{where}: a never_worse claim names its references (e.g. [ar, spd])")
        methods = entry["method"] if isinstance(entry["method"], list) else [entry["method"]]
        for m in methods:
            cid = f"{entry['id']}[{m}]" if len(methods) > 1 else str(entry["id"])
            out.append(dict(entry, id=cid, method=str(m)))
    return out


def _gain_holds(claim: dict[str, Any], t: pd.DataFrame) -> dict[str, Any]:
    rows = t[t["method"] == claim["method"]].sort_values("rate")
    if rows.empty:
        return {"verdict": "no data", "R": math.nan, "note": f"no workload cells of {claim['method']!r}"}
    held = math.nan
    for r in rows.itertuples():
        if not (r.low > 1.0):
            break
        held = r.rate
    first = rows.iloc[0]
    if math.isfinite(held):
        return {"verdict": "supported", "R": held, "note": f"the gain's 95% interval lies above 1 up to {held:g}/s"}
    if first["high"] < 1.0:
        return {"verdict": "contradicted", "R": math.nan, "note": f"below 1 already at {first['rate']:g}/s"}
    return {"verdict": "inconclusive", "R": math.nan, "note": f"the interval at {first['rate']:g}/s covers 1"}


def _never_worse(claim: dict[str, Any], runs: pd.DataFrame) -> dict[str, Any]:
    data = with_rate(runs)
    keys = ["pair", "dataset", "seed", "batch_size", "rate"]
    mine = data[data["method_label"] == claim["method"]][keys + ["tpot_ms_p50"]]
    refs = data[data["method_label"].isin([str(r) for r in claim["references"]])]
    if mine.empty or refs.empty:
        return {"verdict": "no data", "R": math.nan, "note": "no workload cells of the method or its references"}
    best = refs.groupby(keys, as_index=False)["tpot_ms_p50"].min().rename(columns={"tpot_ms_p50": "best"})
    merged = mine.merge(best, on=keys)
    margin = float(claim.get("margin") or 0.0)
    worse, thin = [], []
    for rate, g in merged.groupby("rate", sort=True):
        effect, low, _ = interval(g["tpot_ms_p50"] / g["best"] - 1.0)
        if math.isfinite(low) and low > margin:
            worse.append(f"{rate:g}/s (+{effect:.0%})")
        if g["seed"].nunique() < 2:
            thin.append(f"{rate:g}/s")
    if worse:
        note = "worse than the best reference at " + ", ".join(worse)
        return {"verdict": "contradicted", "R": math.nan, "note": note}
    if thin:
        return {"verdict": "inconclusive", "R": math.nan, "note": "fewer than 2 seeds at " + ", ".join(thin)}
    return {"verdict": "supported", "R": math.nan, "note": "within its interval of the best reference at every rate"}


def evaluate(runs: pd.DataFrame, claims: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per serving claim: its verdict, R (gain_holds_up_to) and why."""
    t = table(runs)
    rows = []
    for claim in claims:
        got = _gain_holds(claim, t) if claim["kind"] == "gain_holds_up_to" else _never_worse(claim, runs)
        rows.append({"id": claim["id"], "wording": claim["wording"], "method": claim["method"], **got})
    return pd.DataFrame(rows, columns=["id", "wording", "method", "verdict", "R", "note"])


# ----------------------------------------------------------------------------------------------- outputs


def markdown(
    runs: pd.DataFrame, claims: list[dict[str, Any]] | None = None, predicted_table: pd.DataFrame | None = None
) -> str:
    """The serving tables: per rate, the crossover rates (measured, and ``predicted``'s for a memory-bound
    accelerator when given) and the load claims' verdicts."""
    t, cross = table(runs), crossover(runs)
    f = lambda v, d=2: "–" if v is None or not math.isfinite(v) else f"{v:.{d}f}"  # noqa: E731
    lines = [
        "# Under load: throughput, latency and goodput against the offered rate",
        "",
        "Means over seeds; TPOT gain: ar's TPOT p50 over the method's at the same rate, per seed, mean and 95% "
        "t-interval. Latencies from each request's arrival.",
        "",
        "| pair | dataset | method | rate /s | seeds | tokens/s | TPOT p50 / p99 ms | TTFT p50 s | goodput /s "
        "| occupancy | TPOT gain [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in t.itertuples():
        lines.append(
            f"| {r.pair} | {r.dataset} | {r.method} | {r.rate:g} | {r.seeds} | {f(r.throughput_tok_s)} | "
            f"{f(r.tpot_ms_p50, 1)} / {f(r.tpot_ms_p99, 1)} | {f(r.ttft_s_p50, 3)} | {f(r.goodput_rps, 3)} | "
            f"{f(r.occupancy)} | {f(r.gain)} [{f(r.low)}, {f(r.high)}] |"
        )
    lines += [
        "",
        "Crossover: each seed's lowest rate with a TPOT gain below 1 (mean, 95% t-interval over the seeds that have "
        "one).",
        "",
        "| pair | dataset | method | crossover rate /s [95% CI] | seeds with one | rates measured |",
        "|---|---|---|---|---|---|",
    ]
    for r in cross.itertuples():
        shown = (
            f"{f(r.crossover_rate)} [{f(r.low)}, {f(r.high)}]"
            if math.isfinite(r.crossover_rate)
            else f"none (> {r.highest_rate:g})"
        )
        if math.isfinite(r.crossover_rate) and r.crossover_rate <= r.lowest_rate:
            shown += f" (at the lowest rate, {r.lowest_rate:g})"
        lines.append(
            f"| {r.pair} | {r.dataset} | {r.method} | {shown} | {r.seeds_with_one} of {r.seeds} | "
            f"{r.lowest_rate:g}-{r.highest_rate:g} |"
        )
    if predicted_table is not None:
        lines += predicted_markdown(predicted_table)
    if claims:
        verdicts = evaluate(runs, claims)
        lines += ["", "## Load claims", "", "| claim | method | verdict | R /s | why |", "|---|---|---|---|---|"]
        for v in verdicts.itertuples():
            lines.append(f"| {v.wording} | {v.method} | {v.verdict} | {f(v.R)} | {v.note} |")
    return "\n".join(lines) + "\n"


def serving_vs_rate(runs: pd.DataFrame):
    """The figure: per (pair, dataset) a row of four panels against the offered rate: throughput, TPOT p50 (solid)
    and p99 (dashed), goodput, and the TPOT gain over ar with its 95% interval. None without a rate axis."""
    if not varies(runs):
        return None
    t = table(runs)
    blocks = list(t.groupby(["pair", "dataset"], sort=True).groups)
    fig, axes = plt.subplots(len(blocks), 4, figsize=(18, 3.6 * len(blocks)), squeeze=False)
    for row, (pair, dataset) in zip(axes, blocks):
        g = t[(t["pair"] == pair) & (t["dataset"] == dataset)]
        for method, m in g.groupby("method", sort=True):
            m = m.sort_values("rate")
            (line,) = row[0].plot(m["rate"], m["throughput_tok_s"], marker="o", label=method)
            row[1].plot(m["rate"], m["tpot_ms_p50"], marker="o", color=line.get_color(), label=f"{method} p50")
            row[1].plot(m["rate"], m["tpot_ms_p99"], linestyle="--", color=line.get_color())
            row[2].plot(m["rate"], m["goodput_rps"], marker="o", color=line.get_color(), label=method)
            if method != schema.BASELINE:
                err = np.vstack([(m["gain"] - m["low"]).fillna(0.0), (m["high"] - m["gain"]).fillna(0.0)])
                row[3].errorbar(m["rate"], m["gain"], yerr=err, marker="o", capsize=3, color=line.get_color())
        row[3].axhline(1.0, color="grey", linewidth=0.8)
        for ax, ylabel in zip(row, ("tokens/s", "TPOT ms (p50 solid, p99 dashed)", "goodput requests/s", "TPOT gain")):
            ax.set_xscale("log", base=2)  # rate axes are geometric (0.5, 1, 2, 4): each step doubles the load
            ax.set_xlabel("offered rate (requests/s, log scale)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{pair} · {dataset}", fontsize=9)
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=7)
    fig.suptitle("Under load (means over seeds; TPOT gain over ar at the same rate, 95% CI)", fontsize=10)
    fig.tight_layout()
    return fig
