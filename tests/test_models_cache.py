"""The dequantized-GGUF cache: written atomically, safe when several processes convert at once."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers.models import tiny_llama
from helpers.tokenizers import word_tokenizer
from pipeline import models
from pipeline.decoding.cpu_kernels import build_lock
from pipeline.gguf_cache import ModelCacheError
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


# ---------------------------------------------------------------------------------------------------
# The cache's own errors are named as such, with the fix (issue 57)
# ---------------------------------------------------------------------------------------------------


def _gguf_spec(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "m.gguf").write_bytes(b"GGUF" * 100)
    real_tok, real_model = AutoTokenizer.from_pretrained, AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(  # the conversions: a word tokenizer and a tiny model stand for the GGUF file's
        models.AutoTokenizer,
        "from_pretrained",
        lambda location, **kw: word_tokenizer() if kw.get("gguf_file") else real_tok(location, **kw),
    )
    monkeypatch.setattr(
        models.AutoModelForCausalLM,
        "from_pretrained",
        lambda location, **kw: tiny_llama(7) if kw.get("gguf_file") else real_model(location, **kw),
    )
    spec = models.ModelSpec.from_config({"id": str(tmp_path / "pkg"), "gguf_file": "m.gguf"})
    return spec, models._gguf_cache_dir(str(tmp_path / "pkg"), "m.gguf")


def test_an_unwritable_cache_folder_is_named_not_taken_for_an_offline_model(tmp_path, monkeypatch):
    spec, _ = _gguf_spec(tmp_path, monkeypatch)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "file" / "cache"))  # under a file: cannot be created
    with pytest.raises(ModelCacheError, match="cannot be written .*set PIPELINE_CACHE to a writable folder"):
        models.load_tokenizer(spec)


def test_a_lock_held_too_long_is_named(tmp_path, monkeypatch):
    spec, cached = _gguf_spec(tmp_path, monkeypatch)
    monkeypatch.setenv("PIPELINE_KERNELS_BUILD_WAIT_S", "0.3")
    cached.parent.mkdir(parents=True)
    with build_lock(cached.parent / f".{cached.name}.lock", wait_s=1):  # another converter, still at it
        with pytest.raises(ModelCacheError, match=r"is not ready: waited .* for the GGUF conversion lock"):
            models.load_tokenizer(spec)


def test_a_damaged_copy_is_named_with_its_removal_not_a_raw_safetensors_error(tmp_path, monkeypatch):
    """A truncated model.safetensors gave a raw SafetensorError traceback, a broken config.json "not available
    offline": both now name the copy and its removal (the next load converts again)."""
    spec, cached = _gguf_spec(tmp_path, monkeypatch)
    models.load_model(spec, "float32", "cpu")  # converted
    weights = cached / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    with pytest.raises(ModelCacheError, match=rf"the GGUF copy {cached} cannot be loaded .*rm -r {cached}"):
        models.load_model(spec, "float32", "cpu")
    weights.write_bytes(good)
    (cached / "config.json").write_text("{broken")
    with pytest.raises(ModelCacheError, match=rf"rm -r {cached}"):
        models.load_model(spec, "float32", "cpu")


def test_a_full_disk_is_named_and_leaves_no_temporary_folder(tmp_path, monkeypatch):
    spec, cached = _gguf_spec(tmp_path, monkeypatch)

    def full(*_args, **_kw):
        raise SafetensorError("Error while serializing: IoError(No space left on device (os error 28))")

    monkeypatch.setattr(models, "save_file", full)
    with pytest.raises(ModelCacheError, match="cannot be written .*No space left on device.*make room"):
        models.load_model(spec, "float32", "cpu")
    assert not [p for p in cached.parent.iterdir() if ".tmp-" in p.name]


def test_a_killed_conversions_temporary_folder_is_removed_by_the_next(tmp_path, monkeypatch):
    spec, cached = _gguf_spec(tmp_path, monkeypatch)
    leftover = cached.parent / f"{cached.name}.tmp-killed"
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"partial")
    models.load_tokenizer(spec)
    assert not leftover.exists() and (cached / "tokenizer_config.json").exists()


def test_the_sessions_end_does_not_wait_600_s_for_a_warm_up_blocked_on_a_lock(tmp_path):
    """conftest waited up to 600 s for a warm-up blocked on another process's lock; it now waits a bounded time
    and stops the warm-up's process group (its compiler with it), saying so."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from helpers import warm_caches  # noqa: PLC0415

    blocked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)
    start = time.monotonic()
    notes = warm_caches.finish([("kernels", blocked, tmp_path / "k.log"), ("gguf", done, tmp_path / "g.log")], 1.0)
    assert time.monotonic() - start < 30 and blocked.poll() is not None
    assert "warm-up of kernels was still running 1 s after the tests" in notes[0] and "stopped" in notes[0]
    assert notes[1] == f"warm-up of gguf failed (rc 3); its output: {tmp_path / 'g.log'}"
