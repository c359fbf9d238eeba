"""The report of one sweep: tables, figures and the executed notebooks, written to ``reports/<sweep>/``.

    python -m analysis.report --sweep smoke                      # make report SWEEP=smoke
    python -m analysis.report --sweep mtad_table5 --tracking-uri sqlite:////data/mlflow.db --reference spd

Writes ``table5.md`` and ``table5.tex`` (Table 5 layout + the speed-up/acceptance/significance table),
``runs.csv`` (the tidy frame, one row per finished cell), ``figures/<name>.png|pdf``, and for each
notebook of ``analysis/`` the executed copy ``notebooks/<name>.ipynb`` and ``<name>.html`` (nbclient
runs them headless; their ``parameters`` cell is rewritten with the sweep, tracking URI and reference).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from analysis import figures, schema
from analysis.runs import REPO_ROOT, default_tracking_uri, load_runs, load_samples
from analysis.tables import build_tables

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
    import nbformat

    nb = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and PARAMETERS_TAG in cell.get("metadata", {}).get("tags", []):
            cell.source = parameters
            break
    else:
        nb.cells.insert(0, nbformat.v4.new_code_cell(parameters, metadata={"tags": [PARAMETERS_TAG]}))
    return nb


async def _execute(name: str, out_dir: Path, parameters: str, timeout: int, html: bool) -> dict[str, Any]:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = _prepare(name, parameters)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(REPO_ROOT)}})
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
            from nbconvert import HTMLExporter
        except ImportError:  # nbconvert is optional: the executed .ipynb is still written
            pass
        else:
            body, _ = HTMLExporter().from_notebook_node(nb)
            html_path = out_dir / f"{name}.html"
            html_path.write_text(body)
    return {"notebook": nb_path, "html": html_path, "error": error, "seconds": time.perf_counter() - t0}


def execute_notebooks(names: Sequence[str], out_dir: str | Path, parameters: str, timeout: int = 600, html: bool = True) -> dict[str, dict[str, Any]]:
    """Execute ``analysis/<name>.ipynb`` for each name, concurrently (one kernel each), with ``parameters``.

    Each executed notebook goes to ``<out_dir>/notebooks/<name>.ipynb`` and, with nbconvert, to
    ``<out_dir>/<name>.html``. A failing cell does not raise: the partly executed notebook is saved
    and ``error`` holds the failure. Returns name -> ``{notebook, html, error, seconds}``.
    """
    import asyncio

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
    log=print,
) -> dict[str, Any]:
    """Write the report of ``sweep`` under ``out`` (default ``reports/<sweep>``); returns what was written."""
    uri = tracking_uri or default_tracking_uri()
    out_dir = Path(out) if out else REPO_ROOT / "reports" / sweep
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = load_runs(sweep, uri)
    if runs.empty:
        raise LookupError(f"sweep {sweep!r} in {uri} has no finished cell runs yet")
    samples = load_samples(runs, uri)
    tables = build_tables(runs, samples, reference, cost_ratio=cost_ratio, n_boot=n_boot)
    written: dict[str, Any] = {"out": out_dir, "tables": tables.write(out_dir)}
    runs_csv = out_dir / "runs.csv"
    runs.to_csv(runs_csv, index=False)
    written["runs_csv"] = runs_csv
    log(f"{len(runs)} finished cells of {sweep!r} ({runs['label'].nunique()} methods, {runs['seed'].nunique()} seeds) from {uri}")
    written["figures"] = figures.save_all(runs, out_dir / "figures")
    log(f"tables: {', '.join(str(p) for p in written['tables'])}; figures: {len(written['figures'])} in {out_dir / 'figures'}")
    written["notebooks"] = {}
    params = parameters_source(sweep, uri, tables.reference)
    if notebooks:
        written["notebooks"] = execute_notebooks(list(notebooks), out_dir, params, timeout=timeout)
    for name, result in written["notebooks"].items():
        status = "FAILED: " + result["error"].strip().splitlines()[-1] if result["error"] else "ok"
        log(f"notebook {name}: {status} ({result['seconds']:.0f} s) -> {result['html'] or result['notebook']}")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", default="", help="sweep (MLflow experiment) name; empty: smoke")
    parser.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db at the repo root)")
    parser.add_argument("--out", default=None, help="output folder (default: reports/<sweep>)")
    parser.add_argument("--reference", default=schema.BASELINE, help="method label the significance column compares against (default: ar)")
    parser.add_argument("--cost-ratio", type=float, default=None, help="c = draft step time / target step time, for Leviathan's bound (not logged by the cells)")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap replicates (default 2000)")
    parser.add_argument("--no-notebooks", action="store_true", help="tables and figures only")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per notebook cell")
    args = parser.parse_args(argv)
    sweep = args.sweep or "smoke"
    try:
        written = write_report(sweep, args.tracking_uri, args.out, reference=args.reference, cost_ratio=args.cost_ratio,
                               notebooks=() if args.no_notebooks else NOTEBOOKS, n_boot=args.bootstrap, timeout=args.timeout)
    except LookupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed = [n for n, r in written["notebooks"].items() if r["error"]]
    print(f"report: {written['out']}")
    if failed:
        print(f"notebook(s) failed: {', '.join(failed)} (the executed copies under notebooks/ show the error)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
