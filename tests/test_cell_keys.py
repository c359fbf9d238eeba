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
            ('ar', 'humaneval', 0, '7a2de805d564'),
            ('spd', 'humaneval', 0, 'b23a7b2d0d65'),
            ('block', 'humaneval', 0, 'fc28f986ec3d'),
            ('mtad', 'humaneval', 0, 'cf079ea04eb2'),
            ('ar', 'humaneval', 1, 'daaf8299c145'),
            ('spd', 'humaneval', 1, 'ed6c927028f3'),
            ('block', 'humaneval', 1, 'c26592e211e1'),
            ('mtad', 'humaneval', 1, '078a0af014d7'),
            ('ar', 'humaneval', 2, '1be0743bf6ba'),
            ('spd', 'humaneval', 2, '0ad93caed906'),
            ('block', 'humaneval', 2, '3211b56ae351'),
            ('mtad', 'humaneval', 2, 'c65b163d5f60'),
            ('ar', 'mt_bench', 0, '3d6e79ea74e1'),
            ('spd', 'mt_bench', 0, 'e79d79aa1935'),
            ('block', 'mt_bench', 0, '055dfb853020'),
            ('mtad', 'mt_bench', 0, '9e8e3ce105dd'),
            ('ar', 'mt_bench', 1, '617c385acf9d'),
            ('spd', 'mt_bench', 1, '1e66e7da763d'),
            ('block', 'mt_bench', 1, '573266867e64'),
            ('mtad', 'mt_bench', 1, 'b420563137c6'),
            ('ar', 'mt_bench', 2, 'bf3ceee5a9b4'),
            ('spd', 'mt_bench', 2, '10b9297c3876'),
            ('block', 'mt_bench', 2, '9ce0434e48f5'),
            ('mtad', 'mt_bench', 2, '1e1af7596c27'),
        ],
    ),
    'all_methods': (
        ['sweep=all_methods', 'data_root=data'],
        [
            ('ar', 'humaneval', 0, '7a2de805d564'),
            ('beam', 'humaneval', 0, 'b83f4efbbd39'),
            ('mtjd', 'humaneval', 0, '94924c3e93da'),
            ('spd', 'humaneval', 0, 'b23a7b2d0d65'),
            ('block', 'humaneval', 0, 'fc28f986ec3d'),
            ('mtad', 'humaneval', 0, 'cf079ea04eb2'),
            ('bild', 'humaneval', 0, '0837316055db'),
            ('spectr', 'humaneval', 0, 'cafbcda5e6a5'),
            ('specinfer', 'humaneval', 0, 'ca2b1d2983a2'),
            ('mcss', 'humaneval', 0, 'ccee65cc1c87'),
            ('typical', 'humaneval', 0, 'a5ec35f69efd'),
            ('typical(medusa)', 'humaneval', 0, 'f1e9dd8b8e2c'),
            ('medusa', 'humaneval', 0, '8ebb4d5f3da9'),
        ],
    ),
    'mtad_tau': (
        ['sweep=smoke', 'data_root=data', 'method=mtad', 'method.tau=0.3', 'seeds=[0]'],
        [
            ('ar', 'humaneval', 0, '7a2de805d564'),
            ('mtad(tau=0.3)', 'humaneval', 0, '22c9a082124b'),
            ('ar', 'mt_bench', 0, '3d6e79ea74e1'),
            ('mtad(tau=0.3)', 'mt_bench', 0, '3fcd9c2d413a'),
        ],
    ),
    'spec': (
        ['sweep=smoke', 'data_root=data', 'dataset=spec_bench', 'dataset.limit=2', 'seeds=[0]', 'method=spd'],
        [
            ('ar', 'spec_bench', 0, '6c9a5aefc56b'),
            ('spd', 'spec_bench', 0, 'bf7fa273eeff'),
        ],
    ),
    'cnn': (
        ['sweep=smoke', 'data_root=data', 'dataset=cnn_dm', 'dataset.limit=2', 'seeds=[0]', 'method=block', 'method.gamma=3'],
        [
            ('ar', 'cnn_dm', 0, 'ee63c000b304'),
            ('block(gamma=3)', 'cnn_dm', 0, 'd4574b90ed7c'),
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
