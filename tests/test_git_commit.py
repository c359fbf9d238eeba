"""The commit a record carries (tag ``git_commit``) is the project's own, never an enclosing repository's (issue 46:
a project folder copied without ``.git`` into another repository recorded that repository's commit)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from helpers.paths import REPO
from pipeline.device import UNKNOWN_COMMIT, git_commit


def _git(cwd, *args: str) -> str:
    env_args = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    out = subprocess.run(["git", *env_args, *args], cwd=cwd, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _commit_seen_by(project) -> str:
    """git_commit() as the copied project's own pipeline/device.py computes it."""
    code = "from pipeline.device import git_commit; print(git_commit())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_in_the_checkout_it_is_head():
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    assert git_commit() == _git(REPO, "rev-parse", "HEAD")


def test_a_copy_inside_another_repository_records_unknown(tmp_path):
    outer = tmp_path / "other-repo"
    project = outer / "copied" / "project"
    shutil.copytree(REPO / "pipeline", project / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", project / "pyproject.toml")
    _git(outer, "init", "-q")
    (outer / "README").write_text("another project\n")
    _git(outer, "add", "README")
    _git(outer, "commit", "-qm", "unrelated")
    assert _git(project, "rev-parse", "HEAD")  # git itself finds the enclosing repository from the copy
    assert _commit_seen_by(project) == UNKNOWN_COMMIT
    # the copy made a repository of its own: its commit is the project's
    _git(project, "init", "-q")
    _git(project, "add", "pyproject.toml")
    _git(project, "commit", "-qm", "own")
    assert _commit_seen_by(project) == _git(project, "rev-parse", "HEAD")
