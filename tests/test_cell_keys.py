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
cost ratio c. A change that alters any of them must bump ``HARNESS_VERSION`` and say so in the README.
A change of a shipped sweep's own config is not a harness change: the smoke sweep's datasets went from
2 samples x 64 new tokens to 3 x 128 and runs spd and block at gamma 2 (its keys and those of ``mtad_tau``,
made from it, are new).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import sweep
from pipeline.decoding.base import DRAFTER_KINDS, Param, int_at_least
from pipeline.decoding.drafters import NgramDrafter, register_drafter

REPO = Path(__file__).resolve().parents[1]

PINNED: dict[str, tuple[list[str], list[tuple[str, str, int, str]]]] = {
    'smoke': (
        ['sweep=smoke', 'data_root=data'],
        [
            ('ar', 'humaneval', 0, '24d7dfdbfb5d'),
            ('spd', 'humaneval', 0, '2bc7e2a0ea5b'),
            ('block', 'humaneval', 0, 'a9a47dc4ee90'),
            ('mtad', 'humaneval', 0, 'c48ec322c571'),
            ('ar', 'humaneval', 1, 'c5cc4637fc92'),
            ('spd', 'humaneval', 1, '9eb876b8dffa'),
            ('block', 'humaneval', 1, '2ec0ac0f2519'),
            ('mtad', 'humaneval', 1, '64229685d3cf'),
            ('ar', 'humaneval', 2, 'dbe68c63d112'),
            ('spd', 'humaneval', 2, '4ba1b5edad72'),
            ('block', 'humaneval', 2, '2a9bd4fe73c4'),
            ('mtad', 'humaneval', 2, '7b7c702cb53b'),
            ('ar', 'mt_bench', 0, '4a1a8d3d9fba'),
            ('spd', 'mt_bench', 0, 'f6b2fe006820'),
            ('block', 'mt_bench', 0, '552b9fe2c1ef'),
            ('mtad', 'mt_bench', 0, '427c270c8db6'),
            ('ar', 'mt_bench', 1, 'a7b8e4e0d2ba'),
            ('spd', 'mt_bench', 1, '166e887b0a93'),
            ('block', 'mt_bench', 1, '6cefd0192c43'),
            ('mtad', 'mt_bench', 1, 'bf423a06a873'),
            ('ar', 'mt_bench', 2, '39ecf6bb4277'),
            ('spd', 'mt_bench', 2, 'ca27ff4309d2'),
            ('block', 'mt_bench', 2, 'd5e470c70a95'),
            ('mtad', 'mt_bench', 2, '9110d03061f1'),
        ],
    ),
    'all_methods': (
        ['sweep=all_methods', 'data_root=data'],
        [
            ('ar', 'humaneval', 0, 'a599a4baf559'),
            ('beam', 'humaneval', 0, '8f9890015b8f'),
            ('mtjd', 'humaneval', 0, '484cbeb184ec'),
            ('spd', 'humaneval', 0, '04d73e9af332'),
            ('block', 'humaneval', 0, 'a08574c34bed'),
            ('mtad', 'humaneval', 0, 'f61550d17b3b'),
            ('bild', 'humaneval', 0, '4c57170e2225'),
            ('spectr', 'humaneval', 0, '016bec696a8a'),
            ('specinfer', 'humaneval', 0, '49328bf7036c'),
            ('mcss', 'humaneval', 0, '907a81402922'),
            ('typical', 'humaneval', 0, '3cb8bd879edc'),
            ('typical(medusa)', 'humaneval', 0, '82e9d8d38646'),
            ('medusa', 'humaneval', 0, 'acbc8fcfe698'),
        ],
    ),
    'mtad_tau': (
        ['sweep=smoke', 'data_root=data', 'method=mtad', 'method.tau=0.3', 'seeds=[0]'],
        [
            ('ar', 'humaneval', 0, '24d7dfdbfb5d'),
            ('mtad(tau=0.3)', 'humaneval', 0, 'd7b4705d2423'),
            ('ar', 'mt_bench', 0, '4a1a8d3d9fba'),
            ('mtad(tau=0.3)', 'mt_bench', 0, '9caf1ae1bfae'),
        ],
    ),
    'spec': (
        ['sweep=smoke', 'data_root=data', 'dataset=spec_bench', 'dataset.limit=2', 'seeds=[0]', 'method=spd'],
        [
            ('ar', 'spec_bench', 0, '72b637e03814'),
            ('spd', 'spec_bench', 0, 'ea797090240e'),
        ],
    ),
    'cnn': (
        ['sweep=smoke', 'data_root=data', 'dataset=cnn_dm', 'dataset.limit=2', 'seeds=[0]', 'method=block', 'method.gamma=4'],
        [
            ('ar', 'cnn_dm', 0, 'fc7577d92e87'),
            ('block(gamma=4)', 'cnn_dm', 0, '56bf13aca9f6'),
        ],
    ),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    data = REPO / "data"  # the project's own copy (part of the repository: never skipped)
    root = tmp_path_factory.mktemp("keys")
    (root / "data").symlink_to(data, target_is_directory=True)
    return root


@pytest.mark.parametrize("case", sorted(PINNED))
def test_cell_keys_are_unchanged(case, project, bf16_cpu):
    overrides, expected = PINNED[case]
    plan = sweep.expand(sweep.compose(overrides), project)
    got = [(c.label, c.dataset_name, c.seed, c.key) for c in plan.cells]
    assert got == expected


def test_the_machines_precision_is_part_of_the_key(project, bf16_cpu, monkeypatch):
    """The same config on a CPU without native bf16 (auto -> float32, today's kernels) is another cell."""
    overrides, expected = PINNED["smoke"]
    monkeypatch.setenv("PIPELINE_CPU_BF16", "0")
    plan = sweep.expand(sweep.compose(overrides), project)
    keys = [c.key for c in plan.cells]
    assert len(set(keys)) == len(keys) and not set(keys) & {k for *_, k in expected}


DRAFTER_CASES = {
    "all_methods": ['sweep=all_methods', 'data_root=data'],
    "ngram": ['sweep=smoke', 'data_root=data', 'seeds=[0]', 'method=spd', 'method.drafter=ngram'],
    "ngram_scope": ['sweep=smoke', 'data_root=data', 'seeds=[0]', 'method=block', 'method.drafter={kind:ngram,max_ngram:2}'],
    "eagle": ['sweep=smoke', 'data_root=data', 'seeds=[0]', 'method=mtad', 'method.drafter=eagle'],
    "model": ['sweep=smoke', 'data_root=data', 'seeds=[0]', 'method=typical', 'method.drafter=model'],
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
    assert with_all["all_methods"] == PINNED["all_methods"][1]
    eagle3 = DRAFTER_KINDS["eagle3"]
    monkeypatch.delitem(DRAFTER_KINDS, "eagle3")  # the registry as it was before EAGLE-3
    assert _keys(project) == with_all
    monkeypatch.setitem(DRAFTER_KINDS, "eagle3", eagle3)
    register_drafter(SuffixDrafter)  # a new kind with its own parameter
    try:
        assert _keys(project) == with_all
        new = sweep.expand(sweep.compose(['sweep=smoke', 'data_root=data', 'seeds=[0]', 'method=spd', 'method.drafter={kind:suffix,reach:4}']), project).cells
        assert new[1].params["drafter"] == {"kind": "suffix", "max_ngram": 3, "min_ngram": 1, "reach": 4}
        assert new[1].key not in {k for case in with_all.values() for *_, k in case}
        assert new[0].key == with_all["ngram"][0][3]  # its ar baseline is the same cell
    finally:
        DRAFTER_KINDS.pop("suffix", None)
