"""The dequantized-GGUF cache: written atomically, safe when several processes convert at once."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers.models import tiny_llama
from helpers.tokenizers import word_tokenizer
from pipeline import models
from pipeline.models import _save_dequantized


def test_save_dequantized_round_trips_and_leaves_no_temporary_folders(tmp_path):
    model = tiny_llama(7)
    target = tmp_path / "cache" / "model"
    _save_dequantized(model, target)
    _save_dequantized(model, target)  # a second writer finishing after the first: no error
    (tmp_path / "cache" / "partial").mkdir()
    _save_dequantized(model, tmp_path / "cache" / "partial")  # a partial folder is replaced
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["model", "partial"]
    for folder in ("model", "partial"):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "cache" / folder).eval()
        ids = torch.tensor([[1, 2, 3]])
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids).logits, model(ids).logits)


def test_the_gguf_copy_is_named_by_the_files_contents_not_its_path(tmp_path, monkeypatch):
    """Every checkout and virtual environment (the offline target's GGUF file lives inside the installed package)
    shares one conversion: two copies of the same bytes at different paths name one folder, other bytes another."""
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    for venv in ("a", "b", "c"):
        (tmp_path / venv).mkdir()
        (tmp_path / venv / "m.gguf").write_bytes(b"GGUF" + (b"x" if venv == "c" else b"w") * 1000)
    first, second, other = (models._gguf_cache_dir(str(tmp_path / v), "m.gguf") for v in ("a", "b", "c"))
    assert first == second != other
    assert first.parent == tmp_path / "cache" / "gguf" and first.name.startswith("m-")


def test_concurrent_loads_convert_a_gguf_file_once(tmp_path, monkeypatch):
    """Several processes loading the same GGUF pair at once (the workers of `make test`, Ray actors on a fresh
    machine): one converts (tens of seconds for SmolLM2-135M), the others wait for it and read its copy."""
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.gguf").write_bytes(b"GGUF" * 100)
    spec = models.ModelSpec.from_config({"id": str(tmp_path / "pkg"), "gguf_file": "m.gguf"})
    real = AutoTokenizer.from_pretrained
    conversions = []

    def from_pretrained(location, **kwargs):
        if kwargs.get("gguf_file"):  # the conversion: slow enough for the other thread to arrive meanwhile
            conversions.append(location)
            time.sleep(0.5)
            return word_tokenizer()
        return real(location, **kwargs)

    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", from_pretrained)
    with ThreadPoolExecutor(3) as pool:  # flock excludes separate open files, in one process as across processes
        toks = list(pool.map(lambda _: models.load_tokenizer(spec), range(3)))
    assert conversions == [str(tmp_path / "pkg")]
    assert all(tok.encode("write a python function") == toks[0].encode("write a python function") for tok in toks)
    cached = models._gguf_cache_dir(str(tmp_path / "pkg"), "m.gguf")
    assert (cached / "tokenizer_config.json").exists()
    assert not [p for p in cached.parent.iterdir() if ".tmp-" in p.name]  # no temporary folder left
