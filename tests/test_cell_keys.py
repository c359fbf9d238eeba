"""Cell keys of unchanged configurations stay what they were (resume, and comparisons across sweeps, rely on it).

The keys below were computed by ``pipeline.sweep.expand`` on the shipped sweeps (HARNESS_VERSION 2:
CPU cells measured alone on their node with all its cores, ``measure.threads: null``; the judge no
longer part of a key), with ``data_root=data`` (so that the configured data
paths, part of a key, do not depend on where the offline data lives). A change that alters any of
them must bump ``HARNESS_VERSION`` and say so in the README.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import sweep

REPO = Path(__file__).resolve().parents[1]

PINNED: dict[str, tuple[list[str], list[tuple[str, str, int, str]]]] = {
    'smoke': (
        ['sweep=smoke', 'data_root=data'],
        [
            ('ar', 'humaneval', 0, 'fe0d1872a9ce'),
            ('spd', 'humaneval', 0, 'dbbd9d10f6da'),
            ('block', 'humaneval', 0, 'e3e367ad9d80'),
            ('mtad', 'humaneval', 0, 'f39164a452f8'),
            ('ar', 'humaneval', 1, '895a6de3b009'),
            ('spd', 'humaneval', 1, '4db1764e39ae'),
            ('block', 'humaneval', 1, '06d67c6036a1'),
            ('mtad', 'humaneval', 1, '52015b2da45b'),
            ('ar', 'humaneval', 2, '0442b4c7a5f3'),
            ('spd', 'humaneval', 2, '0e0fdcc85eb7'),
            ('block', 'humaneval', 2, '64aeac40bdb6'),
            ('mtad', 'humaneval', 2, '19d58bf16e7e'),
            ('ar', 'mt_bench', 0, 'bb1222ffc60a'),
            ('spd', 'mt_bench', 0, '2943db170173'),
            ('block', 'mt_bench', 0, '116677dcf607'),
            ('mtad', 'mt_bench', 0, 'cf60d37a854c'),
            ('ar', 'mt_bench', 1, '3c72efc0c28a'),
            ('spd', 'mt_bench', 1, '8afd16e7d1f6'),
            ('block', 'mt_bench', 1, '71c3d5cc8a9c'),
            ('mtad', 'mt_bench', 1, '106bfcf8f7b8'),
            ('ar', 'mt_bench', 2, '0a4827d05793'),
            ('spd', 'mt_bench', 2, '31a11375392e'),
            ('block', 'mt_bench', 2, 'f033279d6fc1'),
            ('mtad', 'mt_bench', 2, '1550ab553765'),
        ],
    ),
    'all_methods': (
        ['sweep=all_methods', 'data_root=data'],
        [
            ('ar', 'humaneval', 0, 'fe0d1872a9ce'),
            ('beam', 'humaneval', 0, '1849e8a17c11'),
            ('mtjd', 'humaneval', 0, '67f222f44d13'),
            ('spd', 'humaneval', 0, 'dbbd9d10f6da'),
            ('block', 'humaneval', 0, 'e3e367ad9d80'),
            ('mtad', 'humaneval', 0, 'f39164a452f8'),
            ('bild', 'humaneval', 0, 'bcf245c794ab'),
            ('spectr', 'humaneval', 0, '70c5e0deb75e'),
            ('specinfer', 'humaneval', 0, '0f5858fbebc0'),
            ('mcss', 'humaneval', 0, '2a2fe8a90f41'),
            ('typical', 'humaneval', 0, '3e9e8220e99a'),
            ('typical(medusa)', 'humaneval', 0, 'e4d36c1b3a50'),
            ('medusa', 'humaneval', 0, '1d460de7304b'),
        ],
    ),
    'mtad_tau': (
        ['sweep=smoke', 'data_root=data', 'method=mtad', 'method.tau=0.3', 'seeds=[0]'],
        [
            ('ar', 'humaneval', 0, 'fe0d1872a9ce'),
            ('mtad(tau=0.3)', 'humaneval', 0, '6c1341293306'),
            ('ar', 'mt_bench', 0, 'bb1222ffc60a'),
            ('mtad(tau=0.3)', 'mt_bench', 0, '7b2946ea3989'),
        ],
    ),
    'spec': (
        ['sweep=smoke', 'data_root=data', 'dataset=spec_bench', 'dataset.limit=2', 'seeds=[0]', 'method=spd'],
        [
            ('ar', 'spec_bench', 0, 'df280101648b'),
            ('spd', 'spec_bench', 0, '9198d1697c27'),
        ],
    ),
    'cnn': (
        ['sweep=smoke', 'data_root=data', 'dataset=cnn_dm', 'dataset.limit=2', 'seeds=[0]', 'method=block', 'method.gamma=3'],
        [
            ('ar', 'cnn_dm', 0, '59ab3e37989d'),
            ('block(gamma=3)', 'cnn_dm', 0, 'e4159979b985'),
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
    got = [(c["label"], c["dataset"]["name"], c["seed"], c["key"]) for c in plan.cells]
    assert got == expected
