"""The import graph of pipeline/ and analysis/ (built with ``ast``, nothing imported): no cycle, layers in order.

Data flows configuration -> plan -> cells -> engine -> measurement -> tracking -> analysis; in the
import graph that reads the other way round: the engine knows nothing of cells, cells nothing of the
sweep, the pipeline nothing of the analysis, and no module imports a command-line module. A module
may import modules of its own layer or of an earlier one in ``LAYERS``. Imports inside functions are
edges too (a lazy import still ties two modules together).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO

PACKAGES = ("pipeline", "analysis")

# Earliest first; a module belongs to the layer of its longest matching prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("pipeline", "pipeline.prompts", "pipeline.cell_types", "pipeline.formatting")),
    (
        "engine, models and data",
        (
            "pipeline.decoding",
            "pipeline.content_hash",
            "pipeline.models",
            "pipeline.gguf_cache",
            "pipeline.fingerprints",
            "pipeline.data",
        ),
    ),
    (
        "measurement",
        (
            "pipeline.device",
            "pipeline.measure",
            "pipeline.scoring",
        ),
    ),
    ("tracking", ("pipeline.tracking",)),
    ("cells", ("pipeline.cell", "pipeline.faults", "pipeline.isolation")),
    ("sweep, training and the bench", ("pipeline.sweep", "pipeline.training", "pipeline.bench")),
    ("analysis", ("analysis",)),
    (
        "commands",
        (
            "pipeline.sweep.__main__",
            "pipeline.generate",
            "pipeline.bench.__main__",
            "pipeline.distill",
            "pipeline.distill_speed",
            "pipeline.train_medusa",
            "pipeline.train_eagle",
            "pipeline.exact",
            "pipeline.docs_gen",
            "analysis.report",
        ),
    ),
]
COMMANDS = set(LAYERS[-1][1])


def module_files(root: Path = REPO) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _known(name: str, modules: set[str]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(_known(a.name, modules) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in modules else _known(base, modules))
        graph[module] = {t for t in targets if t and t != module}
    return graph


def layer_of(module: str) -> int:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    if rank is None:
        raise AssertionError(f"module {module} is in no layer: add it to LAYERS in tests/test_architecture.py")
    return rank


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path a -> ... -> a), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _package_edge(src: str, dst: str) -> bool:
    """``pkg/__init__.py`` re-exporting its submodules, or a submodule importing a sibling through the
    package: both are within one package, which the layer check covers."""
    return dst.startswith(src + ".") or src.startswith(dst + ".")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for src, dsts in graph.items():
        for dst in dsts:
            if dst in COMMANDS:
                out.append(f"{src} imports the command-line module {dst}")
            elif layer_of(dst) > layer_of(src) and not _package_edge(src, dst):
                out.append(
                    f"{src} ({LAYERS[layer_of(src)][0]}) imports {dst} ({LAYERS[layer_of(dst)][0]}), a later layer"
                )
    return sorted(out)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(module_files())


def test_the_graph_sees_the_known_edges(graph):
    assert "pipeline.decoding.kv" in graph["pipeline.measure.costs"]
    assert "pipeline.decoding.drafting" in graph["pipeline.decoding.drafters"]  # relative import
    assert "pipeline.sweep.plan" in graph["pipeline.sweep.driver"]
    assert "pipeline.tracking" in graph["analysis.runs"]
    assert "pipeline.decoding.base" in graph["pipeline.decoding.spd"]  # relative import


def test_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_layers_hold_and_no_command_line_module_is_a_library(graph):
    assert layer_violations(graph) == []


def test_every_module_has_a_layer(graph):
    for module in graph:
        layer_of(module)


def test_the_checks_can_fail():
    """The checks on synthetic graphs: a cycle, an upward import, a command used as a library."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    upward = {"pipeline.decoding.spd": {"pipeline.cell"}, "pipeline.cell": set()}
    assert layer_violations(upward) == [
        "pipeline.decoding.spd (engine, models and data) imports pipeline.cell (cells), a later layer"
    ]
    assert layer_violations({"pipeline.cell": {"pipeline.generate"}, "pipeline.generate": set()}) == [
        "pipeline.cell imports the command-line module pipeline.generate"
    ]


def test_a_cycle_written_to_disk_is_found(tmp_path):
    pkg = tmp_path / "pipeline"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "prompts.py").write_text("from pipeline.measure import x\n")
    (pkg / "measure.py").write_text("def f():\n    from . import prompts\n")
    (tmp_path / "analysis").mkdir()
    graph = import_graph(module_files(tmp_path))
    assert graph["pipeline.measure"] == {"pipeline.prompts"}
    assert find_cycle(graph) in (
        ["pipeline.measure", "pipeline.prompts", "pipeline.measure"],
        ["pipeline.prompts", "pipeline.measure", "pipeline.prompts"],
    )
    assert layer_violations(graph) == ["pipeline.prompts (base) imports pipeline.measure (measurement), a later layer"]


def test_the_gpu_tests_collect_without_ray_mlflow_or_gguf():
    """A GPU node with a CUDA PyTorch image and the offline kit (jobs/offline_gpu_kit.sh: hydra, zeus) but no
    Ray, MLflow or gguf can run the CUDA and energy tests: collecting them imports none of the three."""
    code = (
        "import sys\n"
        "for name in ('ray', 'mlflow', 'gguf'):\n"
        "    sys.modules[name] = None  # importing it raises ImportError\n"
        "import pytest\n"
        "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', "
        "'tests/test_decoding_cuda.py', 'tests/test_energy.py']))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
