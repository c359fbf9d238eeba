"""The three notebooks of analysis/ execute headless (nbclient) against a small sweep's MLflow store."""

from __future__ import annotations

import importlib.util

import nbformat
import pytest
from _fixtures_analysis import SWEEP, store

from analysis import report


@pytest.mark.timeout(600)
def test_every_notebook_executes_against_the_store(tmp_path_factory, tmp_path):
    uri = store(tmp_path_factory)
    written = report.write_report(SWEEP, uri, tmp_path, reference="spd", n_boot=200, log=lambda *_: None)
    assert set(written["notebooks"]) == set(report.NOTEBOOKS)
    for name, result in written["notebooks"].items():
        assert result["error"] is None, f"{name}: {result['error']}"
        nb = nbformat.read(result["notebook"], as_version=4)
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        assert not [o for o in outputs if o.output_type == "error"]
        assert any("image/png" in o.get("data", {}) for o in outputs), f"{name} shows no figure"
        assert f"SWEEP = {SWEEP!r}" in nb.cells[1].source  # the parameters cell was rewritten
        if importlib.util.find_spec("nbconvert"):
            html = result["html"].read_text()
            assert "<html" in html and "data:image/png;base64" in html
    table_nb = nbformat.read(written["notebooks"]["mtad_table5"]["notebook"], as_version=4)
    markdown = "".join(
        o["data"].get("text/markdown", "")
        for c in table_nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "data" in o
    )
    assert "| | ar | spd | mtad | mtad(tau=0.3) |" in markdown and "**" in markdown and "<u>" in markdown
    assert (tmp_path / "table5.md").exists() and (tmp_path / "table5.tex").exists()
    # the sweep figures and the claims forest plot (analysis/claims_report.py)
    assert len(list((tmp_path / "figures").glob("*.png"))) == len(list((tmp_path / "figures").glob("*.pdf"))) == 6
    assert (tmp_path / "figures" / "claims_forest.pdf").exists()
