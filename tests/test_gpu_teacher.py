"""Teacher data made on a GPU node and brought back (issue 46 item 5; issue 56 item 2; issue 57 findings 1 and 5): the
compact shard format and its checked loader (a shard is untrusted: sized from its headers, every record checked), the
folder's manifest (settings, shards, hashes) and generation that resumes only on it, the forecast before the first
shard, each shard bundled as it is written, the bundles' unpacking here (only regular shards and the manifest), the
device entry's argument bounds, the device script's bench arguments, and the distillation's refusals. CPU, tiny
models."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from helpers.models import tiny_llama
from helpers.paths import REPO
from helpers.teacher import small_chat_run
from helpers.tokenizers import word_tokenizer
from pipeline.training import distill as distill_mod
from pipeline.training import distill_heldout, gpu_teacher, shards, teacher_data
from pipeline.training.shards import (
    TeacherDataError,
    check_folder,
    load_records,
    load_shard,
    read_manifest,
    save_shard,
    shard_files,
)
from pipeline.training.teacher_data import Record, generate_teacher_data


def records(vocab: int, k: int = 4, seed: int = 0) -> list[Record]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, kind in enumerate(["gen", "gen2", "tf", "gen"]):
        n, start = 9 + 3 * i, 4 + i
        ids = torch.randint(0, vocab, (n,), generator=g).to(torch.int32)
        top = torch.randint(0, vocab, (n - start, k), generator=g).to(torch.int32)
        logp = (-torch.rand(n - start, k, generator=g) * 20 - 2).sort(-1, descending=True).values.to(torch.float16)
        out.append(Record(ids, start, top, logp, kind))
    return out


def tiny(tok):
    return tiny_llama(0, vocab=len(tok), hidden=32, layers=1, heads=2, kv_heads=1, eos=tok.eos_token_id, scale=4.0)


def manifest_for(folder: Path, settings: dict | None = None) -> dict:
    """A manifest listing the shards in ``folder`` (what a generation writes), written there."""
    names = [p.name for p in shard_files(folder)]
    entries = {n: {"bytes": (folder / n).stat().st_size, "sha256": shards.file_sha256(folder / n)} for n in names}
    base = {"prompts": "chat", "n_prompts": 64, "seed": 3, "multi_turn": 0.4, "vocab_size": 100}
    m = {"run": "r1", "settings": {**base, **(settings or {})}, "shards": entries, "wall_s": 1.0}
    (folder / "manifest.json").write_text(json.dumps(m))
    return m


# --------------------------------------------------------------------------------------------------
# Shards: the compact format, and a loader that trusts nothing in them (issue 57 finding 5)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab", [49152, 70000])  # uint16 ids (the offline pair), int32 past 65,535
def test_npz_shards_give_back_the_records_exactly(tmp_path, vocab):
    recs = records(vocab)
    save_shard(recs, tmp_path / "shard-0000.npz")
    save_shard(recs[:2], tmp_path / "shard-0001.pt")
    back = load_shard(tmp_path / "shard-0000.npz", vocab)
    assert len(back) == len(recs)
    for r, b in zip(recs, back):
        assert b["kind"] == r.kind and b["start"] == r.start
        for key in ("ids", "topk_ids", "topk_logp"):
            assert b[key].dtype == getattr(r, key).dtype and torch.equal(b[key], getattr(r, key)), key
    # both formats in one folder, in shard order; no temporary file left beside them
    assert [p.name for p in shard_files(tmp_path)] == ["shard-0000.npz", "shard-0001.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-0000.npz", "shard-0001.pt"]
    assert len(load_records(tmp_path, vocab)) == 6
    # the compact form: 2-byte ids below 65,536 (4 above), fp16 log-probs
    with np.load(tmp_path / "shard-0000.npz") as z:
        id_type = np.uint16 if vocab < 2**16 else np.int32
        assert z["ids"].dtype == z["topk_ids"].dtype == id_type and z["topk_logp"].dtype == np.float16


def shard_arrays(vocab: int = 100) -> dict[str, np.ndarray]:
    recs = records(vocab)
    return dict(
        ids=torch.cat([r.ids for r in recs]).numpy().astype(np.uint16),
        lengths=np.array([len(r.ids) for r in recs], dtype=np.int32),
        starts=np.array([r.start for r in recs], dtype=np.int32),
        kinds=np.array([0, 1, 2, 0], dtype=np.uint8),
        topk_ids=torch.cat([r.topk_ids for r in recs]).numpy().astype(np.uint16),
        topk_logp=torch.cat([r.topk_logp for r in recs]).numpy(),
    )


def spoil(a: dict[str, np.ndarray], what: str) -> None:
    """Damage record 2 of ``shard_arrays`` (its answer rows start at row 5 + 7 = 12) as a crafted shard would."""
    row = 12
    if what == "start past its length":
        a["starts"][2] = a["lengths"][2] + 3
    elif what == "negative length":
        a["lengths"][2], a["lengths"][3] = -a["lengths"][2], a["lengths"][3] + 2 * a["lengths"][2]
    elif what == "start zero":
        a["starts"][2] = 0
    elif what in ("nan", "inf", "positive"):
        a["topk_logp"][row, 1] = {"nan": np.nan, "inf": -np.inf, "positive": 0.5}[what]
    elif what == "mass past 1":
        a["topk_logp"][row, :] = -0.5
    elif what == "id past the vocabulary":
        a["ids"][9 + 12 + 3] = 100
    elif what == "top-k id past the vocabulary":
        a["topk_ids"][row, 0] = 60000
    elif what == "unknown kind":
        a["kinds"][2] = 7


@pytest.mark.parametrize(
    "what,message",
    [
        ("start past its length", r"shard-0000.npz record 2: start 18 is not inside its length 15"),
        ("negative length", r"shard-0000.npz record 2: length -15 is not positive"),
        ("start zero", r"shard-0000.npz record 2: start 0 is not inside"),
        ("nan", r"shard-0000.npz record 2: a log-prob that is NaN or infinite"),
        ("inf", r"shard-0000.npz record 2: a log-prob that is NaN or infinite"),
        ("positive", r"shard-0000.npz record 2: a positive log-prob"),
        ("mass past 1", r"shard-0000.npz record 2: top-k probabilities that sum past 1"),
        ("id past the vocabulary", r"shard-0000.npz record 2: a token id outside the vocabulary \[0, 100\)"),
        ("top-k id past the vocabulary", r"shard-0000.npz record 2: a top-k id outside \[0, 100\)"),
        ("unknown kind", r"shard-0000.npz record 2: kind is not one of"),
    ],
)
def test_a_shard_with_a_bad_record_is_refused_naming_the_shard_and_record(tmp_path, what, message):
    a = shard_arrays()
    np.savez_compressed(tmp_path / "shard-0000.npz", **a)
    assert len(load_shard(tmp_path / "shard-0000.npz", 100)) == 4  # the unspoiled shard loads
    spoil(a, what)
    np.savez_compressed(tmp_path / "shard-0000.npz", **a)
    with pytest.raises(TeacherDataError, match=message):
        load_shard(tmp_path / "shard-0000.npz", 100)
    # the .pt form is checked alike
    if what not in ("negative length", "id past the vocabulary", "unknown kind"):
        recs = [r.__dict__ for r in records(100)]
        recs[2]["start"] = int(a["starts"][2])
        recs[2]["topk_ids"] = torch.from_numpy(a["topk_ids"][12:21].astype(np.int32))
        recs[2]["topk_logp"] = torch.from_numpy(a["topk_logp"][12:21].copy())
        torch.save(recs, tmp_path / "shard-0001.pt")
        with pytest.raises(TeacherDataError, match=message.replace("0000.npz", "0001.pt")):
            load_shard(tmp_path / "shard-0001.pt", 100)


def test_a_truncated_or_foreign_shard_is_refused(tmp_path):
    a = shard_arrays()
    a["topk_ids"] = a["topk_ids"][:-1]
    np.savez(tmp_path / "shard-0001.npz", **a)
    with pytest.raises(TeacherDataError, match="sizes disagree"):
        load_shard(tmp_path / "shard-0001.npz")
    np.savez(tmp_path / "shard-0002.npz", **{**shard_arrays(), "extra": np.zeros(3)})
    with pytest.raises(TeacherDataError, match="not a shard's arrays"):
        load_shard(tmp_path / "shard-0002.npz")
    (tmp_path / "shard-0003.npz").write_bytes((tmp_path / "shard-0001.npz").read_bytes()[:300])
    with pytest.raises(TeacherDataError, match="shard-0003.npz: not a readable shard"):
        load_shard(tmp_path / "shard-0003.npz")
    with pytest.raises(ValueError, match=r"\.pt or \.npz"):
        save_shard(records(100), tmp_path / "shard-0004.json")


# the peak is this process's own memory's high-water mark (VmHWM, in kB): ru_maxrss would carry the forking parent's
# (Linux keeps the pre-exec address space's peak), a pytest worker's gigabyte of models included
BOMB = """
import sys
from pipeline.training.shards import TeacherDataError, load_shard
try:
    recs = load_shard(sys.argv[1])
    print("loaded", len(recs[0]["ids"]))
except TeacherDataError as err:
    print("refused", err)
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
print("peak", int(hwm.split()[1]))
"""


def test_a_shard_bomb_is_refused_from_its_headers_in_bounded_memory(tmp_path):
    """A 0.8 MB ``.npz`` whose one record declares 400M tokens (zeros, deflated ~1000:1) is refused before any of
    it is read: its declared sizes are past what a shard may hold; the process stays far under 1.5 GB."""
    n = 400_000_000
    path = tmp_path / "shard-0000.npz"
    small = {
        "lengths": np.array([n], dtype=np.int32),
        "starts": np.array([n - 1], dtype=np.int32),
        "kinds": np.zeros(1, dtype=np.uint8),
        "topk_ids": np.zeros((1, 4), dtype=np.uint16),
        "topk_logp": np.full((1, 4), -2.0, dtype=np.float16),
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for key, value in small.items():
            with zf.open(f"{key}.npy", "w") as f:
                np.lib.format.write_array(f, value)
        with zf.open("ids.npy", "w", force_zip64=True) as f:
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(header, {"descr": "<u2", "fortran_order": False, "shape": (n,)})
            f.write(header.getvalue())
            zeros = bytes(1 << 24)
            for _ in range(2 * n // len(zeros)):
                f.write(zeros)
            f.write(bytes(2 * n % len(zeros)))
    assert path.stat().st_size < 1_000_000
    out = subprocess.run([sys.executable, "-c", BOMB, str(path)], capture_output=True, text=True, cwd=REPO)
    assert "refused shard-0000.npz: declares 1 records, 400000000 tokens" in out.stdout, out.stdout + out.stderr
    peak_kib = int(out.stdout.split("peak ")[1])
    assert peak_kib < 1.5e9 / 1024, peak_kib


def test_a_killed_write_leaves_no_shard_and_no_held_out_file(tmp_path, monkeypatch):
    """Shards and held-out sets go to a temporary name first: a write that dies midway leaves neither a partial
    file that later runs would trip on nor a temporary one."""

    def dies(f, **arrays):
        f.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(shards.np, "savez_compressed", dies)
    with pytest.raises(KeyboardInterrupt):
        save_shard(records(100), tmp_path / "shard-0000.npz")
    assert list(tmp_path.iterdir()) == []
    cfg = types.SimpleNamespace(
        heldout=types.SimpleNamespace(n_humaneval=1, n_mtbench=1, max_new_tokens=4, seed=0, get=lambda k, d=None: d),
        seed=0,
    )
    monkeypatch.setattr(distill_heldout, "heldout_prompts", lambda *a: ["p"])
    monkeypatch.setattr(distill_heldout, "build_heldout", lambda *a, **k: {"rows": [torch.zeros(9)], "f": lambda: 0})
    with pytest.raises(Exception, match="pickle"):
        distill_heldout.heldout_sets(cfg, None, None, "batched", tmp_path, set(), print)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------------
# Generation: settings in the manifest, resumes on them only, damaged shards regenerated, the forecast
# --------------------------------------------------------------------------------------------------


def test_batched_generation_writes_npz_and_its_manifest_and_ends_inside_its_budget(tmp_path, monkeypatch):
    tok = word_tokenizer()
    kw = small_chat_run(engine="batched", shard_format="npz")
    generate_teacher_data(tiny(tok), tok, tmp_path / "a", time_budget_s=1e9, **kw)
    assert [p.suffix for p in shard_files(tmp_path / "a")] == [".npz"] * 3
    m = check_folder(tmp_path / "a")  # the manifest lists exactly the shards, their hashes match, records pass
    assert m["settings"]["vocab_size"] == len(tok) and m["settings"]["n_prompts"] == 12
    assert "time_budget_s" not in m["settings"] and all(e["seconds"] >= 0 for e in m["shards"].values())
    recs = load_records(tmp_path / "a", len(tok))
    assert {r["kind"] for r in recs} <= {"gen", "gen2"} and all(r["topk_ids"].shape[1] == 4 for r in recs)
    # a clock that moves 5 s a reading: shard 0's probe reads a 5-s prefill and no step time (a forecast of at most
    # 1.25 x 3 x 5 s, checked at 25 s); shard 0 then takes 5 s, and the forecast becomes 1.25 x 5 = 6.25 s; shard 1
    # is checked at 50 s: begun under a 60 s budget (the run stops after it, at 70 s), not begun under a 56 s one
    for budget, made in ((60, 2), (56, 1)):
        clock = iter(range(0, 1000, 5))
        monkeypatch.setattr(teacher_data, "time", types.SimpleNamespace(time=lambda: float(next(clock))))
        out = tmp_path / f"b{budget}"
        generate_teacher_data(tiny(tok), tok, out, time_budget_s=budget, stop_before_budget=True, **kw)
        assert len(shard_files(out)) == made, budget
    with pytest.raises(ValueError, match="shard_format"):
        generate_teacher_data(tiny(tok), tok, tmp_path / "c", time_budget_s=1, **{**kw, "shard_format": "zst"})


def test_the_first_shard_has_a_forecast_so_none_is_begun_past_the_budget(tmp_path, monkeypatch):
    """Issue 56 item 2: before any shard has run, a probe of the first shard's batch forecasts it; a shard whose
    forecast ends past the budget is not begun, the first included (it used to be written whatever it took)."""
    tok = word_tokenizer()
    logs: list[str] = []
    kw = {**small_chat_run(engine="batched", shard_format="npz"), "log": logs.append}
    generate_teacher_data(tiny(tok), tok, tmp_path / "a", time_budget_s=1e-6, stop_before_budget=True, **kw)
    assert shard_files(tmp_path / "a") == [] and any("would end past" in m for m in logs), logs
    probe = [m for m in logs if m.startswith("forecast: ")]
    assert len(probe) == 1 and float(probe[0].split()[1].rstrip("s")) > 0
    # the forecast in sense: the probe counts every row for every step of each turn, so it is not below a shard
    seen, real = {}, teacher_data.forecast_seconds

    def forecast(*a):
        seen["probe"] = real(*a)
        return seen["probe"]

    monkeypatch.setattr(teacher_data, "forecast_seconds", forecast)
    logs.clear()
    generate_teacher_data(tiny(tok), tok, tmp_path / "b", time_budget_s=1e9, stop_before_budget=True, **kw)
    took = max(e["seconds"] for e in read_manifest(tmp_path / "b")["shards"].values())
    assert len(shard_files(tmp_path / "b")) == 3 and seen["probe"] > 0 and took > 0


def test_generation_resumes_only_with_its_settings_and_regenerates_a_damaged_shard(tmp_path):
    tok = word_tokenizer()
    logs: list[str] = []
    kw = {**small_chat_run(engine="batched", shard_format="npz"), "log": logs.append}
    generate_teacher_data(tiny(tok), tok, tmp_path / "a", time_budget_s=1e9, **kw)
    first = {p.name: p.read_bytes() for p in shard_files(tmp_path / "a")}
    # other settings in the same folder: refused, naming what differs and the fix (no shard of theirs is mixed in)
    with pytest.raises(TeacherDataError, match=r"other settings: n_prompts=12 \(now 16\).*another folder"):
        generate_teacher_data(tiny(tok), tok, tmp_path / "a", time_budget_s=1e9, **{**kw, "n_prompts": 16})
    # a budget or a shard limit is not a setting: a run resumes with others
    generate_teacher_data(tiny(tok), tok, tmp_path / "a", time_budget_s=5e8, **{**kw, "max_shards": 9})
    # a truncated shard, a shard the manifest does not list, a killed writer's temporary file: the next run
    # regenerates the shards (the same content: a shard's draws come from its index) and loads
    (tmp_path / "a" / "shard-0001.npz").write_bytes(first["shard-0001.npz"][:100])
    (tmp_path / "a" / "shard-0002.npz").unlink()
    (tmp_path / "a" / ".shard-0002.npz.tmp-123").write_bytes(b"half")
    m = read_manifest(tmp_path / "a")
    del m["shards"]["shard-0002.npz"]
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(m))
    (tmp_path / "a" / "shard-0002.npz").write_bytes(first["shard-0002.npz"][:50])
    logs.clear()
    generate_teacher_data(tiny(tok), tok, tmp_path / "a", time_budget_s=1e9, **kw)
    assert any("shard-0001.npz: not the file its manifest lists" in m for m in logs), logs
    assert any("shard-0002.npz: not in the manifest" in m for m in logs), logs
    assert {p.name: p.read_bytes() for p in shard_files(tmp_path / "a")} == first
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted([*first, "manifest.json"])
    check_folder(tmp_path / "a")
    # a folder of shards without a manifest (their settings unknown): refused
    (tmp_path / "a" / "manifest.json").unlink()
    with pytest.raises(TeacherDataError, match="holds shards but no manifest.json"):
        generate_teacher_data(tiny(tok), tok, tmp_path / "a", time_budget_s=1e9, **kw)


# --------------------------------------------------------------------------------------------------
# The node: each shard bundled as it is written, the returned files bounded, the entry's arguments bounded
# --------------------------------------------------------------------------------------------------


def node_argv(tmp_path: Path, out: str = "o", *extra: str) -> list[str]:
    (tmp_path / gpu_teacher.GGUF_FILE).write_bytes(b"GGUF")
    argv = ["generate", "600", "--gguf-dir", str(tmp_path), "--device", "cpu", "--n-prompts", "9", "--batch-size", "3"]
    argv += ["--max-new-tokens", "4", "--top-k", "4", "--tf-fraction", "0", "--work", str(tmp_path / "w")]
    return [*argv, "--out", str(tmp_path / out), *extra]


class Killed(BaseException):
    """An outer timeout's kill, at the point a test chooses."""


def test_each_shard_is_bundled_as_it_is_written_so_a_kill_loses_nothing_finished(tmp_path, monkeypatch):
    """Issue 56 item 2: a node's run killed during its third shard has its first two in $OUT already (bundled with
    a manifest that lists them); the next call resumes after them and returns only what is new; unpacked here, the
    bundles of both calls make a whole folder."""
    tok = word_tokenizer()
    monkeypatch.setattr("pipeline.models.load_pair", lambda cfg: types.SimpleNamespace(target=tiny(tok), tokenizer=tok))
    real, calls = teacher_data.sample_conversations, []

    def sample_then_die(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise Killed
        return real(*a, **k)

    monkeypatch.setattr(teacher_data, "sample_conversations", sample_then_die)
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "teacher.log").write_text("the device script's log\n")
    with pytest.raises(Killed):
        gpu_teacher.main(node_argv(tmp_path, "o", "--file-mib", "1"))
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["teacher-00.tar", "teacher.log"]
    with tarfile.open(tmp_path / "o" / "teacher-00.tar") as tar:
        assert tar.getnames() == ["manifest.json", "shard-0000.npz", "shard-0001.npz"]
        listed = json.load(tar.extractfile("manifest.json"))["shards"]
    assert sorted(listed) == ["shard-0000.npz", "shard-0001.npz"]
    monkeypatch.setattr(teacher_data, "sample_conversations", real)
    summary = gpu_teacher.generate(gpu_teacher.parse_args(node_argv(tmp_path, "o2")))
    assert summary["shards"] == 3 and summary["prompts"] == "chat" and summary["engine"] == "batched"
    with tarfile.open(tmp_path / "o2" / "teacher-01.tar") as tar:  # teacher-00 was returned: a new bundle
        assert tar.getnames() == ["manifest.json", "shard-0002.npz"]
    assert sorted(p.name for p in (tmp_path / "o2").iterdir()) == ["teacher-01.tar"]
    m = gpu_teacher.unpack([str(tmp_path / "o"), str(tmp_path / "o2")], tmp_path / "run" / "data")
    assert check_folder(tmp_path / "run" / "data") == m and len(m["shards"]) == 3
    # settings known before the model loads that differ from --work's: refused before loading
    monkeypatch.setattr("pipeline.models.load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as exit_:
        gpu_teacher.main([*node_argv(tmp_path, "o3"), "--seed", "4"])
    assert exit_.value.code == 2


def test_bundles_fit_the_returned_file_limit_and_come_back_in_turns_of_at_most_8_files(tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "shards").mkdir(parents=True)
    (work / "shards" / "manifest.json").write_text(json.dumps({"tokens": 1}))
    limit = 1 << 20
    bundler = gpu_teacher.Bundler(work, out, 2, limit)
    sizes = [300_000, 500_000, 200_000, 700_000, 100_000, 650_000, 900_000, 600_000, 800_000, 700_000, *[900_000] * 3]
    for i, n in enumerate(sizes):
        (work / "shards" / f"shard-{i:04d}.npz").write_bytes(bytes(n))
        bundler.add(work / "shards" / f"shard-{i:04d}.npz")
    made = gpu_teacher.bundles(work)
    seen = []
    for b in made:
        assert b.stat().st_size <= limit and b.stat().st_size == gpu_teacher.tar_bytes(
            [(work / "shards" / "manifest.json").stat().st_size]
            + [(work / "shards" / n).stat().st_size for n in tarfile.open(b).getnames()[1:]]
        )
        with tarfile.open(b) as tar:
            names = tar.getnames()
        assert names[0] == "manifest.json"
        seen += names[1:]
    assert seen == [f"shard-{i:04d}.npz" for i in range(len(sizes))] and len(made) == 10  # each shard once, in order
    assert sorted(p.name for p in out.iterdir()) == ["teacher-00.tar", "teacher-01.tar"]  # --files 2
    # collect: at most --files and 8 files in $OUT in all, and only those are marked returned
    with pytest.raises(SystemExit) as exit_:
        gpu_teacher.main(["collect", "--work", str(work), "--out", str(tmp_path / "o2"), "--files", "20"])
    assert exit_.value.code == 2 and "--files 20: between 1 and 8" in capsys.readouterr().err
    (tmp_path / "o2").mkdir()
    for name in ("teacher.log", "bench.tar", "notes.txt"):  # 3 files there already: room for 5
        (tmp_path / "o2" / name).write_text("")
    assert gpu_teacher.collect(work, tmp_path / "o2", 8) == [b.name for b in made[2:7]]
    assert len(list((tmp_path / "o2").iterdir())) == 8
    assert (work / "returned.txt").read_text().split() == [b.name for b in made[:7]]  # only what came back
    assert gpu_teacher.collect(work, tmp_path / "o3", 8) == [b.name for b in made[7:]]
    assert gpu_teacher.collect(work, tmp_path / "o4", 8) == []
    with pytest.raises(gpu_teacher.RefusedError, match="lower --batch-size"):
        (work / "shards" / "shard-0010.npz").write_bytes(bytes(2 * limit))
        bundler.add(work / "shards" / "shard-0010.npz")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["generate", "0", "--gguf-dir", "package"], "SECONDS must be a number of seconds in"),
        (["generate", "inf", "--gguf-dir", "package"], "not inf"),
        (["generate", "nan", "--gguf-dir", "package"], "not nan"),
        (["generate", "-5", "--gguf-dir", "package"], "not -5"),
        (["generate", "1e9", "--gguf-dir", "package"], "in \\(0, 86400\\]"),
        (["generate", "60", "--gguf-dir", "{tmp}/none"], "gguf_parts.sh join"),
        (["generate", "60", "--gguf-dir", "package", "--top-k", "0"], "--top-k 0"),
        (["generate", "60", "--gguf-dir", "package", "--files", "0"], "--files 0"),
        (["generate", "60", "--gguf-dir", "package", "--files", "9"], "--files 9: between 1 and 8"),
        (["generate", "60", "--gguf-dir", "package", "--file-mib", "inf"], "--file-mib inf"),
        (["generate", "60", "--gguf-dir", "package", "--file-mib", "nan"], "--file-mib nan"),
        (["generate", "60", "--gguf-dir", "package", "--file-mib", "17"], "--file-mib 17.0: between 1 and 16"),
        (["generate", "60", "--gguf-dir", "package", "--file-mib", "-1"], "--file-mib -1.0"),
        (["generate", "60", "--gguf-dir", "package", "--batch-size", "100000"], "--batch-size"),
        (["generate", "60", "--gguf-dir", "package", "--top-k", "1024", "--batch-size", "4096"], "lower --batch-size"),
        (["generate", "60", "--gguf-dir", "package", "--tf-fraction", "1"], "--tf-fraction"),
        (["generate", "60", "--gguf-dir", "package", "--out", "{tmp}/w/out", "--work", "{tmp}/w"], "separate folders"),
        (["collect", "--work", "{tmp}/nothing"], "run generate first"),
        (["collect", "--work", "{tmp}/nothing", "--files", "20"], "--files 20"),
        (["unpack", "--into", "{tmp}/run", "{tmp}/none"], "no such file or folder"),
    ],
)
def test_the_device_entry_refuses_bad_arguments_before_any_model_loads(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.setattr("pipeline.models.load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if "--out" not in argv and argv[0] != "unpack":
        argv += ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")] if "--work" not in argv else []
    with pytest.raises(SystemExit) as exit_:
        gpu_teacher.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert __import__("re").search(message, err), err


def test_the_entry_reads_the_joined_gguf(tmp_path):
    (tmp_path / gpu_teacher.GGUF_FILE).write_bytes(b"GGUF")
    args = gpu_teacher.parse_args(["generate", "30", "--gguf-dir", str(tmp_path), "--out", str(tmp_path / "o")])
    cfg = gpu_teacher.pair_for(args)
    assert cfg["draft"] is None and cfg["target"] == {"id": str(tmp_path.resolve()), "gguf_file": gpu_teacher.GGUF_FILE}


# --------------------------------------------------------------------------------------------------
# Here: the returned bundles are untrusted (issue 57 finding 1)
# --------------------------------------------------------------------------------------------------


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **fields) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, len(data) if kind == tarfile.REGTYPE else 0
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data


def crafted(path: Path, members: list[tuple[tarfile.TarInfo, bytes]], mode: str = "w") -> Path:
    with tarfile.open(path, mode, format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
    return path


def good_bundle_parts(tmp_path: Path) -> tuple[bytes, bytes]:
    """A real shard and the manifest that lists it (as a node's run writes them)."""
    folder = tmp_path / "made"
    folder.mkdir(exist_ok=True)
    save_shard(records(100), folder / "shard-0000.npz")
    manifest_for(folder)
    return (folder / "manifest.json").read_bytes(), (folder / "shard-0000.npz").read_bytes()


def attacks(tmp_path: Path, outside: Path) -> dict[str, list[list[tuple[tarfile.TarInfo, bytes]]]]:
    manifest, shard = good_bundle_parts(tmp_path)
    m = member("manifest.json", data=manifest)
    return {
        "a symlink, then a file through it": [
            [m, member("evil", tarfile.SYMTYPE, linkname=str(outside))],
            [m, member("evil/pwned.txt", data=b"pwned")],
        ],
        "a hard link": [[m, member("shard-0001.npz", tarfile.LNKTYPE, linkname="/etc/passwd")]],
        "a device node": [[m, member("shard-0001.npz", tarfile.CHRTYPE, devmajor=1, devminor=3)]],
        "a FIFO": [[m, member("shard-0001.npz", tarfile.FIFOTYPE)]],
        "an absolute path": [[m, member(str(outside / "abs.npz"), data=shard)]],
        "a path up": [[m, member("../shard-0001.npz", data=shard)]],
        "a folder": [[m, member("sub", tarfile.DIRTYPE), member("sub/shard-0001.npz", data=shard)]],
        "a shard its manifest does not list": [[m, member("shard-0001.npz", data=shard)]],
        "a shard with other bytes": [[m, member("shard-0000.npz", data=shard[:-1] + b"x")]],
        "no manifest": [[member("shard-0000.npz", data=shard)]],
    }


def assert_nothing_escaped(tmp_path: Path, outside: Path, run: Path) -> None:
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "shard-0001.npz").exists() and not (run / "shard-0001.npz").exists()
    for root, dirs, files in os.walk(run):
        for name in dirs + files:
            st = os.lstat(Path(root) / name)
            assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode), (name, st.st_mode)
            assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID) and st.st_uid == os.getuid(), (name, st)


ATTACKS = [
    "a symlink, then a file through it",
    "a hard link",
    "a device node",
    "a FIFO",
    "an absolute path",
    "a path up",
    "a folder",
    "a shard its manifest does not list",
    "a shard with other bytes",
    "no manifest",
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_crafted_bundle_is_refused_and_writes_nothing(tmp_path, capsys, attack):
    outside, run = tmp_path / "outside", tmp_path / "run"
    outside.mkdir()
    paths = [crafted(tmp_path / f"teacher-{i:02d}.tar", ms) for i, ms in enumerate(attacks(tmp_path, outside)[attack])]
    with pytest.raises(SystemExit) as exit_:
        gpu_teacher.main(["unpack", "--into", str(run / "data"), *map(str, paths)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert_nothing_escaped(tmp_path, outside, run)
    assert sorted(p.name for p in (run / "data").iterdir()) == []  # nothing moved in, no staging folder left


def test_a_setuid_foreign_member_comes_out_a_plain_file_of_ours_and_other_runs_are_refused(tmp_path, capsys):
    outside, run = tmp_path / "outside", tmp_path / "run"
    outside.mkdir()
    manifest, shard = good_bundle_parts(tmp_path)
    owned = dict(mode=0o6755, uid=12345, gid=12345, uname="mallory", gname="mallory")
    bundle = crafted(
        tmp_path / "teacher-00.tar",
        [member("manifest.json", data=manifest, **owned), member("shard-0000.npz", data=shard, **owned)],
    )
    gpu_teacher.main(["unpack", "--into", str(run / "data"), str(bundle)])
    assert_nothing_escaped(tmp_path, outside, run)
    assert (run / "data" / "shard-0000.npz").read_bytes() == shard and check_folder(run / "data")
    # a gzip'd bundle (not what a node writes) and a bundle of another generation run: refused
    gz = crafted(tmp_path / "teacher-01.tar", [member("manifest.json", data=manifest)], "w:gz")
    other = json.loads(manifest)
    other["run"] = "r2"
    foreign = crafted(tmp_path / "teacher-02.tar", [member("manifest.json", data=json.dumps(other).encode())])
    for path, message in ((gz, "not a tar bundle"), (foreign, "another generation run")):
        with pytest.raises(SystemExit):
            gpu_teacher.main(["unpack", "--into", str(run / "data"), str(path)])
        assert message in capsys.readouterr().err
    assert sorted(p.name for p in (run / "data").iterdir()) == ["manifest.json", "shard-0000.npz"]


@pytest.mark.parametrize("attack", ["a symlink, then a file through it", "a device node", "a FIFO"])
def test_teacher_back_refuses_crafted_bundles_before_anything_is_written_or_trained(tmp_path, attack):
    """The bring-back script unpacks through ``gpu_teacher unpack`` (it used to run ``tar xf`` as root: a symlink
    from one bundle let the next write outside, device nodes and FIFOs were made)."""
    outside, run = tmp_path / "outside", tmp_path / "run"
    outside.mkdir()
    folder = tmp_path / "files_at"
    folder.mkdir()
    for i, ms in enumerate(attacks(tmp_path, outside)[attack]):
        crafted(folder / f"teacher-{i:02d}.tar", ms)
    env = {**os.environ, "PY": sys.executable, "RUN": str(run), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        ["bash", "jobs/teacher_back.sh", str(folder)], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.returncode == 2 and "error: " in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert_nothing_escaped(tmp_path, outside, run)


# --------------------------------------------------------------------------------------------------
# The distillation's refusals of a teacher folder, and the device script's arguments
# --------------------------------------------------------------------------------------------------


def distill_cfg(tmp_path: Path, *overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("distill", overrides=[*overrides, "data.prompts=chat", f"work_dir={tmp_path}/w"])


@pytest.mark.parametrize(
    "case,message",
    [
        ("no folder", "no such folder"),
        ("no manifest", "no manifest.json"),
        ("a shard missing", "1 of the manifest's 2 shards are missing \\(shard-0001.npz\\): bring back every bundle"),
        ("a shard not listed", "\\['shard-0002.npz'\\] not in its manifest"),
        ("a shard changed", "shard-0001.npz: not the shard its manifest lists"),
        ("a bad record", "shard-0001.npz record 2: a positive log-prob"),
        ("other settings", "add data.n_prompts=64 seed=3"),
    ],
)
def test_distill_refuses_a_teacher_folder_that_is_not_whole_or_not_its_own(case, message, monkeypatch, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    save_shard(records(100), data / "shard-0000.npz")
    a = shard_arrays()
    if case == "a bad record":
        spoil(a, "positive")
    np.savez_compressed(data / "shard-0001.npz", **a)
    manifest_for(data)
    if case == "no manifest":
        (data / "manifest.json").unlink()
    elif case == "a shard missing":
        (data / "shard-0001.npz").unlink()
    elif case == "a shard not listed":
        save_shard(records(100, seed=2), data / "shard-0002.npz")
    elif case == "a shard changed":
        np.savez_compressed(data / "shard-0001.npz", **{**a, "topk_logp": a["topk_logp"] - 1})
    monkeypatch.setattr(distill_mod, "load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    where = tmp_path / ("none" if case == "no folder" else "data")
    mine = [] if case == "other settings" else ["data.n_prompts=64", "seed=3"]
    cfg = distill_cfg(tmp_path, f"data.teacher_dir={where}", *mine)
    with pytest.raises(TeacherDataError, match=message):
        distill_mod.run(cfg)


def test_distill_on_the_command_line_refuses_in_one_line_exit_2(tmp_path):
    (tmp_path / "data").mkdir()
    save_shard(records(100), tmp_path / "data" / "shard-0000.npz")
    cmd = [sys.executable, "-m", "pipeline.distill", f"data.teacher_dir={tmp_path}/data", f"work_dir={tmp_path}/w"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2 and out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    assert "no manifest.json" in out.stderr and "teacher_back.sh" in out.stderr


STUB = """#!/bin/sh
exec python3 -c 'import json, os, sys; open(os.environ["STUB_LOG"], "a").write(json.dumps(sys.argv[1:]) + "\\n")' "$@"
"""


def test_the_device_script_passes_bench_overrides_whole_and_bounds_its_seconds(tmp_path):
    """Issue 56 item 2 / 57 finding 5: the bench's overrides (after ``--``, or ``BENCH_ARGS`` one a line) reach it
    each as one argument, never split on spaces nor globbed (they were: ``${BENCH_ARGS}`` unquoted); SECONDS that is
    not a positive number of seconds (``inf``, negative, absurd) is refused before anything runs."""
    stub = tmp_path / "py"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "PY": str(stub), "STUB_LOG": str(log), "GGUF_DIR": "package", "OUT": str(tmp_path / "out")}
    env.update(WORK=str(tmp_path / "work"), BENCH_ARGS='prompts=["why is the sky blue?"]\n*\n')
    cmd = ["bash", "jobs/gpu_teacher.sh", "30", "--n-prompts", "8", "--", "repeats=3", "max_new_tokens=[1, 2]"]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    generate = next(c for c in calls if c[:3] == ["-m", "pipeline.training.gpu_teacher", "generate"])
    bench = next(c for c in calls if c[:2] == ["-m", "pipeline.bench"])
    assert generate[-2:] == ["--n-prompts", "8"] and "--" not in generate
    assert bench[-4:] == ["repeats=3", "max_new_tokens=[1, 2]", 'prompts=["why is the sky blue?"]', "*"]
    env["OUT"] = str(tmp_path / "out2")
    for seconds in ("inf", "-5", "1e9", "nan", "99999", "0"):
        out = subprocess.run(
            ["bash", "jobs/gpu_teacher.sh", seconds], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert out.returncode == 2 and "SECONDS" in out.stderr and not (tmp_path / "out2").exists(), seconds
    out = subprocess.run(
        ["bash", "jobs/gpu_teacher.sh", "30"], cwd=REPO, env={**env, "FILES": "7"}, capture_output=True, text=True
    )
    assert out.returncode == 2 and "FILES=7: 1 to 6 bundles with the bench" in out.stderr
