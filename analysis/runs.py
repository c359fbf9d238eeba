"""A sweep's MLflow runs as tidy DataFrames: one row per cell run, and one row per generation.

    runs = load_runs("smoke")                      # the project's sqlite:///mlflow.db by default
    samples = load_samples(runs)                   # samples.jsonl of every run, one row per generation

Names come from ``analysis.schema`` (the MLflow layout of ``pipeline/tracking/layout.py``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import ViewType
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from analysis import schema
from pipeline.tracking import resolve_tracking_uri
from pipeline.tracking.tracker import STALE_AFTER_S

REPO_ROOT = Path(__file__).resolve().parent.parent
ID_COLUMNS = ("run_id", "cell_key", "sweep", "method", "label", "pair", "dataset", "seed", "status", "device")


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else the project's store (``sqlite:///mlflow.db`` at the repo root)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return resolve_tracking_uri("sqlite:///mlflow.db", REPO_ROOT)


def _client(tracking_uri: str | None):
    return MlflowClient(tracking_uri=tracking_uri or default_tracking_uri())


def list_sweeps(tracking_uri: str | None = None) -> list[str]:
    """Names of the experiments (sweeps) in the store that hold at least one cell run."""
    client = _client(tracking_uri)
    out = []
    for exp in client.search_experiments():
        runs = client.search_runs(
            [exp.experiment_id], filter_string=f"tags.{schema.TAG_KIND} = '{schema.KIND_CELL}'", max_results=1
        )
        if runs:
            out.append(exp.name)
    return sorted(out)


def parse_param(text: str | None) -> Any:
    """A param's text back to a value: numbers, booleans, null and JSON lists/dicts; other text as is."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        low = text.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        if low in ("none", "null"):
            return None
        return text


def load_runs(
    sweep: str, tracking_uri: str | None = None, *, finished_only: bool = True, all_configs: bool = False
) -> pd.DataFrame:
    """One row per active cell run of experiment ``sweep``: id tags, canonical metrics, parsed params.

    Deleted (superseded) runs are never returned; failed cells are dropped unless
    ``finished_only=False``. ``seed`` is an int; metrics a run did not log are NaN. A cell key with
    several active runs (two drivers on one store before leases existed) is counted once, by its
    newest finished run, with a warning naming the keys: pooling duplicates would shrink the spread.
    A label with runs of several configurations (a store that outlived a change of the sweep's settings,
    of a checkpoint or of the harness) keeps those of its newest run's configuration, with a warning
    (``all_configs=True``: all, labelled ``<label>@<config>``); column ``config`` is the fingerprint.
    ``df.attrs`` holds ``sweep`` and ``tracking_uri``.
    """
    uri = tracking_uri or default_tracking_uri()
    client = _client(uri)
    exp = client.get_experiment_by_name(sweep)
    if exp is None:
        known = ", ".join(list_sweeps(uri)) or "none"
        raise LookupError(
            f"no MLflow experiment {sweep!r} in {uri} (sweeps with cell runs there: {known}); run `make run` or pass "
            "the tracking URI"
        )
    runs, token = [], None
    while True:
        page = client.search_runs(
            [exp.experiment_id],
            filter_string=f"tags.{schema.TAG_KIND} = '{schema.KIND_CELL}'",
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=1000,
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            break
    rows = []
    for r in runs:
        tags, metrics, params = r.data.tags, r.data.metrics, r.data.params
        row: dict[str, Any] = {"run_id": r.info.run_id, "_time": r.info.end_time or r.info.start_time or 0}
        row.update({col: tags.get(tag) for col, tag in schema.TAGS.items()})
        row.update({col: metrics.get(name, math.nan) for col, name in schema.METRICS.items()})
        row.update({col: parse_param(params.get(name)) for col, name in schema.PARAMS.items()})
        row.update(_method_params(params, taken=row))
        row["_pair_config"] = {k: v for k, v in params.items() if k.startswith(schema.PAIR_PARAM_PREFIX)}
        row["_config"] = {k: v for k, v in params.items() if _is_config_param(k)}
        row["_config_key"] = tags.get(schema.CONFIG_KEY_TAG) or None
        row["_isolation"] = tags.get(schema.ISOLATION_TAG) or ""
        rows.append(row)
    rows = dedupe_runs(rows)
    _split_pairs_by_config(rows)
    rows = _newest_configs(rows, keep_all=all_configs)
    for row in rows:
        row.pop("_time", None)
    logged = list(dict.fromkeys(k for row in rows for k in row.get("_method_params", ())))
    for row in rows:
        row.pop("_method_params", None)
    columns = list(
        dict.fromkeys(["run_id", *schema.TAGS, *schema.METRICS, *schema.PARAMS, *logged, "pair_config", "config"])
    )
    df = pd.DataFrame(rows, columns=columns)
    df["seed"] = pd.to_numeric(df["seed"], errors="coerce").astype("Int64")
    df["sweep"] = df["sweep"].fillna(sweep).replace("", sweep)
    for col in schema.METRICS:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    if finished_only:
        df = df[df["status"] == schema.STATUS_FINISHED]
    df = df.sort_values(["pair", "dataset", "label", "seed"], kind="stable").reset_index(drop=True)
    numeric = [k for k in logged if k not in schema.PARAMS and _numeric(df[k])]
    df.attrs.update(sweep=sweep, tracking_uri=uri, method_params=logged, method_numeric_params=numeric)
    return df


def _method_params(params: dict[str, str], taken: dict[str, Any]) -> dict[str, Any]:
    """A run's own scalar method parameters (``method.<key>`` params: number, bool, text), each under its key, as
    logged (a `module:attr` method's included); the drafter's scope (``method.drafter.*``) and the columns the
    schema already fills are left out. ``_method_params`` lists the keys found."""
    out: dict[str, Any] = {}
    for name, text in params.items():
        key = name.removeprefix(schema.METHOD_PARAM_PREFIX)
        if key == name or "." in key or key in ("name", "config") or key in taken:
            continue
        value = parse_param(text)
        if isinstance(value, (int, float, bool, str)):
            out[key] = value
    out["_method_params"] = [k for k in out]
    return out


def _numeric(column: pd.Series) -> bool:
    """Whether a column's values are numbers (not booleans): an ablation axis."""
    values = column.dropna()
    return bool(len(values)) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def unfinished_cells(sweep: str, tracking_uri: str | None = None) -> list[dict[str, Any]]:
    """Every cell run of ``sweep`` that did not finish and that no finished run of its cell key supersedes: failed
    cells (their ``error``), cells killed with their driver (MLflow status KILLED, closed by the next driver, often
    without tags: a run killed mid-logging), runs still RUNNING (a driver logging them, or one that is gone and
    not yet closed), planned cells never logged (their driver stopped, or is gone: ``driver_gone``) and planned
    cells of a live driver not logged yet (``in flight``). Each: ``run_id``, ``cell_key``, ``label``, ``state``
    and ``why``. The report lists them (``unfinished.md``) instead of leaving them out without a word."""
    uri = tracking_uri or default_tracking_uri()
    client = _client(uri)
    exp = client.get_experiment_by_name(sweep)
    if exp is None:
        return []
    runs, token = [], None
    while True:
        page = client.search_runs(
            [exp.experiment_id], run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token
        )
        runs.extend(page)
        token = page.token
        if not token:
            break
    finished = {
        r.data.tags.get(schema.TAG_CELL_KEY)
        for r in runs
        if r.data.tags.get(schema.TAG_KIND) == schema.KIND_CELL
        and r.info.status == "FINISHED"
        and r.data.tags.get(schema.TAG_STATUS) == schema.STATUS_FINISHED
    }
    out = []
    logged = {r.data.tags.get(schema.TAG_CELL_KEY) for r in runs if r.data.tags.get(schema.TAG_CELL_KEY)}
    gone = {}  # parent run id -> why its driver is taken as gone (RUNNING parents only)
    for r in runs:  # cells a driver set out to run and never logged
        if r.data.tags.get(schema.TAG_KIND) != schema.KIND_SWEEP:
            continue
        if r.info.status == "RUNNING":
            why_gone = driver_gone(r)
            if why_gone:
                gone[r.info.run_id] = why_gone
                state, why = "never logged", f"its driver (parent run {r.info.run_id}, RUNNING) is gone: {why_gone}"
            else:  # a live driver's cells are in flight, or still to run: not finished either
                state, why = "in flight", f"its driver (parent run {r.info.run_id}) is running: {driver_name(r)}"
        else:  # the driver was killed before their results came back
            state, why = (
                "never logged",
                f"its driver (parent run {r.info.run_id}, {r.info.status}) stopped before its result",
            )
        for cell in _planned_cells(client, r.info.run_id):
            key = str(cell.get("cell_key") or "")
            if key and key not in logged:
                logged.add(key)
                out.append(
                    {"run_id": "", "cell_key": key, "label": str(cell.get("label") or ""), "state": state}
                    | {"why": why}
                )
    for r in runs:
        tags = r.data.tags
        if tags.get(schema.TAG_KIND) == schema.KIND_SWEEP:
            continue  # a driver's parent run, not a cell
        key = tags.get(schema.TAG_CELL_KEY) or ""
        if key and key in finished:
            continue
        status, cell_status = r.info.status, tags.get(schema.TAG_STATUS)
        if status == "FINISHED" and cell_status == schema.STATUS_FINISHED:
            continue
        if status == "KILLED":
            state, why = "killed", "its driver was stopped mid-cell (closed as KILLED by the next driver)"
        elif status == "RUNNING" and tags.get(MLFLOW_PARENT_RUN_ID) in gone:
            state = "running"
            why = f"left by a driver that is gone ({gone[tags[MLFLOW_PARENT_RUN_ID]]}); the next driver closes it"
        elif status == "RUNNING":
            state, why = "running", "being logged by a driver, or left by one that is gone (the next driver closes it)"
        else:
            state = str(cell_status or status).lower()
            why = (tags.get(schema.TAG_ERROR) or "no error recorded").strip().splitlines()[-1][:300]
        out.append(
            {"run_id": r.info.run_id, "cell_key": key, "label": tags.get(schema.TAG_LABEL) or "", "state": state}
            | {"why": why}
        )
    return sorted(out, key=lambda row: (row["label"], row["cell_key"], row["run_id"]))


def driver_name(run: Any) -> str:
    """``pid <pid> on <host>`` of a parent run's driver (its tags; ``?`` where a store before them lacks them)."""
    tags = run.data.tags
    return f"pid {tags.get(schema.TAG_DRIVER_PID) or '?'} on {tags.get(schema.TAG_DRIVER_HOST) or '?'}"


def driver_gone(run: Any, now: float | None = None) -> str:
    """Why the driver of a RUNNING parent run is gone, or "" while it may live. A driver killed with SIGKILL never
    closes its parent run: it is gone when its process no longer exists (its host is this one) or when its
    heartbeat (refreshed every ``HEARTBEAT_S``) is older than ``STALE_AFTER_S`` (any host). Reads only: no lease
    is taken, nothing is written."""
    tags = run.data.tags
    now = time.time() if now is None else now
    pid, host = str(tags.get(schema.TAG_DRIVER_PID) or ""), tags.get(schema.TAG_DRIVER_HOST) or ""
    if pid.isdigit() and host == os.uname().nodename and not _process_exists(int(pid)):
        return f"its process ({driver_name(run)}) no longer exists"
    try:
        beat = float(tags.get(schema.TAG_HEARTBEAT) or (run.info.start_time or 0) / 1000)
    except ValueError:
        beat = (run.info.start_time or 0) / 1000
    if now - beat > STALE_AFTER_S:
        return f"no heartbeat for {now - beat:.0f} s ({driver_name(run)})"
    return ""


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid > 0  # another user's process
    return pid > 0


def _planned_cells(client, run_id: str) -> list[dict[str, Any]]:
    """The cells a parent run's driver set out to run (``planned_cells.json``; none for stores before it)."""

    try:
        path = client.download_artifacts(run_id, "planned_cells.json")
        cells = json.loads(Path(path).read_text())
    except Exception:  # noqa: BLE001 - a parent run written before the list was logged
        return []
    return [c for c in cells if isinstance(c, dict)] if isinstance(cells, list) else []


def unfinished_markdown(sweep: str, rows: list[dict[str, Any]]) -> str:
    """``unfinished_cells`` as a Markdown table (every cell that did not finish, none left out)."""
    lines = [f"# {sweep}: cells that did not finish ({len(rows)})", ""]
    if not rows:
        return "\n".join(lines + ["Every cell run finished.", ""])
    lines += ["| label | cell key | state | why | run |", "|---|---|---|---|---|"]
    for row in rows:
        why = row["why"].replace("|", "\\|")
        lines.append(
            f"| {row['label'] or '(no tags)'} | {row['cell_key'] or '?'} | {row['state']} | {why} | {row['run_id']} |"
        )
    return "\n".join(lines + ["", "Run the same sweep command again to run them (finished cells are skipped).", ""])


def dedupe_runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per ``cell_key``: the newest finished run (else the newest of any status); warns on duplicates."""
    rank = {schema.STATUS_FINISHED: 1}
    best: dict[Any, dict[str, Any]] = {}
    extra: dict[Any, int] = {}
    for row in rows:
        key = row.get("cell_key") or row["run_id"]
        have = best.get(key)
        if have is not None:
            extra[key] = extra.get(key, 0) + 1
        order = (rank.get(str(row.get("status")), 0), row.get("_time") or 0, row["run_id"])
        if have is None or order > (rank.get(str(have.get("status")), 0), have.get("_time") or 0, have["run_id"]):
            best[key] = row
    if extra:
        warnings.warn(
            (
                f"{len(extra)} cell key(s) have more than one active run (e.g. "
                f"{', '.join(map(str, list(extra)[:5]))}); each is counted once, by its newest finished run. Delete "
                "the extra runs (mlflow runs delete) to silence this."
            ),
            stacklevel=3,
        )
    return list(best.values())


def _fingerprint(config: dict[str, Any]) -> str:
    """Six hex digits naming a set of params (``pair_config``, ``config``)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:6]


def _differing(configs: list[dict[str, Any]]) -> list[str]:
    """The param names whose values are not the same in all of ``configs`` (absent counts as a value)."""
    return sorted({k for c in configs for k in c if len({str(o.get(k)) for o in configs}) > 1})


def _is_config_param(name: str) -> bool:
    """Whether a param is part of a cell's identity (``Cell.identity``: everything but the seed and the judge; the
    slice as configured, not where its data lives, and its task by version): what may tell two configurations of
    a label apart, and what ``config`` is made of for runs logged before the ``config_key`` tag."""
    if name in schema.NOT_IDENTITY_PARAMS:
        return False
    return name == "dataset.task.version" or not name.startswith(schema.NOT_IDENTITY_PREFIXES)


def _config_of(row: dict[str, Any]) -> str:
    """A run's configuration fingerprint: its cell identity without the seed (tag ``config_key``; else, for runs
    logged before that tag, its identity's params) and the isolation mode it was measured under."""
    identity: Any = row["_config_key"] or row["_config"]
    return _fingerprint({"identity": identity, "isolation": row["_isolation"]})


def _newest_configs(rows: list[dict[str, Any]], keep_all: bool = False) -> list[dict[str, Any]]:
    """Per (pair, dataset, label), the runs of its newest run's configuration (``config``: ``_config_of``, every
    input of the cell key but the seed, and the isolation mode); a warning says what was left out and which params
    differ. ``keep_all``: every run, the label of each configuration but the newest's written ``<label>@<config>``."""
    groups: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {}
    configs: dict[str, dict[str, str]] = {}
    for row in rows:
        row["config"] = _config_of(row)
        config = {**row.pop("_config"), "cpu_isolation": row.pop("_isolation")}
        row.pop("_config_key")
        configs[row["config"]] = config
        groups.setdefault((row["pair"], row["dataset"], row["label"]), {}).setdefault(row["config"], []).append(row)
    out: list[dict[str, Any]] = []
    notes: list[str] = []
    for (pair, dataset, label), by_config in groups.items():
        newest = max(by_config, key=lambda c: max(r.get("_time") or 0 for r in by_config[c]))
        out += by_config[newest]
        if len(by_config) == 1:
            continue
        older = [c for c in by_config if c != newest]
        differ = _differing([configs[c] for c in by_config]) or ["precision (the pair's dtypes and kernels as planned)"]
        n_old = sum(len(by_config[c]) for c in older)
        note = (
            f"{pair} {dataset} {label!r}: {n_old} run(s) of {len(older)} older configuration(s) (differing: "
            f"{', '.join(differ)})"
        )
        if keep_all:
            for c in older:
                for row in by_config[c]:
                    row["label"] = f"{label}@{c}"
                out += by_config[c]
            note += f" reported apart as {', '.join(f'{label}@{c}' for c in older)}"
        notes.append(note)
    if notes:  # one warning for the whole store
        what = (
            "reported apart"
            if keep_all
            else "left out, the newest configuration of each label kept (load_runs(..., all_configs=True) keeps them)"
        )
        warnings.warn(f"runs of older configurations {what}: " + "; ".join(notes), stacklevel=3)
    return out


def _split_pairs_by_config(rows: list[dict[str, Any]]) -> None:
    """Give every row a ``pair_config`` fingerprint; rename pairs whose name covers several configs.

    A store can hold runs of one pair name with different models (a retrained draft, another dtype):
    pooling them would mix two experiments. Such rows get ``pair = "<name>@<fingerprint>"`` and a
    warning names the keys that differ.
    """
    by_name: dict[str, dict[str, dict[str, str]]] = {}
    for row in rows:
        config = row.pop("_pair_config")
        fingerprint = _fingerprint(config)
        row["pair_config"] = fingerprint
        by_name.setdefault(row["pair"], {})[fingerprint] = config
    for name, configs in by_name.items():
        if len(configs) < 2:
            continue
        keys = _differing(list(configs.values()))
        warnings.warn(
            f"pair {name!r} has runs with {len(configs)} different configs (differing: {', '.join(keys)}); "
            f"they are reported apart as {', '.join(f'{name}@{f}' for f in sorted(configs))}",
            stacklevel=3,
        )
        for row in rows:
            if row["pair"] == name:
                row["pair"] = f"{name}@{row['pair_config']}"


def sample_score(record: dict[str, Any], sample_value: str | None = None) -> float:
    """A generation's own score: the field ``sample_value`` of its verdicts (what its run logged as its scorer's
    per-sample value); without one (runs logged before that tag), the first present of the registered scorers'
    (HumanEval ``passed``, Spider ``correct`` (1/0), a judge's ``score``)."""
    detail = record.get(schema.SCORE_DETAIL_FIELD) or {}
    for key in [sample_value] if sample_value else schema.SCORE_DETAIL_KEYS:
        value = detail.get(key)
        if isinstance(value, bool):
            return float(value)
        if isinstance(value, (int, float)) and math.isfinite(float(value)):
            return float(value)
    return math.nan


def load_samples(runs: pd.DataFrame, tracking_uri: str | None = None) -> pd.DataFrame:
    """One row per generation of every run in ``runs`` (its ``samples.jsonl``), with the run's ids.

    Columns: the run's id columns, then ``id``, ``turn``, ``new_tokens``, ``steps``, ``draft_steps``,
    ``decode_s``, ``tokens_per_s``, ``perplexity``, ``accepted`` (list per step) and ``sample_score``.
    Runs without the artifact contribute no rows.
    """
    uri = tracking_uri or runs.attrs.get("tracking_uri") or default_tracking_uri()
    client = _client(uri)
    rows: list[dict[str, Any]] = []
    with _no_progress_bars():
        _read_samples(client, runs, rows)
    columns = [*[c for c in ID_COLUMNS if c in runs.columns], *schema.RECORD_FIELDS, "sample_score"]
    df = pd.DataFrame(rows, columns=columns)
    for col in ("new_tokens", "steps", "draft_steps", "decode_s", "tokens_per_s", "perplexity", "sample_score"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    if "seed" in df:
        df["seed"] = pd.to_numeric(df["seed"], errors="coerce").astype("Int64")
    df.attrs.update(runs.attrs)
    return df


@contextmanager
def _no_progress_bars():
    """MLflow draws a progress bar per downloaded artifact; one per run would flood notebooks."""
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _read_samples(client, runs: pd.DataFrame, rows: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory(prefix="analysis-samples-") as tmp:
        for run in runs.itertuples(index=False):
            ids = {c: getattr(run, c) for c in ID_COLUMNS if hasattr(run, c)}
            sample_value = getattr(run, "score_sample_value", None) or None
            try:
                path = client.download_artifacts(run.run_id, schema.SAMPLES_ARTIFACT, str(Path(tmp) / run.run_id))
            except Exception:  # noqa: BLE001 - a run without samples (failed cell) has none
                continue
            for line in Path(path).read_text().splitlines():
                if not line.strip():
                    continue
                rec = json.loads(line)
                row = dict(ids)
                row.update({col: rec.get(field) for col, field in schema.RECORD_FIELDS.items()})
                row["sample_score"] = sample_score(rec, sample_value if isinstance(sample_value, str) else None)
                rows.append(row)


def varying_params(runs: pd.DataFrame, params: Iterable[str] | None = None) -> dict[str, list[str]]:
    """method -> the ablation params (default: ``schema.ablation_params(runs)``) that take more than one value among
    that method's runs."""
    params = schema.ablation_params(runs) if params is None else params
    out: dict[str, list[str]] = {}
    for method, g in runs.groupby("method"):
        vary = [p for p in params if p in g and g[p].dropna().astype(str).nunique() > 1]
        if vary:
            out[str(method)] = vary
    return out


def order_labels(labels: Iterable[str], methods: dict[str, str] | None = None) -> list[str]:
    """Labels in table order: by ``schema.METHOD_ORDER`` of their method, then by label."""
    labels = list(dict.fromkeys(labels))
    methods = methods or {}

    def key(label: str):
        method = methods.get(label, label.split("(")[0])
        rank = schema.METHOD_ORDER.index(method) if method in schema.METHOD_ORDER else len(schema.METHOD_ORDER)
        return (rank, method, _natural(label))

    return sorted(labels, key=key)


def _natural(text: str) -> tuple:
    """Sort key that orders numbers inside labels numerically (tau=0.1 < tau=0.3, beams=4 < beams=8)."""
    parts = re.split(r"(\d+(?:\.\d+)?)", text)
    return tuple((0, float(p), "") if re.fullmatch(r"\d+(?:\.\d+)?", p) else (1, 0.0, p) for p in parts)


def label_methods(runs: pd.DataFrame) -> dict[str, str]:
    """label -> method name, as the runs say."""
    return {str(k): str(v) for k, v in runs.drop_duplicates("label").set_index("label")["method"].items()}


def finite(values: Iterable[float]) -> np.ndarray:
    """The finite values of a sequence, as a float array."""
    arr = np.asarray(list(values), dtype=float)
    return arr[np.isfinite(arr)]


def load_result(run_id: str, tracking_uri: str | None = None) -> dict[str, Any]:
    """A run's ``result.json`` (summary, energy reading with its reason when unavailable, device, settings)."""
    client = _client(tracking_uri)
    with tempfile.TemporaryDirectory(prefix="analysis-result-") as tmp, _no_progress_bars():
        return json.loads(Path(client.download_artifacts(run_id, schema.RESULT_ARTIFACT, tmp)).read_text())
