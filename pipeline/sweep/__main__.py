"""Run a sweep: methods x pairs x datasets x seeds, one Ray actor per cell, every cell in MLflow.

    python -m pipeline.sweep                                   # the smoke sweep (make run)
    python -m pipeline.sweep sweep=mtad_table5 cluster=ray cluster.accelerator_type=A100
    python -m pipeline.sweep method=mtad method.tau=0.3 seeds=[0]

Exit status: 0 when every cell finished, 1 when some failed or the store failed mid-run (one message:
what happened, and that the same command resumes), 2 on a configuration error.
"""

from __future__ import annotations

import signal
import sys
import threading

import hydra
from omegaconf import DictConfig

from pipeline.sweep.driver import run
from pipeline.sweep.plan import SweepConfigError, check_command_line
from pipeline.tracking import StoreWriteError, TrackingError


def _sigterm_as_interrupt() -> None:
    """SIGTERM (kill, a batch scheduler) ends the driver like Ctrl-C: the parent run is closed as KILLED."""

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    _sigterm_as_interrupt()
    try:
        outcome = run(cfg)
    except StoreWriteError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except (SweepConfigError, TrackingError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if outcome["failed"]:
        sys.exit(1)


def cli() -> None:
    """``python -m pipeline.sweep``: group selections checked before Hydra composes them (exit 2 with the fix)."""
    try:
        check_command_line(sys.argv[1:])
    except SweepConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    cli()
