"""The report of one sweep: tables, figures and the executed notebooks, written to ``reports/<sweep>/``.

    python -m analysis.report --sweep smoke                      # make report SWEEP=smoke
    python -m analysis.report --sweep mtad_table5 --tracking-uri sqlite:////data/mlflow.db --reference spd

Writes ``table5.md`` and ``table5.tex`` (Table 5 layout + the speed-up/acceptance/significance table),
``runs.csv`` (the tidy frame, one row per finished cell), ``figures/<name>.png|pdf`` (also logged, with the
tables, as artifacts ``report/`` of the sweep's latest parent run, so they open in the MLflow UI), and for each
notebook of ``analysis/`` the executed copy ``notebooks/<name>.ipynb`` and ``<name>.html`` (nbclient
runs them headless; their ``parameters`` cell is rewritten with the sweep, tracking URI and reference).
Sweeps with Spec-Bench cells also get ``specbench/`` (answer files in Spec-Bench's format and its
per-category leaderboard, ``specbench/leaderboard.md``; see ``analysis/specbench.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import matplotlib.pyplot as plt
import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Metric

from analysis import (
    batching,
    breakdown,
    categories,
    claims_report,
    figures,
    schema,
    serving,
    specbench,
    stats,
    transfer,
)
from analysis.claims import add_acceptance_columns
from analysis.runs import (
    REPO_ROOT,
    default_tracking_uri,
    load_runs,
    load_samples,
    unfinished_cells,
    unfinished_markdown,
)
from analysis.tables import build_tables
from pipeline.tracking import layout

NOTEBOOK_DIR = Path(__file__).resolve().parent
NOTEBOOKS = ("mtad_table5", "ablations", "energy")
PARAMETERS_TAG = "parameters"


def parameters_source(sweep: str, tracking_uri: str, reference: str) -> str:
    """The source of a notebook's ``parameters`` cell with literal values (what the report ran with)."""
    return (
        "# Parameters (rewritten by `python -m analysis.report`; run by hand, they come from the environment)\n"
        f"SWEEP = {sweep!r}\n"
        f"TRACKING_URI = {tracking_uri!r}\n"
        f"REFERENCE = {reference!r}\n"
    )


def _prepare(name: str, parameters: str):
    import nbformat  # noqa: PLC0415 - notebook execution only (--no-notebooks skips it); nbformat/nbclient/nbconvert are the `test` extra

    nb = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and PARAMETERS_TAG in cell.get("metadata", {}).get("tags", []):
            cell.source = parameters
            break
    else:
        nb.cells.insert(0, nbformat.v4.new_code_cell(parameters, metadata={"tags": [PARAMETERS_TAG]}))
    return nb


async def _execute(name: str, out_dir: Path, parameters: str, timeout: int, html: bool) -> dict[str, Any]:
    import nbformat  # noqa: PLC0415 - notebook execution only (--no-notebooks skips it); nbformat/nbclient/nbconvert are the `test` extra
    from nbclient import NotebookClient  # noqa: PLC0415 - as above
    from nbclient.exceptions import CellExecutionError  # noqa: PLC0415 - as above

    nb = _prepare(name, parameters)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(REPO_ROOT)}}
    )
    t0, error = time.perf_counter(), None
    try:
        await client.async_execute()
    except CellExecutionError as err:
        error = str(err)
    nb_dir = out_dir / "notebooks"
    nb_dir.mkdir(parents=True, exist_ok=True)
    nb_path = nb_dir / f"{name}.ipynb"
    nbformat.write(nb, nb_path)
    html_path = None
    if html:
        try:
            from nbconvert import HTMLExporter  # noqa: PLC0415 - optional: without it only the .ipynb is written
        except ImportError:  # nbconvert is optional: the executed .ipynb is still written
            pass
        else:
            body, _ = HTMLExporter().from_notebook_node(nb)
            html_path = out_dir / f"{name}.html"
            html_path.write_text(body)
    return {"notebook": nb_path, "html": html_path, "error": error, "seconds": time.perf_counter() - t0}


def execute_notebooks(
    names: Sequence[str], out_dir: str | Path, parameters: str, timeout: int = 600, html: bool = True
) -> dict[str, dict[str, Any]]:
    """Execute ``analysis/<name>.ipynb`` for each name, concurrently (one kernel each), with ``parameters``.

    Each executed notebook goes to ``<out_dir>/notebooks/<name>.ipynb`` and, with nbconvert, to
    ``<out_dir>/<name>.html``. A failing cell does not raise: the partly executed notebook is saved
    and ``error`` holds the failure. Returns name -> ``{notebook, html, error, seconds}``.
    """
    out = Path(out_dir)

    async def run_all():
        return await asyncio.gather(*(_execute(n, out, parameters, timeout, html) for n in names))

    return dict(zip(names, asyncio.run(run_all())))


def write_report(
    sweep: str,
    tracking_uri: str | None = None,
    out: str | Path | None = None,
    *,
    reference: str = schema.BASELINE,
    cost_ratio: float | None = None,
    notebooks: Sequence[str] | None = NOTEBOOKS,
    n_boot: int = 2000,
    timeout: int = 600,
    log_to_mlflow: bool = True,
    claims_file: str | Path | None = None,
    log=print,
    gpu_cost_ratio: float | None = None,
    command: str = "",
) -> dict[str, Any]:
    """Write the report of ``sweep`` under ``out`` (default ``reports/<sweep>``); returns what was written."""
    uri = tracking_uri or default_tracking_uri()
    out_dir = Path(out) if out else REPO_ROOT / "reports" / sweep
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = load_runs(sweep, uri)
    # every cell that did not finish (failed, killed with its driver, still running) is listed, never left out
    unfinished = unfinished_cells(sweep, uri)
    (out_dir / "unfinished.md").write_text(unfinished_markdown(sweep, unfinished))
    if unfinished:
        log(
            f"{len(unfinished)} cell run(s) of {sweep!r} did not finish and are left out of the tables: "
            + "; ".join(f"{u['label'] or u['run_id']} {u['state']}" for u in unfinished[:10])
            + (" ..." if len(unfinished) > 10 else "")
            + f" ({out_dir / 'unfinished.md'})"
        )
    if runs.empty:
        raise LookupError(
            f"sweep {sweep!r} in {uri} has no finished cell runs yet"
            + (f" ({len(unfinished)} did not finish: {out_dir / 'unfinished.md'})" if unfinished else "")
        )
    runs = stats.mark_disturbed(runs)  # cells measured while the machine was disturbed: flagged, timing left out
    if runs["disturbed"].any():
        log(
            f"{int(runs['disturbed'].sum())} of {len(runs)} cells were measured on a disturbed machine (their own "
            f"target step moved {stats.DISTURBED_DRIFT}x or more during the window): their timing is left out of the "
            "tables and the timing claims (column `disturbed` in runs.csv)"
        )
    samples = load_samples(runs, uri)
    tables = build_tables(runs, samples, reference, cost_ratio=cost_ratio, n_boot=n_boot)
    written: dict[str, Any] = {"out": out_dir, "tables": tables.write(out_dir)}
    if (runs["dataset"] == "spec_bench").any():  # Spec-Bench's per-category leaderboard and answer files
        bench = specbench.write(sweep, out_dir / "specbench", uri, reference=tables.reference)
        written["specbench"] = bench
        written["tables"].append(bench["markdown"])
        log(f"Spec-Bench: {len(bench['files'])} answer file(s) and {bench['markdown']}")
    runs_csv = out_dir / "runs.csv"
    runs.to_csv(runs_csv, index=False)
    written["runs_csv"] = runs_csv
    log(
        f"{len(runs)} finished cells of {sweep!r} ({runs['label'].nunique()} methods, {runs['seed'].nunique()} seeds) "
        f"from {uri}"
    )
    # first: where a token's time goes, by the loop's own clock (breakdown.md, figures/time_breakdown.png)
    split = breakdown.breakdown_table(runs)
    path = out_dir / "breakdown.md"
    path.write_text(
        "# Where a token's time goes\n\n![time breakdown](figures/time_breakdown.png)\n\n"
        + breakdown.breakdown_markdown(split)
    )
    written["tables"].insert(0, path)
    written["figures"] = {"time_breakdown": breakdown.breakdown_figure(runs, out_dir / "figures")}
    written["figures"].update(
        figures.save_all(stats.without_disturbed_timing(runs), out_dir / "figures")
    )  # speeds of undisturbed cells
    if batching.varies(runs):  # speedup vs batch size, with its crossover
        path = out_dir / "batching.md"
        path.write_text(batching.markdown(stats.without_disturbed_timing(runs)))
        written["tables"].append(path)
    clean = stats.without_disturbed_timing(runs)
    for name, wanted, draw in (  # by category (where the dataset has them) and against temperature (its axis)
        ("categories.md", categories.has_categories(samples), lambda: categories.categories_markdown(samples)),
        ("temperature.md", categories.varies(runs), lambda: categories.temperature_markdown(clean)),
    ):
        if wanted:
            (out_dir / name).write_text(draw())
            written["tables"].append(out_dir / name)
    if serving.varies(runs):  # under load: the curves against the offered rate, the crossover and the load claims
        clean, path = stats.without_disturbed_timing(runs), out_dir / "serving.md"
        pred = serving.predicted(  # the crossover predicted for a memory-bound accelerator, from in-loop acceptance
            runs,
            add_acceptance_columns(samples, runs),
            transfer.gpu_cost_ratios(runs, gpu_cost_ratio),
            {str(p): transfer.gpu_step_seconds(str(p)) for p in runs["pair"].unique()},
        )
        path.write_text(serving.markdown(clean, serving.load_serving_claims(claims_file), pred))
        written["tables"].append(path)
        fig = serving.serving_vs_rate(clean)
        written["figures"]["serving_vs_rate"] = figures.savefig(fig, out_dir / "figures", "serving_vs_rate")
        plt.close(fig)
    log(
        f"tables: {', '.join(str(p) for p in written['tables'])}; figures: {len(written['figures'])} in "
        f"{out_dir / 'figures'}"
    )
    claims = claims_report.write_claims(
        runs,
        samples,
        out_dir,
        claims_file=claims_file,
        cost_ratio=cost_ratio,
        n_boot=n_boot,
        sweep=sweep,
        gpu_cost_ratio=gpu_cost_ratio,
        command=command,
    )
    written["claims"] = claims
    written["tables"].extend(claims["paths"])
    written["figures"]["claims_forest"] = claims["figure"]
    log(f"claims: {', '.join(f'{n} {v}' for v, n in sorted(claims['counts'].items()))} -> {out_dir / 'claims.md'}")
    log("\n" + claims["methods"])  # the provenance and one paragraph per method (claims.md opens with them)
    if log_to_mlflow:
        written["parent_run"] = log_to_parent_run(
            sweep, uri, written, tables.summary, claims_report.claim_metrics(claims["table"]), runs
        )
        if written["parent_run"]:
            exp_id = MlflowClient(tracking_uri=uri).get_run(written["parent_run"]).info.experiment_id
            log(
                f"figures and tables logged to the parent run {written['parent_run']} (its Artifacts tab, report/); "
                f"`mlflow ui --backend-store-uri {uri}` then {view_url(exp_id)}"
            )
    written["notebooks"] = {}
    params = parameters_source(sweep, uri, tables.reference)
    if notebooks:
        written["notebooks"] = execute_notebooks(list(notebooks), out_dir, params, timeout=timeout)
    for name, result in written["notebooks"].items():
        status = "FAILED: " + result["error"].strip().splitlines()[-1] if result["error"] else "ok"
        log(f"notebook {name}: {status} ({result['seconds']:.0f} s) -> {result['html'] or result['notebook']}")
    return written


def _metric_name(*parts: Any) -> str:
    """An MLflow-legal metric name (letters, digits, ``_-./ ``) from label parts:
    ``speedup.humaneval.mtad_tau_0.3_``."""
    return ".".join(re.sub(r"[^0-9A-Za-z_\-/ ]", "_", str(p)) for p in parts)


# The runs table a sweep opens on (the experiment's shared view, ``layout.VIEW_STATE_TAG``): the cell runs
# (the parent run, with the report's figures, is one filter clear away), grouped by dataset and method label
# with MLflow's own average over the seeds, and the columns a reader compares.
VIEW_METRICS = (
    layout.METRIC_SPEEDUP,
    layout.METRIC_TOKENS_PER_S,
    layout.METRIC_ACCEPTED_PER_STEP,
    layout.METRIC_J_PER_TOKEN,
    layout.METRIC_SCORE,
    layout.METRIC_PERPLEXITY,
)
VIEW_COLUMNS = (
    *(f"metrics.`{m}`" for m in VIEW_METRICS),
    *(f"tags.`{t}`" for t in (layout.TAG_DATASET, layout.TAG_LABEL, layout.TAG_SEED, layout.TAG_STATUS)),
    *(f"params.`{p}`" for p in ("method.name", "method.gamma", "pair.name", "dataset.max_new_tokens")),
)
# MLflow's table sorts the selected metrics by name unless the view gives ``columnOrder`` (its column ids are
# ``<kind>.`<key>```, or a field name): the run name (wide enough for a group's "dataset: ..., label: ..." row),
# Created and Duration (the cell's own start and time: ``CellResult.started_at``), the compared metrics in the
# order above, then the rest.
RUN_NAME_COLUMN = "attributes.`Run Name`"
LEAD_COLUMNS = (RUN_NAME_COLUMN, "runDateAndNestInfo", "duration")  # run name, Created, Duration (the UI's own ids)
VIEW_STATE = {
    "searchFilter": f"tags.{layout.TAG_KIND} = '{layout.KIND_CELL}'",
    "orderByKey": f"tags.`{layout.TAG_LABEL}`",
    "orderByAsc": True,
    "runsHiddenMode": "SHOW_ALL",
    "groupBy": {
        "aggregateFunction": "average",
        "groupByKeys": [
            {"mode": "tag", "groupByData": layout.TAG_DATASET},
            {"mode": "tag", "groupByData": layout.TAG_LABEL},
        ],
    },
    "columnOrder": [*LEAD_COLUMNS, *VIEW_COLUMNS],
    # wide enough for "Group: dataset: mt_bench, label: mtad(tau=0.3)", narrow enough that the compared metrics fit
    "columnWidths": {RUN_NAME_COLUMN: 345, **{f"metrics.`{m}`": 100 for m in VIEW_METRICS}},
}


def view_url(experiment_id: str, base: str = "http://127.0.0.1:5000") -> str:
    """The runs table of an experiment in MLflow 3's model-training mode, on the sweep's shared view."""
    return (
        f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey={layout.VIEW_KEY}"
    )


def share_view(client, experiment_id: str, extra_columns: Sequence[str] = ()) -> None:
    """Store the runs-table view (``VIEW_STATE``: the cells grouped by dataset and method, averaged over seeds,
    with ``VIEW_COLUMNS``) as the experiment's shared view state (what the UI's *Share* button writes), so
    :func:`view_url` opens on it."""
    columns = [*VIEW_COLUMNS, *extra_columns]
    state = {**VIEW_STATE, "selectedColumns": columns, "columnOrder": [*LEAD_COLUMNS, *columns]}
    client.set_experiment_tag(experiment_id, layout.VIEW_STATE_TAG, json.dumps(state))


def log_cell_speedups(client, runs: pd.DataFrame) -> int:
    """Log each finished cell's speedup (tokens/s over the baseline cell of the same pair, dataset, seed and
    device: ``stats.add_ratios``) as its metric ``speedup``, so the runs table shows and averages it; how many."""
    ratios = stats.add_ratios(runs) if layout.METRIC_SPEEDUP not in runs else runs
    now, n = int(time.time() * 1000), 0
    for run_id, value in zip(ratios["run_id"], ratios[layout.METRIC_SPEEDUP]):
        if value is not None and math.isfinite(float(value)):
            client.log_batch(run_id, metrics=[Metric(layout.METRIC_SPEEDUP, float(value), now, 0)])
            n += 1
    return n


def log_to_parent_run(
    sweep: str,
    tracking_uri: str,
    written: dict[str, Any],
    summary=None,
    extra_metrics: dict[str, float] | None = None,
    runs: pd.DataFrame | None = None,
) -> str | None:
    """Log the report's figures, tables and runs.csv as artifacts of the sweep's latest parent run.

    Artifacts go under ``report/`` (figures under ``report/figures/``) so they open in the MLflow UI
    from the parent run's page; the summary's per-method speed-up and tokens emitted per target step are
    logged as the parent's metrics (``speedup.<dataset>.<label>``, ``accepted_per_step.<dataset>.<label>``)
    so that the runs table shows them, with ``extra_metrics`` (the claims' effects, CIs and verdicts).
    Returns the parent run id, or None when the sweep has none.
    """
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(sweep)
    if exp is None:
        return None
    parents = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.{schema.TAG_KIND} = '{schema.KIND_SWEEP}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not parents:
        return None
    if runs is not None and len(runs):
        log_cell_speedups(client, runs)
    run_id = parents[0].info.run_id
    for paths in written.get("figures", {}).values():
        for path in paths:
            client.log_artifact(run_id, str(path), "report/figures")
    for path in [*written.get("tables", []), written.get("runs_csv")]:
        if path:
            client.log_artifact(run_id, str(path), "report")
    metrics = []
    if summary is not None and len(summary):
        now = int(time.time() * 1000)
        for row in summary.itertuples(index=False):
            for col in ("speedup", "accepted_per_step"):
                value = getattr(row, f"{col}_mean", math.nan)
                if value is not None and math.isfinite(float(value)):
                    metrics.append(Metric(_metric_name(col, row.dataset, row.label), float(value), now, 0))
    now = int(time.time() * 1000)
    metrics.extend(Metric(_metric_name(*k.split(".")), v, now, 0) for k, v in (extra_metrics or {}).items())
    if metrics:
        for i in range(0, len(metrics), 1000):
            client.log_batch(run_id, metrics=metrics[i : i + 1000])
    client.set_tag(run_id, layout.TAG_REPORT, "report/ (figures, tables, runs.csv) from python -m analysis.report")
    share_view(client, exp.experiment_id)
    return run_id


def latest_sweep(tracking_uri: str) -> str | None:
    """The experiment (sweep) name of the parent run that started last in the store, or None."""
    client = MlflowClient(tracking_uri=tracking_uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    if not ids:
        return None
    runs = client.search_runs(
        ids,
        filter_string=f"tags.{schema.TAG_KIND} = '{schema.KIND_SWEEP}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return client.get_experiment(runs[0].info.experiment_id).name if runs else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", default="", help="sweep (MLflow experiment) name; empty: smoke")
    parser.add_argument(
        "--latest", action="store_true", help="the sweep whose parent run started last (what `make run` just ran)"
    )
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db at the repo root)",
    )
    parser.add_argument("--out", default=None, help="output folder (default: reports/<sweep>)")
    parser.add_argument(
        "--reference",
        default=schema.BASELINE,
        help="method label the significance column compares against (default: ar)",
    )
    parser.add_argument(
        "--cost-ratio",
        type=float,
        default=None,
        help="c = draft step time / target step time, for Leviathan's bound (not logged by the cells)",
    )
    parser.add_argument(
        "--gpu-cost-ratio",
        type=float,
        default=None,
        help="c of the memory-bound prediction (default: each pair's bytes ratio, draft / target weights per step)",
    )
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap replicates (default 2000)")
    parser.add_argument("--no-notebooks", action="store_true", help="tables and figures only")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per notebook cell")
    parser.add_argument(
        "--no-mlflow", action="store_true", help="do not log figures and tables to the sweep's parent run"
    )
    parser.add_argument(
        "--claims",
        default=None,
        help="claims file (default: analysis/claims.yaml); claims.md tests each claim on the sweep",
    )
    args = parser.parse_args(argv)
    sweep = (
        args.sweep or (latest_sweep(args.tracking_uri or default_tracking_uri()) if args.latest else None) or "smoke"
    )
    try:
        written = write_report(
            sweep,
            args.tracking_uri,
            args.out,
            reference=args.reference,
            cost_ratio=args.cost_ratio,
            notebooks=() if args.no_notebooks else NOTEBOOKS,
            n_boot=args.bootstrap,
            timeout=args.timeout,
            log_to_mlflow=not args.no_mlflow,
            claims_file=args.claims,
            gpu_cost_ratio=args.gpu_cost_ratio,
            command="python -m analysis.report " + " ".join(sys.argv[1:] if argv is None else argv),
        )
    except (LookupError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed = [n for n, r in written["notebooks"].items() if r["error"]]
    print(f"report: {written['out']}")
    if failed:
        print(
            f"notebook(s) failed: {', '.join(failed)} (the executed copies under notebooks/ show the error)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
