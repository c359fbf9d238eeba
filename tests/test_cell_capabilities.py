"""Every method of conf/sweep/all_methods.yaml (and typical with a tree, with Medusa heads made here) through
``run_cell`` on a tiny pair: the logged costs, bound and speculation_profile follow the configured method (its
draft shape and depth, its batch size), not the class's defaults."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml
from transformers import AutoModelForCausalLM

from analysis.stats import NO_GAMMA_REASON, bound_frame
from helpers.heads import medusa_heads_folder
from helpers.paths import REPO
from helpers.project import make_project, overrides
from pipeline import sweep
from pipeline.cell import run_cell
from pipeline.cell_types import STATUS_FINISHED
from pipeline.measure.bounds import leviathan_bound

HEADS = 2  # fewer heads than k_config's 3 levels: a Medusa tree is as deep as the heads, which the cell records


def _expected(cell) -> tuple[str, int | None]:
    """(draft shape, draft depth) as the configuration states them, written out by hand per method."""
    p, m = cell.params, cell.method
    if m in ("ar", "beam", "mtjd"):
        return "none", None
    if m == "bild":
        return "chain", p["max_small_steps"]
    if m == "spectr":
        return "tree", p["gamma"]
    if m in ("specinfer", "mcss", "traversal"):
        return "tree", len(p["k_config"])
    if m == "medusa" or (m == "typical" and p["drafter"]["kind"] == "medusa"):
        return "tree", min(len(p["k_config"]), HEADS)
    if m == "typical" and p["tree"]:
        return "tree", len(p["k_config"])
    return "chain", p["gamma"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = make_project(tmp_path_factory.mktemp("capabilities"))
    target = AutoModelForCausalLM.from_pretrained(root / "models" / "target")
    medusa_heads_folder(target, root / "models" / "medusa", num_heads=HEADS)
    pair = (root / "conf" / "pair" / "tiny.yaml").read_text()
    (root / "conf" / "pair" / "tiny.yaml").write_text(pair + f"medusa: {root / 'models' / 'medusa'}\n")
    methods = yaml.safe_load((REPO / "conf" / "sweep" / "all_methods.yaml").read_text())["sweep"]["methods"]
    methods = [*methods, {"method": "typical", "tree": True, "label": "typical(tree)"}]
    (root / "conf" / "sweep" / "caps.yaml").write_text(
        "# @package _global_\n"
        + yaml.safe_dump(
            {
                "sweep": {
                    "name": "caps",
                    "methods": methods,
                    "method_overrides": {},
                    "baseline": "ar",
                    "pairs": ["tiny"],
                    "datasets": [{"dataset": "humaneval", "limit": 1, "max_new_tokens": 6}],
                    "seeds": [0],
                    "batch_sizes": [1],
                },
                "measure": {
                    "warmup_generations": 0,
                    "warmup_seconds": 0.0,
                    "warmup_samples": 1,
                    "idle_seconds": 0.0,
                    "energy_meter": "none",
                    "perplexity": False,
                    "score": False,
                },
            }
        )
    )
    over = [o for o in overrides(root) if not o.startswith("sweep=")]
    plan = sweep.expand(sweep.compose(["sweep=caps", *over], root / "conf"), root)
    batched = sweep.expand(
        sweep.compose(
            [
                "sweep=caps",
                *over,
                "sweep.methods=[spd]",
                "sweep.batch_sizes=[2]",
                # a batch of 2 needs a slice of at least 2 requests (the plan refuses a larger batch)
                "sweep.datasets=[{dataset: humaneval, limit: 2, max_new_tokens: 6}]",
            ],
            root / "conf",
        ),
        root,
    )
    cells = [*plan.cells, *batched.cells]
    assert {c.label for c in plan.cells} >= {"typical(medusa)", "typical(tree)", "medusa", "bild", "spectr"}
    return [(c, run_cell(c)) for c in cells]


def test_every_method_logs_costs_of_what_it_is_configured_to_draft(results):
    for cell, result in results:
        assert result.status == STATUS_FINISHED, (cell.label, result.traceback)
        shape, depth = _expected(cell)
        m = result.metrics
        if shape == "none":
            assert not {"t_draft_step_ms", "cost_ratio_c", "draft_depth"} & set(m), cell.label
            assert result.speculation_profile is None, cell.label
            continue
        assert m["draft_depth"] == depth and m["tree_draft"] == float(shape == "tree"), cell.label
        assert m["t_draft_step_ms"] > 0 and m["t_verify_ms"] > 0 and m["t_target_step_ms"] > 0, cell.label
        assert m["cost_ratio_c"] == pytest.approx(m["t_draft_step_ms"] / m["t_target_step_ms"], rel=1e-9)
        profile = result.speculation_profile
        assert profile is not None, cell.label
        assert profile["num_speculative_tokens"] == depth, cell.label
        assert profile["measurement_conditions"]["batch_size"] == cell.batch_size, cell.label
    assert any(c.batch_size == 2 for c, _ in results)


def test_the_bound_follows_the_configured_draft(results):
    rows = []
    for cell, result in results:
        m = result.metrics
        rows.append(
            {
                "pair": cell.pair_name,
                "dataset": cell.dataset_name,
                "label": cell.label,
                "method": cell.method,
                "gamma": cell.params.get("gamma", math.nan),
                "speedup": 1.0,
                "accepted_per_step": m["accepted_per_step"],
                "cost_ratio": m.get("cost_ratio_c", math.nan),
                "draft_depth": m.get("draft_depth", math.nan),
                "tree_draft": m.get("tree_draft", math.nan),
            }
        )
    bounds = bound_frame(pd.DataFrame(rows)).set_index("label")
    for cell, result in results:
        shape, depth = _expected(cell)
        row, m = bounds.loc[cell.label], result.metrics
        if shape == "none":
            assert math.isnan(row["bound_mean"]) and row["bound_note"] == NO_GAMMA_REASON, cell.label
            continue
        assert row["gamma"] == depth and row["shape"] == shape, cell.label
        c, tokens = m["cost_ratio_c"], m["accepted_per_step"]
        # a chain: Leviathan's bound at the alpha its tokens/step imply; a tree: its tokens/step over (depth c + 1)
        want = leviathan_bound(row["alpha_mean"], depth, c) if shape == "chain" else tokens / (depth * c + 1.0)
        assert row["bound_mean"] == pytest.approx(want, rel=1e-9), cell.label
