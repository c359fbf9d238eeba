"""Teacher data made on a GPU node and brought back (issue 46 item 5): the compact shard format and its loader, the
batched generation into it within a time budget, the bundles that fit a device call's returned files, the device
entry's argument checks, and the distillation's refusal of shards made with other settings. CPU, tiny models."""

from __future__ import annotations

import json
import tarfile
import types

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
from pipeline.training import gpu_teacher, teacher_data
from pipeline.training.shards import load_records, load_shard, save_shard, shard_files
from pipeline.training.teacher_data import Record, generate_teacher_data


def records(vocab: int, k: int = 4, seed: int = 0) -> list[Record]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, kind in enumerate(["gen", "gen2", "tf", "gen"]):
        n, start = 9 + 3 * i, 4 + i
        ids = torch.randint(0, vocab, (n,), generator=g).to(torch.int32)
        top = torch.randint(0, vocab, (n - start, k), generator=g).to(torch.int32)
        logp = (-torch.rand(n - start, k, generator=g) * 20).sort(-1, descending=True).values.to(torch.float16)
        out.append(Record(ids, start, top, logp, kind))
    return out


@pytest.mark.parametrize("vocab", [49152, 70000])  # uint16 ids (the offline pair), int32 past 65,535
def test_npz_shards_give_back_the_records_exactly(tmp_path, vocab):
    recs = records(vocab)
    save_shard(recs, tmp_path / "shard-0000.npz")
    save_shard(recs[:2], tmp_path / "shard-0001.pt")
    back = load_shard(tmp_path / "shard-0000.npz")
    assert len(back) == len(recs)
    for r, b in zip(recs, back):
        assert b["kind"] == r.kind and b["start"] == r.start
        for key in ("ids", "topk_ids", "topk_logp"):
            assert b[key].dtype == getattr(r, key).dtype and torch.equal(b[key], getattr(r, key)), key
    # both formats in one folder, in shard order
    assert [p.name for p in shard_files(tmp_path)] == ["shard-0000.npz", "shard-0001.pt"]
    assert len(load_records(tmp_path)) == 6
    # the compact form: 2-byte ids below 65,536 (4 above), fp16 log-probs
    with np.load(tmp_path / "shard-0000.npz") as z:
        id_type = np.uint16 if vocab < 2**16 else np.int32
        assert z["ids"].dtype == z["topk_ids"].dtype == id_type and z["topk_logp"].dtype == np.float16


def test_a_truncated_or_foreign_shard_is_refused(tmp_path):
    save_shard(records(100), tmp_path / "shard-0000.npz")
    with np.load(tmp_path / "shard-0000.npz") as z:
        arrays = dict(z)
    arrays["topk_ids"] = arrays["topk_ids"][:-1]
    np.savez(tmp_path / "shard-0001.npz", **arrays)
    with pytest.raises(ValueError, match="do not add up"):
        load_shard(tmp_path / "shard-0001.npz")
    with pytest.raises(ValueError, match=r"\.pt or \.npz"):
        save_shard(records(100), tmp_path / "shard-0002.json")


def tiny(tok):
    return tiny_llama(0, vocab=len(tok), hidden=32, layers=1, heads=2, kv_heads=1, eos=tok.eos_token_id, scale=4.0)


def test_batched_generation_writes_npz_and_ends_inside_its_budget(tmp_path, monkeypatch):
    tok = word_tokenizer()
    kw = small_chat_run(engine="batched", shard_format="npz")
    generate_teacher_data(tiny(tok), tok, tmp_path / "a", time_budget_s=1e9, **kw)
    assert [p.suffix for p in shard_files(tmp_path / "a")] == [".npz"] * 3
    recs = load_records(tmp_path / "a")
    assert {r["kind"] for r in recs} <= {"gen", "gen2"} and all(r["topk_ids"].shape[1] == 4 for r in recs)
    # a clock that moves 5 s a reading (4 readings a shard): shard 1 begins at 25 s and ends at 35 s, shard 2 would
    # begin at 45 s and, as long as the longest so far (10 s), end past a 40 s budget: not begun
    clock = iter(range(0, 1000, 5))
    monkeypatch.setattr(teacher_data, "time", types.SimpleNamespace(time=lambda: float(next(clock))))
    generate_teacher_data(tiny(tok), tok, tmp_path / "b", time_budget_s=40, stop_before_budget=True, **kw)
    assert len(shard_files(tmp_path / "b")) == 2
    with pytest.raises(ValueError, match="shard_format"):
        generate_teacher_data(tiny(tok), tok, tmp_path / "c", time_budget_s=1, **{**kw, "shard_format": "zst"})


def test_bundles_fit_the_returned_file_limit_and_come_back_in_turns(tmp_path):
    shards, work, out = tmp_path / "shards", tmp_path / "work", tmp_path / "out"
    shards.mkdir()
    (shards / "manifest.json").write_text(json.dumps({"tokens": 1}))
    sizes = [300_000, 500_000, 200_000, 700_000, 100_000, 650_000]
    for i, n in enumerate(sizes):
        (shards / f"shard-{i:04d}.npz").write_bytes(bytes(n))
    limit = 1 << 20
    bundles = gpu_teacher.bundle(shards, work / "bundles", limit)
    seen = []
    for b in bundles:
        assert b.stat().st_size <= limit
        with tarfile.open(b) as tar:
            names = tar.getnames()
        assert names[0] == "manifest.json"
        seen += names[1:]
    assert seen == [f"shard-{i:04d}.npz" for i in range(len(sizes))]  # each shard once, in order
    first = gpu_teacher.collect(work, out, 2)
    second = gpu_teacher.collect(work, out, 2)
    rest = gpu_teacher.collect(work, out, 8)
    assert [p.name for p in first + second + rest] == [b.name for b in bundles] and len(bundles) > 2
    assert gpu_teacher.collect(work, out, 8) == []
    (shards / "shard-0009.npz").write_bytes(bytes(2 * limit))
    with pytest.raises(SystemExit, match="lower --batch-size"):
        gpu_teacher.bundle(shards, work / "bundles", limit)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["generate", "0", "--gguf-dir", "package"], "SECONDS must be positive"),
        (["generate", "60", "--gguf-dir", "{tmp}/none"], "gguf_parts.sh join"),
        (["generate", "60", "--gguf-dir", "package", "--top-k", "0"], "--top-k 0"),
        (["generate", "60", "--gguf-dir", "package", "--files", "0"], "--files 0"),
        (["generate", "60", "--gguf-dir", "package", "--tf-fraction", "1"], "--tf-fraction"),
        (["generate", "60", "--gguf-dir", "package", "--out", "{tmp}/w/out", "--work", "{tmp}/w"], "separate folders"),
        (["collect", "--work", "{tmp}/nothing"], "run generate first"),
    ],
)
def test_the_device_entry_refuses_bad_arguments_before_any_model_loads(tmp_path, monkeypatch, argv, message):
    monkeypatch.setattr("pipeline.models.load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")] if "--work" not in argv else []
    with pytest.raises(SystemExit, match=message):
        gpu_teacher.main(argv)


def test_the_entry_reads_the_joined_gguf(tmp_path):
    (tmp_path / gpu_teacher.GGUF_FILE).write_bytes(b"GGUF")
    args = gpu_teacher.parse_args(["generate", "30", "--gguf-dir", str(tmp_path), "--out", str(tmp_path / "o")])
    cfg = gpu_teacher.pair_for(args)
    assert cfg["draft"] is None and cfg["target"] == {"id": str(tmp_path.resolve()), "gguf_file": gpu_teacher.GGUF_FILE}


@pytest.mark.parametrize(
    "override,message",
    [
        ("data.teacher_dir={tmp}/empty", "no shard-"),
        ("data.teacher_dir={tmp}/data", "add data.n_prompts=64 seed=3"),
    ],
)
def test_distill_refuses_shards_made_with_other_settings(override, message, monkeypatch, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "data").mkdir()
    save_shard(records(100), tmp_path / "data" / "shard-0000.npz")
    manifest = {"prompts": "chat", "n_prompts": 64, "seed": 3, "multi_turn": 0.4}
    (tmp_path / "data" / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(distill_mod, "load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(
            "distill",
            overrides=[override.replace("{tmp}", str(tmp_path)), "data.prompts=chat", f"work_dir={tmp_path}/w"],
        )
    with pytest.raises(ValueError, match=message):
        distill_mod.run(cfg)


def test_the_distillation_and_a_node_make_their_generation_from_one_settings_mapping(tmp_path, monkeypatch):
    """``teacher_settings``: conf/distill.yaml's ``data:`` keys are the generation's keywords (a key it does not take
    is refused, naming those it takes); a node's run shares the distillation's sampler and records exactly the
    settings it generated with in its manifest."""
    data = gpu_teacher.distill_data()
    settings = teacher_data.teacher_settings(data, seed=5)
    assert set(settings) == set(data) - {"teacher_dir"} | {"seed"} and settings["seed"] == 5
    with pytest.raises(ValueError, match=r"unknown teacher-data setting\(s\) \['n_prompt'\]; the generation takes"):
        teacher_data.teacher_settings({**data, "n_prompt": 3})
    tok = word_tokenizer()
    monkeypatch.setattr("pipeline.models.load_pair", lambda cfg: types.SimpleNamespace(target=tiny(tok), tokenizer=tok))
    (tmp_path / gpu_teacher.GGUF_FILE).write_bytes(b"GGUF")
    argv = ["generate", "600", "--gguf-dir", str(tmp_path), "--device", "cpu", "--n-prompts", "6", "--batch-size", "3"]
    argv += ["--max-new-tokens", "4", "--top-k", "4", "--tf-fraction", "0", "--work", str(tmp_path / "w")]
    manifest = gpu_teacher.generate(gpu_teacher.parse_args([*argv, "--out", str(tmp_path / "o")]))
    assert {k: manifest[k] for k in ("prompts", "n_prompts", "top_k_store", "engine", "shard_format")} == {
        "prompts": "chat",
        "n_prompts": 6,
        "top_k_store": 4,
        "engine": "batched",
        "shard_format": "npz",
    }
    assert (manifest["sample_top_k"], manifest["sample_top_p"]) == (data["sample_top_k"], data["sample_top_p"])
    assert manifest["shards"] == 2 and json.loads((tmp_path / "w" / "shards" / "manifest.json").read_text()) == manifest
