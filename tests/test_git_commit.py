"""The commit a record carries (tag ``git_commit``) is the project's own, never an enclosing repository's (issue 46:
a project folder copied without ``.git`` into another repository recorded that repository's commit), and never a
clean HEAD for code that is not HEAD's (issue 57: a copy at the root of another repository, a tree changed after
HEAD); ``code_hash`` names the code in every case."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from helpers.paths import REPO
from pipeline.device import DIRTY_SUFFIX, UNKNOWN_COMMIT, code_hash, git_commit


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


def test_in_the_checkout_it_is_head_or_head_dirty():
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    head = _git(REPO, "rev-parse", "HEAD")
    assert git_commit() in (head, head + DIRTY_SUFFIX)


def _copy_project(project) -> None:
    shutil.copytree(REPO / "pipeline", project / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", project / "pyproject.toml")


def _commit_all(project, message: str) -> str:
    _git(project, "add", "-A")
    _git(project, "commit", "-qm", message)
    return _git(project, "rev-parse", "HEAD")


def test_a_copy_inside_another_repository_records_unknown(tmp_path):
    outer = tmp_path / "other-repo"
    project = outer / "copied" / "project"
    _copy_project(project)
    _git(outer, "init", "-q")
    (outer / "README").write_text("another project\n")
    _git(outer, "add", "README")
    _git(outer, "commit", "-qm", "unrelated")
    assert _git(project, "rev-parse", "HEAD")  # git itself finds the enclosing repository from the copy
    assert _commit_seen_by(project) == UNKNOWN_COMMIT
    # the copy made a repository of its own: its commit is the project's
    _git(project, "init", "-q")
    head = _commit_all(project, "own")
    assert _commit_seen_by(project) == head


def test_a_copy_at_the_root_of_another_repository_records_unknown(tmp_path):
    """git's top level is the project root, but HEAD is another project's commit (it tracks none of these files)."""
    project = tmp_path / "other-repo"
    project.mkdir()
    _git(project, "init", "-q")
    (project / "README").write_text("another project\n")
    _git(project, "add", "README")
    _git(project, "commit", "-qm", "unrelated")
    _copy_project(project)
    assert _commit_seen_by(project) == UNKNOWN_COMMIT


def test_a_tree_changed_after_head_is_marked_dirty_and_the_code_hash_names_it(tmp_path):
    project = tmp_path / "project"
    _copy_project(project)
    _git(project, "init", "-q")
    head = _commit_all(project, "own")
    clean_hash = code_hash(project)
    assert _commit_seen_by(project) == head
    # an edit of a tracked file after HEAD (a device copy of a working tree)
    (project / "pipeline" / "device.py").write_text((project / "pipeline" / "device.py").read_text() + "\n# edit\n")
    assert _commit_seen_by(project) == head + DIRTY_SUFFIX
    assert code_hash(project) != clean_hash
    _git(project, "checkout", "--", "pipeline/device.py")
    assert _commit_seen_by(project) == head and code_hash(project) == clean_hash
    # a new module under pipeline/ that git does not track is code HEAD does not hold
    (project / "pipeline" / "extra.py").write_text("X = 1\n")
    assert _commit_seen_by(project) == head + DIRTY_SUFFIX
    assert code_hash(project) != clean_hash
    # a tracked file outside pipeline/ changed (pyproject.toml: dependencies, entry points)
    (project / "pipeline" / "extra.py").unlink()
    (project / "pyproject.toml").write_text((project / "pyproject.toml").read_text() + "\n")
    assert _commit_seen_by(project) == head + DIRTY_SUFFIX
