"""The sweep driver: plan, skip finished cells, run the rest on Ray, log to MLflow, print the tables.

Steps 4-6 of ``python -m pipeline.sweep`` (docs/DESIGN.md sections 1 and 7):

4. MLflow is asked which cell keys have a finished run; those are skipped (failed cells run again).
5. Ray runs the rest (``pipeline.sweep.ray_runner``).
6. Each result is logged by the driver as it arrives; the end prints a per-cell table, the
   mean ± std table over seeds (speedup against the same sweep's baseline) and how to open the UI.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import ray
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from pipeline.sweep.plan import CONF_DIR, expand
from pipeline.sweep.ray_runner import actor_options, prepare_pairs, run_cells, start_ray
from pipeline.sweep.summary import summary_tables
from pipeline.tracking import Tracker, resolve_tracking_uri


def run(cfg: DictConfig, root: Path | None = None) -> dict[str, Any]:
    """Plan, skip finished cells, run the rest on Ray, log to MLflow, print the tables."""
    root = Path(root or CONF_DIR.parent)
    t0 = time.perf_counter()
    plan = expand(cfg, root)  # every configuration error is raised here, before Ray
    cluster = OmegaConf.to_container(cfg.cluster, resolve=True)
    tracking = OmegaConf.to_container(cfg.tracking, resolve=True)
    uri = resolve_tracking_uri(tracking.get("uri") or "sqlite:///mlflow.db", root)
    art = tracking.get("artifact_root")
    if art and "://" not in art and not Path(art).is_absolute():
        art = str(root / art)
    experiment = tracking.get("experiment") or plan.name
    tracker = Tracker(uri, experiment, art)
    finished = tracker.finished_keys()
    failed_before = tracker.failed_runs()
    todo = [c for c in plan.cells if c["key"] not in finished]
    n_retry = sum(1 for c in todo if c["key"] in failed_before)
    print(
        f"sweep {plan.name!r}: {len(plan.cells)} cells ({', '.join(f'{k}: {v} samples' for k, v in plan.sample_counts.items())})",
        flush=True,
    )
    print(f"cells: {len(plan.cells)} total, {len(plan.cells) - len(todo)} finished, {len(todo)} to run"
          + (f" ({n_retry} failed before)" if n_retry else ""), flush=True)
    outcome = {"total": len(plan.cells), "skipped": len(plan.cells) - len(todo), "ran": 0, "finished": 0, "failed": 0, "results": []}
    if todo:
        started_ray = start_ray(cluster)
        tracker.start_parent(
            run_name=f"{plan.name} {time.strftime('%Y-%m-%d %H:%M:%S')}",
            tags={"sweep": plan.name, "cluster": cluster.get("kind"), "ray_address": cluster.get("address") or "local",
                  "command": " ".join(sys.argv)},
            params={"sweep.name": plan.name, "cells.total": len(plan.cells), "cells.to_run": len(todo),
                    "cluster.kind": cluster.get("kind"), "ray.nodes": len([n for n in ray.nodes() if n.get("Alive")])},
        )
        status = "FAILED"
        try:
            opts, capacity = actor_options(cluster)
            print(f"ray: {len([n for n in ray.nodes() if n.get('Alive')])} node(s), {capacity} cell(s) in flight "
                  f"({'GPU' if opts.get('num_gpus') else 'CPU'} actors)", flush=True)
            prepare_pairs(plan, opts)

            def on_result(cell, result):
                tracker.log_cell(cell, result)
                outcome["ran"] += 1
                outcome["finished" if result["status"] == "finished" else "failed"] += 1
                outcome["results"].append({"cell_key": cell["key"], "status": result["status"], "node_id": result.get("node_id"), "error": result.get("error")})
                if result["status"] != "finished":
                    tqdm.write(f"FAILED {cell['label']} {cell['pair']['name']} {cell['dataset']['name']} seed={cell['seed']} [{cell['key']}]: {result.get('error')}", file=sys.stderr)

            run_cells(todo, cluster, on_result, progress=bool(cfg.get("progress", True)))
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            tracker.end_parent(status, {"cells_total": len(plan.cells), "cells_ran": outcome["ran"], "cells_finished": outcome["finished"],
                                        "cells_failed": outcome["failed"], "wall_s": time.perf_counter() - t0})
            if started_ray:
                ray.shutdown()
    rows = tracker.rows(c["key"] for c in plan.cells)
    base_label = next((c["label"] for c in plan.cells if c.get("baseline")), None)
    cell_text, mean_text = summary_tables(rows, base_label)
    print("\nper cell:\n" + cell_text)
    print(f"\nmean ± std over seeds (speedup: tokens/s over the {base_label or 'no'} baseline of the same pair, dataset and seed):\n" + mean_text)
    n_failed = sum(1 for r in rows if r.get("cell_status") != "finished")
    if n_failed:
        print(f"\n{n_failed} cell(s) failed; run the same command again to retry only those (errors: MLflow tag `error`, artifact traceback.txt).")
    print(f"\nwall time: {time.perf_counter() - t0:.1f} s")
    print(f"MLflow: experiment {experiment!r} in {uri}\n  open the UI: mlflow ui --backend-store-uri {uri} --port 5000"
          f"  (then http://127.0.0.1:5000, experiment {experiment!r}; select runs -> Compare)")
    outcome["rows"] = rows
    outcome["experiment"] = experiment
    outcome["tracking_uri"] = uri
    outcome["plan"] = plan
    return outcome
