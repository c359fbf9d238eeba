"""Cell keys of unchanged configurations stay what they were (resume, and comparisons across sweeps, rely on it).

The keys below were computed by ``pipeline.sweep.expand`` on the shipped sweeps (HARNESS_VERSION 2:
CPU cells measured alone on their node with all its cores, ``measure.threads: null``; the judge no
longer part of a key; draft-based methods with `drafter`, `max_ngram`, `min_ngram` and the
offline pair with its `eagle:`/`drafter:` keys), with ``data_root=data`` (so that the configured data
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
            ('ar', 'humaneval', 0, 'eac5d213385f'),
            ('spd', 'humaneval', 0, '3cfeacc7d828'),
            ('block', 'humaneval', 0, '46bcdb3870ad'),
            ('mtad', 'humaneval', 0, 'dc04cbdfd8ed'),
            ('ar', 'humaneval', 1, 'e66a86bc6706'),
            ('spd', 'humaneval', 1, 'edef5aeabc94'),
            ('block', 'humaneval', 1, '2c12bc3d5878'),
            ('mtad', 'humaneval', 1, 'c72e5e08a324'),
            ('ar', 'humaneval', 2, '26b255500f91'),
            ('spd', 'humaneval', 2, 'b71fa86c6527'),
            ('block', 'humaneval', 2, 'e18c8a8ba4f0'),
            ('mtad', 'humaneval', 2, '6be6ad34a4d0'),
            ('ar', 'mt_bench', 0, 'bab026894208'),
            ('spd', 'mt_bench', 0, '29a81952ee5f'),
            ('block', 'mt_bench', 0, '4a0cb82b0553'),
            ('mtad', 'mt_bench', 0, 'e8afef542688'),
            ('ar', 'mt_bench', 1, '06e81acebe9e'),
            ('spd', 'mt_bench', 1, '3dc64e79f869'),
            ('block', 'mt_bench', 1, 'ee3b53b70dae'),
            ('mtad', 'mt_bench', 1, 'a94162c76ae7'),
            ('ar', 'mt_bench', 2, '21483a8ee7ce'),
            ('spd', 'mt_bench', 2, '83f86a2ea3cc'),
            ('block', 'mt_bench', 2, 'e4a3770aefb3'),
            ('mtad', 'mt_bench', 2, '7e9d40629288'),
        ],
    ),
    'all_methods': (
        ['sweep=all_methods', 'data_root=data'],
        [
            ('ar', 'humaneval', 0, 'eac5d213385f'),
            ('beam', 'humaneval', 0, 'a0d4db678127'),
            ('mtjd', 'humaneval', 0, 'b22c4af2f580'),
            ('spd', 'humaneval', 0, '3cfeacc7d828'),
            ('block', 'humaneval', 0, '46bcdb3870ad'),
            ('mtad', 'humaneval', 0, 'dc04cbdfd8ed'),
            ('bild', 'humaneval', 0, 'fe19575166fa'),
            ('spectr', 'humaneval', 0, 'f4e45cc4268d'),
            ('specinfer', 'humaneval', 0, '51a45a3b5b96'),
            ('mcss', 'humaneval', 0, '2cc53417bf64'),
            ('typical', 'humaneval', 0, '6c0ffa83d142'),
            ('typical(medusa)', 'humaneval', 0, '383221bad29a'),
            ('medusa', 'humaneval', 0, '12daa3ad052c'),
        ],
    ),
    'mtad_tau': (
        ['sweep=smoke', 'data_root=data', 'method=mtad', 'method.tau=0.3', 'seeds=[0]'],
        [
            ('ar', 'humaneval', 0, 'eac5d213385f'),
            ('mtad(tau=0.3)', 'humaneval', 0, '100e43dcaf57'),
            ('ar', 'mt_bench', 0, 'bab026894208'),
            ('mtad(tau=0.3)', 'mt_bench', 0, '2fc2d47fe736'),
        ],
    ),
    'spec': (
        ['sweep=smoke', 'data_root=data', 'dataset=spec_bench', 'dataset.limit=2', 'seeds=[0]', 'method=spd'],
        [
            ('ar', 'spec_bench', 0, '17847e90e779'),
            ('spd', 'spec_bench', 0, '1c3c0790d22c'),
        ],
    ),
    'cnn': (
        ['sweep=smoke', 'data_root=data', 'dataset=cnn_dm', 'dataset.limit=2', 'seeds=[0]', 'method=block', 'method.gamma=3'],
        [
            ('ar', 'cnn_dm', 0, 'bf8b1dee3723'),
            ('block(gamma=3)', 'cnn_dm', 0, '11be09a20508'),
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
