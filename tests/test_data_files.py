"""The project's own data/ folder: every file as its README lists it (sha256), the default config
points inside the project, and the Hub loading path (``dataset.path=null``) works, here on
local folders laid out as the Hub repositories are (what ``datasets.load_dataset`` reads the same way)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from helpers.paths import DATA, REPO
from pipeline.data import cnn_dm, load_dataset, mt_bench, spider
from pipeline.sweep import compose


def _listed_checksums() -> dict[str, str]:
    text = (DATA / "README.md").read_text()
    return {name[2:]: digest for digest, name in re.findall(r"^([0-9a-f]{64})  (\./\S+)$", text, flags=re.M)}


def test_every_data_file_matches_the_readme_checksum():
    listed = _listed_checksums()
    present = {str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file() and p.name != "README.md"}
    assert listed and set(listed) == present, "data/ and the checksum list in data/README.md differ"
    for name, digest in listed.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, f"data/{name} changed"
    assert sum((DATA / n).stat().st_size for n in listed) < 8 * 2**20  # keep the repository small


def test_default_data_root_is_inside_the_project(monkeypatch):
    monkeypatch.delenv("PIPELINE_DATA_ROOT", raising=False)
    cfg = compose()
    assert cfg.data_root == "data" and (REPO / cfg.data_root / "mt_bench" / "question.jsonl").exists()
    monkeypatch.setenv("PIPELINE_DATA_ROOT", "/elsewhere")
    assert compose().data_root == "/elsewhere"  # the override stays


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_mt_bench_hub_path_on_a_hub_layout_folder(tmp_path, monkeypatch):
    """HuggingFaceH4/mt_bench_prompts columns (prompt, prompt_id, category, reference), split train."""
    local = load_dataset("mt_bench", DATA / "mt_bench")
    rows = [
        {"prompt": s.turns, "prompt_id": int(s.id), "category": s.category, "reference": s.reference or []}
        for s in local
    ]
    _write_jsonl(tmp_path / "mt_bench_prompts" / "train.jsonl", rows)
    monkeypatch.setattr(mt_bench, "HUB_ID", str(tmp_path / "mt_bench_prompts"))
    hub = load_dataset("mt_bench", None)
    assert [(s.id, s.turns, s.category, s.reference) for s in hub] == [
        (s.id, s.turns, s.category, s.reference) for s in local
    ]


def test_spider_hub_path_with_database_dir(tmp_path, monkeypatch):
    """xlangai/spider: questions only (split validation = dev); the databases come from database_dir."""
    dev = json.loads((DATA / "spider" / "dev.json").read_text())[:5]
    _write_jsonl(
        tmp_path / "spider" / "validation.jsonl", [{k: r[k] for k in ("db_id", "query", "question")} for r in dev]
    )
    monkeypatch.setattr(spider, "HUB_ID", str(tmp_path / "spider"))
    with pytest.raises(ValueError, match="database"):
        load_dataset("spider", None)
    hub = load_dataset("spider", None, database_dir=DATA / "spider" / "database")
    local = load_dataset("spider", DATA / "spider", limit=5)
    assert [(s.id, s.turns, s.reference, s.meta) for s in hub] == [(s.id, s.turns, s.reference, s.meta) for s in local]


def test_cnn_dm_hub_path_with_its_config(tmp_path, monkeypatch):
    """abisee/cnn_dailymail config 3.0.0 (article, highlights, id): references for ROUGE."""
    folder = tmp_path / "cnn_dailymail"
    _write_jsonl(
        folder / "3.0.0" / "test.jsonl",
        [
            {"article": "The cat sat on the mat all day.", "highlights": "Cat sat.", "id": "a1"},
            {"article": "Rain fell in the city.", "highlights": "Rain.", "id": "b2"},
        ],
    )
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: 3.0.0\n  data_files:\n  - split: test\n    path: 3.0.0/test.jsonl\n---\n"
    )
    monkeypatch.setattr(cnn_dm, "HUB_ID", str(folder))
    samples = load_dataset("cnn_dm", None)
    assert [(s.id, s.reference) for s in samples] == [("a1", "Cat sat."), ("b2", "Rain.")]
    assert samples[0].turns == ["Summarize: The cat sat on the mat all day."]


def test_unreachable_hub_names_the_local_way_out(monkeypatch, tmp_path):
    monkeypatch.setattr(mt_bench, "HUB_ID", str(tmp_path / "no_such_dataset"))
    with pytest.raises(RuntimeError, match="dataset.path"):
        load_dataset("mt_bench", None)
