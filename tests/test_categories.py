"""Per category and per temperature (analysis/categories.py) on synthetic frames of known figures, and the sweep's
temperature axis (sweep.temperatures) in the planner."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis import categories, stats
from helpers.paths import REPO
from pipeline import sweep
from pipeline.cell_types import split_temperature_label, temperature_label

# tokens/s per (method, category): ar 10 and 20; spd 15 on code (1.5x), 20 on writing (1.0x)
RATE = {("ar", "coding"): 10.0, ("ar", "writing"): 20.0, ("spd", "coding"): 15.0, ("spd", "writing"): 20.0}


def samples() -> pd.DataFrame:
    rows = []
    for seed in (0, 1):
        for (method, category), rate in RATE.items():
            for i in range(3):
                tokens = 30 + i
                rows.append(
                    {
                        "pair": "p",
                        "dataset": "mt_bench",
                        "label": method,
                        "seed": seed,
                        "id": f"{category}{i}",
                        "category": category,
                        "new_tokens": tokens,
                        "steps": tokens if method == "ar" else tokens // 2,
                        "decode_s": tokens / rate,
                    }
                )
    return pd.DataFrame(rows)


def test_the_per_category_split():
    t = categories.by_category(samples()).set_index(["method", "category"])
    assert categories.has_categories(samples()) and len(t) == 4
    assert t.loc[("spd", "coding"), "tokens_per_s"] == pytest.approx(15.0)
    assert t.loc[("spd", "coding"), "speedup"] == pytest.approx(1.5)
    assert t.loc[("spd", "writing"), "speedup"] == pytest.approx(1.0)
    assert t.loc[("spd", "coding"), "tokens_per_step"] == pytest.approx(93 / 46)  # steps 15 + 15 + 16
    assert t.loc[("ar", "writing"), "generations"] == 6
    assert "| p | mt_bench | spd | coding | 6 | 15.00 |" in categories.categories_markdown(samples())
    assert not categories.has_categories(samples().assign(category="one"))


def test_temperature_labels_round_trip():
    assert temperature_label("spd", 0.7) == "spd (T=0.7)" and temperature_label("spd", None) == "spd"
    assert split_temperature_label("spd (T=0.7) (batch 4) @ 2/s") == ("spd", 0.7)
    assert split_temperature_label("mtad(tau=0.3)") == ("mtad(tau=0.3)", None)


def runs() -> pd.DataFrame:
    rows = []
    for seed in (0, 1, 2):
        for t, spd_rate, spd_steps in ((0.0, 30.0, 2.5), (1.0, 22.0, 1.8)):
            for method, rate, steps in (("ar", 20.0, 1.0), ("spd", spd_rate + seed * 0.1, spd_steps)):
                rows.append(
                    {
                        "pair": "p",
                        "dataset": "d",
                        "label": temperature_label(method, t),
                        "method": method,
                        "seed": seed,
                        "device": "cpu",
                        "batch_size": 1,
                        "tokens_per_s": rate,
                        "accepted_per_step": steps,
                        "j_per_token": float("nan"),
                        "dynamic_j_per_token": float("nan"),
                        "draft_steps": 0 if method == "ar" else 10,
                    }
                )
    return pd.DataFrame(rows)


def test_acceptance_and_speedup_against_temperature():
    assert categories.varies(runs()) and not categories.varies(runs().assign(label="spd"))
    t = categories.by_temperature(runs()).set_index(["method", "temperature"])
    assert t.loc[("spd", 0.0), "speedup"] == pytest.approx(30.1 / 20) and t.loc[("spd", 0.0), "seeds"] == 3
    assert t.loc[("spd", 1.0), "speedup"] == pytest.approx(22.1 / 20)  # over ar at T=1, not at T=0
    assert t.loc[("spd", 1.0), "tokens_per_step"] == 1.8
    assert t.loc[("spd", 0.0), "low"] < t.loc[("spd", 0.0), "speedup"] < t.loc[("spd", 0.0), "high"]
    ratios = stats.add_ratios(runs())
    assert sorted(ratios[ratios["method"] == "ar"]["speedup"].unique()) == [1.0]
    assert "| p | d | spd | 1 | 3 | 1.80 |" in categories.temperature_markdown(runs())


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("temperatures")
    (root / "data").symlink_to(REPO / "data", target_is_directory=True)
    return root


def test_the_temperature_axis_plans_every_entry_and_its_baseline_at_each_temperature(project):
    base = ["sweep=smoke", "data_root=data", "seeds=[0]", "sweep.datasets=[{dataset: humaneval, limit: 2}]"]
    cells = sweep.expand(sweep.compose([*base, "sweep.temperatures=[0,0.7,1.0]"]), project).cells
    assert {c.label for c in cells} == {
        f"{m} (T={t})" for m in ("ar", "spd", "block", "mtad") for t in ("0", "0.7", "1")
    }
    assert all(c.params["temperature"] == split_temperature_label(c.label)[1] for c in cells)
    assert sum(c.baseline for c in cells) == 3 and len({c.key for c in cells}) == 12
    plain = {c.key for c in sweep.expand(sweep.compose(base), project).cells}
    assert {c.key for c in cells if c.params["temperature"] == 1.0} == plain  # T=1 is the sweep's own temperature
    with pytest.raises(sweep.SweepConfigError, match=r"sweep.temperatures=\[-1\]: a non-empty list of numbers >= 0"):
        sweep.expand(sweep.compose([*base, "sweep.temperatures=[-1]"]), project)
