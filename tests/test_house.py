"""The house rules that keep the code readable, checked so they stay true (docs/DESIGN.md section 8):
no module of pipeline/ or analysis/ over 550 lines, and DESIGN.md's layout names every module, and only
modules that exist."""

from __future__ import annotations

import re

import pytest

from helpers.paths import REPO

MAX_LINES = 550
PACKAGES = ("pipeline", "analysis")


def _modules() -> list[str]:
    return sorted(
        str(path.relative_to(REPO))
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if "__pycache__" not in path.parts
    )


@pytest.mark.parametrize("module", _modules())
def test_no_module_over_the_size_limit(module):
    lines = (REPO / module).read_text().count("\n")
    assert lines <= MAX_LINES, f"{module} has {lines} lines (> {MAX_LINES}): split it along a seam (docs/DESIGN.md)"


def _layout() -> set[str]:
    """The paths of DESIGN.md section 2's tree (two spaces of indentation per folder level)."""
    text = (REPO / "docs" / "DESIGN.md").read_text()
    section = text.split("## 2. Layout", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    stack: list[str] = []
    paths: set[str] = set()
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        token = line.split()[0]
        level = indent // 2
        if indent % 2 or level > len(stack) or not re.fullmatch(r"[\w.]+(/|\.py)", token):
            continue  # a description's continuation line
        del stack[level:]
        if token.endswith("/"):
            stack.append(token.rstrip("/"))
            paths.add("/".join(stack))
        else:
            paths.add("/".join([*stack, token]))
    return paths


def test_design_layout_names_every_module():
    layout = _layout()
    missing = [m for m in _modules() if m not in layout]
    assert not missing, f"docs/DESIGN.md section 2 does not name {missing}: add a line for each"


def test_design_layout_names_only_what_exists():
    stale = sorted(p for p in _layout() if not (REPO / p).exists())
    assert not stale, f"docs/DESIGN.md section 2 names {stale}, which do not exist: remove or rename them"


def test_the_tests_define_their_shared_names_once():
    """``REPO`` (and the other paths) and the kernels' ``needs_kernels`` live in tests/helpers (paths.py, marks.py):
    a test file that defines its own copy drifts from them (five copies of ``REPO``, four of ``needs_kernels``
    before issue 55)."""
    shared = re.compile(
        r"^\s*(REPO|REPO_ROOT|DATA_ROOT|needs_kernels|HAS_KERNELS)\s*(:[^=]*)?=|^\s*\w+\s*=\s*REPO / \"(conf|data)\"$",
        re.M,
    )
    homes = {"tests/helpers/paths.py", "tests/helpers/marks.py"}
    copies = {
        rel: shared.findall(path.read_text())
        for path in sorted((REPO / "tests").rglob("*.py"))
        if (rel := str(path.relative_to(REPO))) not in homes and "vendor" not in path.parts
    }
    assert not {k: v for k, v in copies.items() if v}, "import them from helpers.paths / helpers.marks instead"
