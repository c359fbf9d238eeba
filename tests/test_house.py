"""The house rules that keep the code readable, checked so they stay true (docs/DESIGN.md section 8):
no module of pipeline/ or analysis/ over 550 lines, and DESIGN.md's layout names every module, and only
modules that exist. The layout names a family of modules once: ``<method>.py`` (``<drafter>.py``) under ``decoding/``
stands for every module that defines a registered method (drafter), ``<dataset>.py`` under ``data/`` for every module
a task spec names as its loader, so that a method, a drafter or a dataset added in its own module needs no line of
its own."""

from __future__ import annotations

import re

import pytest

from helpers.paths import REPO
from pipeline.data import task_names, task_spec
from pipeline.decoding import DRAFTERS, METHODS
from pipeline.registry import Registry

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


# A family's placeholder in the layout -> the modules it stands for (paths relative to the repository).
def _defining(registry: Registry) -> set[str]:
    """The repository's modules that define an entry of ``registry``."""
    modules = {registry[name].__module__ for name in registry.names()}
    return {f"{m.replace('.', '/')}.py" for m in modules if m.startswith("pipeline.")}


FAMILIES = {
    "pipeline/decoding/<method>.py": lambda: _defining(METHODS),
    "pipeline/decoding/<drafter>.py": lambda: _defining(DRAFTERS),
    "pipeline/data/<dataset>.py": lambda: {
        f"{task_spec(name).loader_module().__name__.replace('.', '/')}.py" for name in task_names()
    },
}


def _layout() -> set[str]:
    """The paths of DESIGN.md section 2's tree (two spaces of indentation per folder level), a family's placeholder
    (``<method>.py``) replaced by the modules it stands for."""
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
        if indent % 2 or level > len(stack) or not re.fullmatch(r"[\w.]+(/|\.py)|<\w+>\.py", token):
            continue  # a description's continuation line
        del stack[level:]
        if token.endswith("/"):
            stack.append(token.rstrip("/"))
            paths.add("/".join(stack))
        elif token.startswith("<"):
            family = "/".join([*stack, token])
            assert family in FAMILIES, f"docs/DESIGN.md section 2 names an unknown family {family}: {list(FAMILIES)}"
            paths |= FAMILIES[family]()
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
