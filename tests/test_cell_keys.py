"""Cell keys of unchanged configurations stay what they were (resume, and comparisons across sweeps, rely on it).

The keys below were computed by ``pipeline.sweep.expand`` on the shipped sweeps, with ``data_root=data``
(so that the configured data paths, part of a key, do not depend on where the offline data lives).
HARNESS_VERSION 2: CPU cells measured alone on their node with all its cores, ``measure.threads:
null``; the judge no longer part of a key; the offline pair with its `eagle:`/`drafter:` keys.
HARNESS_VERSION 3 (drafters as plugins): the cells of methods with a drafter (spd, block, mtad, bild,
spectr, specinfer, mcss, typical) changed once: their parameters carry the drafter's own scope
(``drafter: {kind: model}``; ``max_ngram``/``min_ngram`` only in an ngram scope) and their cost ratio c
is their own drafter's. The ``ar``, ``beam``, ``mtjd`` and ``medusa`` keys are those of version 2
(unchanged lines). A change that alters any of them must bump ``HARNESS_VERSION`` and say so in the README.
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
            ('ar', 'humaneval', 0, 'eac5d213385f'),
            ('spd', 'humaneval', 0, 'e9c1a21dee83'),
            ('block', 'humaneval', 0, 'f1125f43fa11'),
            ('mtad', 'humaneval', 0, 'cb8a1b060f42'),
            ('ar', 'humaneval', 1, 'e66a86bc6706'),
            ('spd', 'humaneval', 1, '14bf231065ec'),
            ('block', 'humaneval', 1, 'f6e9a95d5729'),
            ('mtad', 'humaneval', 1, '5474a187d98d'),
            ('ar', 'humaneval', 2, '26b255500f91'),
            ('spd', 'humaneval', 2, 'd97ad4a1053a'),
            ('block', 'humaneval', 2, '60cd0aa4c19b'),
            ('mtad', 'humaneval', 2, '336fd1bec61b'),
            ('ar', 'mt_bench', 0, 'bab026894208'),
            ('spd', 'mt_bench', 0, 'ba5801f731cd'),
            ('block', 'mt_bench', 0, 'aed069ae0072'),
            ('mtad', 'mt_bench', 0, 'c6683fdb0319'),
            ('ar', 'mt_bench', 1, '06e81acebe9e'),
            ('spd', 'mt_bench', 1, 'e84f0be4a234'),
            ('block', 'mt_bench', 1, 'de14b2a68761'),
            ('mtad', 'mt_bench', 1, '3f959960b89e'),
            ('ar', 'mt_bench', 2, '21483a8ee7ce'),
            ('spd', 'mt_bench', 2, '58a9ee200735'),
            ('block', 'mt_bench', 2, '02c984b82c86'),
            ('mtad', 'mt_bench', 2, 'd71ee7267d23'),
        ],
    ),
    'all_methods': (
        ['sweep=all_methods', 'data_root=data'],
        [
            ('ar', 'humaneval', 0, 'eac5d213385f'),
            ('beam', 'humaneval', 0, 'a0d4db678127'),
            ('mtjd', 'humaneval', 0, 'b22c4af2f580'),
            ('spd', 'humaneval', 0, 'e9c1a21dee83'),
            ('block', 'humaneval', 0, 'f1125f43fa11'),
            ('mtad', 'humaneval', 0, 'cb8a1b060f42'),
            ('bild', 'humaneval', 0, 'b22deedd91c7'),
            ('spectr', 'humaneval', 0, 'c651f3156f92'),
            ('specinfer', 'humaneval', 0, '68902944a45f'),
            ('mcss', 'humaneval', 0, '662fb55765ba'),
            ('typical', 'humaneval', 0, '323ff0add6bd'),
            ('typical(medusa)', 'humaneval', 0, 'eab5b04c695e'),
            ('medusa', 'humaneval', 0, '12daa3ad052c'),
        ],
    ),
    'mtad_tau': (
        ['sweep=smoke', 'data_root=data', 'method=mtad', 'method.tau=0.3', 'seeds=[0]'],
        [
            ('ar', 'humaneval', 0, 'eac5d213385f'),
            ('mtad(tau=0.3)', 'humaneval', 0, '1740ed8a455a'),
            ('ar', 'mt_bench', 0, 'bab026894208'),
            ('mtad(tau=0.3)', 'mt_bench', 0, 'dcfa2bee0908'),
        ],
    ),
    'spec': (
        ['sweep=smoke', 'data_root=data', 'dataset=spec_bench', 'dataset.limit=2', 'seeds=[0]', 'method=spd'],
        [
            ('ar', 'spec_bench', 0, '17847e90e779'),
            ('spd', 'spec_bench', 0, '057229c9b35a'),
        ],
    ),
    'cnn': (
        ['sweep=smoke', 'data_root=data', 'dataset=cnn_dm', 'dataset.limit=2', 'seeds=[0]', 'method=block', 'method.gamma=3'],
        [
            ('ar', 'cnn_dm', 0, 'bf8b1dee3723'),
            ('block(gamma=3)', 'cnn_dm', 0, 'e71113fbd7b4'),
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
def test_cell_keys_are_unchanged(case, project):
    overrides, expected = PINNED[case]
    plan = sweep.expand(sweep.compose(overrides), project)
    got = [(c.label, c.dataset_name, c.seed, c.key) for c in plan.cells]
    assert got == expected


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


def test_adding_a_drafter_changes_no_other_key(project, monkeypatch):
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
