"""Analysis of a sweep: MLflow runs -> tidy DataFrames -> the papers' tables and figures -> a report.

    from analysis import load_runs, load_samples, build_tables, figures
    runs = load_runs("smoke"); samples = load_samples(runs)
    tables = build_tables(runs, samples, reference="ar"); print(tables.markdown())

``python -m analysis.report --sweep smoke`` (``make report SWEEP=smoke``) writes ``reports/<sweep>/``.
Every MLflow name used here lives in ``analysis.schema``.
"""

from analysis.runs import default_tracking_uri, list_sweeps, load_runs, load_samples
from analysis.stats import add_ratios, mean_std, paired_bootstrap, significance
from analysis.tables import Tables, build_tables

__all__ = [
    "Tables",
    "add_ratios",
    "build_tables",
    "default_tracking_uri",
    "list_sweeps",
    "load_runs",
    "load_samples",
    "mean_std",
    "paired_bootstrap",
    "significance",
]
