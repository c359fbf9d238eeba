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

from pipeline.sweep.driver import run
from pipeline.sweep.plan import CONF_DIR, HARNESS_VERSION, Plan, SweepConfigError, compose, expand
from pipeline.sweep.ray_runner import actor_options, run_cells, start_ray
from pipeline.sweep.summary import summary_tables

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
