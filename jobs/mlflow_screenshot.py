"""Remake docs/img/mlflow_runs.png: the first screen of a sweep in MLflow's UI, as a user opens it.

The test fixture's sweep (``tests/_fixtures_analysis.build_store``, 24 cells, its report written by
``analysis.report.write_report``, which stores the sweep's shared view) is served by a real ``mlflow server``
and the address the report prints is opened in headless Chromium (Debian's ``chromium`` package):

    .venv/bin/python jobs/mlflow_screenshot.py [--out docs/img/mlflow_runs.png] [--chromium /usr/bin/chromium]

Nothing is reached outside 127.0.0.1 (Chromium runs with its background networking off).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

import _fixtures_analysis as fx  # noqa: E402 - the tests' fixture sweep, found through the path set above
from test_mlflow_ui import Server  # noqa: E402

from analysis.report import view_url, write_report  # noqa: E402

CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=2000,1000",
    "--virtual-time-budget=25000",
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "img" / "mlflow_runs.png"))
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = ap.parse_args(argv)
    if not Path(args.chromium).exists():
        print(f"no Chromium at {args.chromium}: sudo apt-get install -y chromium", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        uri = fx.build_store(root)
        write_report(fx.SWEEP, uri, root / "report", notebooks=(), n_boot=50, log=lambda *a: None)
        server = Server(uri, root)
        try:
            server.wait_ready()
            from mlflow.tracking import MlflowClient  # noqa: PLC0415 - only after the store exists

            exp = MlflowClient(uri).get_experiment_by_name(fx.SWEEP)
            url = view_url(exp.experiment_id, base=server.base)
            profile = root / "chromium-profile"
            cmd = [
                args.chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--screenshot={Path(args.out).resolve()}",
                url,
            ]
            subprocess.run(cmd, check=True, timeout=180, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            server.stop()
    print(f"wrote {args.out} ({url})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
