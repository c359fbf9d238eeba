"""The sweep: configuration -> plan -> cells on Ray -> MLflow (``python -m pipeline.sweep``).

    compose.py     compose the Hydra config; check the config files it names (conf_path: folders of one's own)
    checks.py      what is checked of pairs, devices and the measurement protocol before Ray starts
    plan.py        expand and validate the grid: the cells, their tasks and their keys
    ray_runner.py  start/join Ray, size the actors, run the cells
    driver.py      skip finished cells, run the rest, log every result, print the tables
    summary.py     the per-cell and mean ± std tables
    __main__.py    the command line

The names below are the package's API (tests, notebooks).
"""

import importlib
from typing import Any

from pipeline.sweep.plan import CONF_DIR, HARNESS_VERSION, Plan, SweepConfigError, compose, expand

# imported on first use (PEP 562): the driver and the runner import Ray and MLflow, which a light user of the
# package (the bench reads checks.py) does without, e.g. on a GPU machine that has neither
_LAZY = {
    "run": "driver",
    "summary_tables": "summary",
    "actor_options": "ray_runner",
    "run_cells": "ray_runner",
    "start_ray": "ray_runner",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"pipeline.sweep.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'pipeline.sweep' has no attribute {name!r}")


__all__ = [
    "CONF_DIR",
    "HARNESS_VERSION",
    "Plan",
    "SweepConfigError",
    "actor_options",
    "compose",
    "expand",
    "run",
    "run_cells",
    "start_ray",
    "summary_tables",
]
