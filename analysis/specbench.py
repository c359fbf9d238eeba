"""A sweep's generations in Spec-Bench's answer format, and Spec-Bench's per-category leaderboard.

    python -m analysis.specbench --sweep NAME [--dataset spec_bench] [--out reports/NAME/specbench]

Spec-Bench (Xia et al. 2024, github.com/hemingkx/Spec-Bench) writes one JSON line per question:
``{"question_id", "category", "answer_id", "model_id", "choices": [{"index": 0, "turns": [text per
turn], "decoding_steps": [...], "new_tokens": [...], "wall_time": [seconds per turn], "accept_lengths":
[tokens emitted per decoding step, all turns]}], "tstamp"}``, one file per model/method per run
(``model_answer_temp0_run_<k>/<model_id>.jsonl``). Here a run is a seed: every finished cell of the
dataset becomes ``<out>/<pair>/run_<seed>/<model_id>.jsonl`` with ``model_id = <pair>-<label>``; the
fields come from the cell's ``samples.jsonl`` (``text``, ``steps``, ``new_tokens``, ``decode_s`` and
``accepted`` per generation, ``category`` per sample), so Spec-Bench's ``evaluation/speed.py`` reads
them as they are.

The leaderboard follows ``speed.py``: per run, speed = mean over questions of (sum of new tokens /
sum of wall time over the question's turns), speed-up = method speed / baseline speed of the same
run; the reported speed-up is the mean over runs, and "#mean accepted tokens" the mean of every
accept length pooled over runs (1.00 for autoregressive decoding). Categories are Spec-Bench's six
task groups (the eight MT-Bench categories form ``mt_bench``) and ``overall``. The baseline's new
tokens are the counted ones (``speed.py`` re-tokenises the baseline's text, which gives the same count
where detokenisation round-trips).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from analysis import schema
from analysis.runs import REPO_ROOT, _client, _no_progress_bars, default_tracking_uri, load_runs
from pipeline.data import load_dataset

GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
GROUP_TITLES = {
    "mt_bench": "Multi-turn Conversation",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "Question Answering",
    "math_reasoning": "Mathematical Reasoning",
    "rag": "Retrieval-aug. Generation",
}
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
OVERALL = "overall"


def group_of(category: str | None) -> str | None:
    """Spec-Bench's task group of a category (speed.py: the eight MT-Bench categories are ``mt_bench``)."""
    if category is None:
        return None
    return "mt_bench" if category in MT_BENCH_CATEGORIES else category


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]", "_", text)


def model_id(pair: str, label: str) -> str:
    """A file-name-safe model id: ``<pair>-<label>`` with anything but ``[A-Za-z0-9._=-]`` as ``_``."""
    return _safe(f"{pair}-{label}")


def _question_id(sample_id: str) -> int | str:
    return int(sample_id) if str(sample_id).isdigit() else sample_id


def answers_from_records(
    records: Iterable[dict[str, Any]],
    model: str,
    tstamp: float = 0.0,
    categories: dict[str, str] | None = None,
    run_id: str = "",
) -> list[dict[str, Any]]:
    """Spec-Bench answer lines from a cell's generation records (one line per sample, turns in order)."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_id.setdefault(str(rec["id"]), []).append(rec)
    out = []
    for sid, recs in by_id.items():
        recs.sort(key=lambda r: int(r.get("turn", 0)))
        category = recs[0].get("category") or (categories or {}).get(sid)
        choice = {
            "index": 0,
            "turns": [r.get("text") if r.get("text") is not None else "" for r in recs],
            "decoding_steps": [int(r["steps"]) for r in recs],
            "new_tokens": [int(r["new_tokens"]) for r in recs],
            "wall_time": [float(r["decode_s"]) for r in recs],
            "accept_lengths": [int(a) for r in recs for a in (r.get("accepted") or [])],
        }
        out.append(
            {
                "question_id": _question_id(sid),
                "category": category,
                "answer_id": f"{run_id}-{sid}" if run_id else sid,
                "model_id": model,
                "choices": [choice],
                "tstamp": tstamp,
            }
        )
    return out


def _records(client, run_id: str, tmp: str) -> list[dict[str, Any]]:
    try:
        path = client.download_artifacts(run_id, schema.SAMPLES_ARTIFACT, str(Path(tmp) / run_id))
    except Exception:  # noqa: BLE001 - a run without samples has nothing to export
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _categories_from_data(path: str | Path | None, dataset: str) -> dict[str, str]:
    """sample id -> category from the dataset itself (for records logged before ``category`` was)."""
    if not path:
        return {}
    try:
        return {s.id: s.category for s in load_dataset(dataset, path) if s.category}
    except Exception:  # noqa: BLE001 - categories are optional: unknown ones stay None
        return {}


def export(
    sweep: str,
    out: str | Path,
    tracking_uri: str | None = None,
    *,
    dataset: str = "spec_bench",
    data_path: str | Path | None = None,
) -> dict[tuple[str, str, int], Path]:
    """Write every finished cell of ``dataset`` in ``sweep`` as a Spec-Bench answer file.

    Returns ``(pair, label, seed) -> path``. ``data_path`` (the dataset's folder or file) gives the
    categories of records that do not carry one (the runs' own ``dataset.path`` param is tried first).
    """
    uri = tracking_uri or default_tracking_uri()
    runs = load_runs(sweep, uri)
    runs = runs[runs["dataset"] == dataset]
    if runs.empty:
        raise LookupError(f"sweep {sweep!r} has no finished {dataset} cells in {uri}")
    client = _client(uri)
    out_dir = Path(out)
    written: dict[tuple[str, str, int], Path] = {}
    cached: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="specbench-") as tmp, _no_progress_bars():
        for run in runs.itertuples(index=False):
            info = client.get_run(run.run_id)
            records = _records(client, run.run_id, tmp)
            if not records:
                continue
            categories = None
            if any(not r.get("category") for r in records):
                source = str(data_path or info.data.params.get("dataset.path") or "")
                if source not in cached:
                    cached[source] = _categories_from_data(source, dataset)
                categories = cached[source]
            model = model_id(run.pair, run.label)
            lines = answers_from_records(records, model, (info.info.start_time or 0) / 1000.0, categories, run.run_id)
            path = out_dir / _safe(run.pair) / f"run_{int(run.seed)}" / f"{model}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(line) + "\n" for line in lines))
            written[(run.pair, run.label, int(run.seed))] = path
    return written


def read_answers(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _in_task(answer: dict[str, Any], task: str) -> bool:
    return task == OVERALL or group_of(answer.get("category")) == task


def run_speed(answers: Sequence[dict[str, Any]], task: str) -> tuple[float, list[int]]:
    """speed.py for one run and task: mean over questions of tokens / wall time, and the accept lengths."""
    speeds, accepts = [], []
    for a in answers:
        if not _in_task(a, task):
            continue
        choice = a["choices"][0]
        times = sum(choice["wall_time"])
        if times > 0:
            speeds.append(sum(choice["new_tokens"]) / times)
        accepts.extend(choice["accept_lengths"])
    return (sum(speeds) / len(speeds) if speeds else math.nan), accepts


def leaderboard(
    files: dict[tuple[str, str, int], Path], reference: str = schema.BASELINE, tasks: Sequence[str] = (*GROUPS, OVERALL)
) -> pd.DataFrame:
    """Per (pair, label, task): speed-up over ``reference`` (mean over runs) and mean accepted tokens.

    Columns: pair, label, task, speedup, speedup_std (ddof=1, over runs), tokens_per_s,
    tokens_per_s_baseline, mean_accepted_tokens, runs, questions.
    """
    answers = {k: read_answers(p) for k, p in files.items()}
    rows = []
    for pair, label in sorted({(p, lb) for p, lb, _ in answers}):
        seeds = sorted(s for p, lb, s in answers if (p, lb) == (pair, label))
        for task in tasks:
            ratios, speeds, bases, accepts, questions = [], [], [], [], 0
            for seed in seeds:
                base_key = (pair, reference, seed)
                if base_key not in answers:
                    continue
                speed, acc = run_speed(answers[(pair, label, seed)], task)
                base, _ = run_speed(answers[base_key], task)
                accepts.extend(acc)
                questions += sum(_in_task(a, task) for a in answers[(pair, label, seed)])
                if math.isfinite(speed) and math.isfinite(base) and base > 0:
                    ratios.append(speed / base)
                    speeds.append(speed)
                    bases.append(base)
            if not ratios:
                continue
            mean = sum(ratios) / len(ratios)
            std = (sum((r - mean) ** 2 for r in ratios) / (len(ratios) - 1)) ** 0.5 if len(ratios) > 1 else math.nan
            rows.append(
                {
                    "pair": pair,
                    "label": label,
                    "task": task,
                    "speedup": mean,
                    "speedup_std": std,
                    "tokens_per_s": sum(speeds) / len(speeds),
                    "tokens_per_s_baseline": sum(bases) / len(bases),
                    "mean_accepted_tokens": sum(accepts) / len(accepts) if accepts else math.nan,
                    "runs": len(ratios),
                    "questions": questions,
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "pair",
            "label",
            "task",
            "speedup",
            "speedup_std",
            "tokens_per_s",
            "tokens_per_s_baseline",
            "mean_accepted_tokens",
            "runs",
            "questions",
        ],
    )


def leaderboard_markdown(board: pd.DataFrame) -> str:
    """Spec-Bench's leaderboard layout: speed-up per task group, #mean accepted tokens, overall; then
    the mean accepted tokens per group."""
    if board.empty:
        return "No Spec-Bench cells with a baseline.\n"
    tasks = [t for t in (*GROUPS, OVERALL) if t in set(board["task"])]
    groups = [t for t in tasks if t != OVERALL]
    out = []
    for pair, block in board.groupby("pair", sort=True):
        runs = int(block["runs"].max())
        out.append(f"### {pair}: speed-up over ar (mean of {runs} run(s)) and #mean accepted tokens\n")
        head = [
            "Method",
            *(GROUP_TITLES[g] for g in groups),
            "#Mean Accepted Tokens",
            *(["Overall"] if OVERALL in tasks else []),
        ]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for label, rows in block.groupby("label", sort=False):
            by = rows.set_index("task")
            cells = [f"{by.at[g, 'speedup']:.2f}x" if g in by.index else "–" for g in groups]
            acc = by.at[OVERALL, "mean_accepted_tokens"] if OVERALL in by.index else math.nan
            cells.append(f"{acc:.2f}")
            if OVERALL in tasks:
                cells.append(f"{by.at[OVERALL, 'speedup']:.2f}x" if OVERALL in by.index else "–")
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        out.append("\n#mean accepted tokens per group:\n")
        out.append("| Method | " + " | ".join(GROUP_TITLES[g] for g in groups) + " |")
        out.append("|" + "---|" * (len(groups) + 1))
        for label, rows in block.groupby("label", sort=False):
            by = rows.set_index("task")
            out.append(
                f"| {label} | "
                + " | ".join(f"{by.at[g, 'mean_accepted_tokens']:.2f}" if g in by.index else "–" for g in groups)
                + " |"
            )
        out.append("")
    return "\n".join(out) + "\n"


def write(
    sweep: str,
    out: str | Path,
    tracking_uri: str | None = None,
    *,
    dataset: str = "spec_bench",
    reference: str = schema.BASELINE,
    data_path: str | Path | None = None,
) -> dict[str, Any]:
    """Export the answer files and write ``leaderboard.md`` and ``leaderboard.csv`` under ``out``."""
    out_dir = Path(out)
    files = export(sweep, out_dir, tracking_uri, dataset=dataset, data_path=data_path)
    board = leaderboard(files, reference)
    md = out_dir / "leaderboard.md"
    md.write_text(f"# Spec-Bench leaderboard of sweep {sweep} ({dataset})\n\n" + leaderboard_markdown(board))
    csv = out_dir / "leaderboard.csv"
    board.to_csv(csv, index=False)
    return {"files": files, "board": board, "markdown": md, "csv": csv}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.specbench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", required=True, help="sweep (MLflow experiment) name")
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db at the repo root)",
    )
    parser.add_argument(
        "--dataset", default="spec_bench", help="the cells' dataset (default spec_bench; mt_bench works too)"
    )
    parser.add_argument("--out", default=None, help="output folder (default: reports/<sweep>/specbench)")
    parser.add_argument("--reference", default=schema.BASELINE, help="baseline label (default: ar)")
    parser.add_argument(
        "--data", default=None, help="the dataset's folder, for the categories of records logged without one"
    )
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else REPO_ROOT / "reports" / args.sweep / "specbench"
    try:
        result = write(
            args.sweep, out, args.tracking_uri, dataset=args.dataset, reference=args.reference, data_path=args.data
        )
    except LookupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(leaderboard_markdown(result["board"]))
    print(f"{len(result['files'])} answer file(s) under {out}; leaderboard: {result['markdown']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
