"""The docs as a reference: what they state about the code is checked against the code (issues 35, 45).

- The generated copies are current: ``python -m pipeline.docs_gen --check`` (what ``make docs`` writes:
  conf/method/*.yaml and the tables of docs/methods.md and docs/drafters.md) finds nothing to write, and names
  ``make docs`` when a copy drifts. The checks below read the generated tables independently of the generator.

- docs/methods.md's method table against the methods' declarations (``pipeline.decoding.METHODS``): every
  registered method has one row, and its module, draft shape, lossless and batchable flags, parameters with
  their defaults (beyond the warping parameters) and the drafter kinds it accepts are those the code declares;
  the warping defaults stated above the table are ``WARP_PARAMS``'.
- docs/drafters.md's drafter table against ``pipeline.decoding.DRAFTERS``: every kind, its scope's defaults.
- No docs page is a note "moved without rewriting", and every relative link of the README and docs/ names a
  file or folder that exists.
"""

from __future__ import annotations

import ast
import re
import shutil

import pytest
import yaml

from helpers.project import REPO
from pipeline import docs_gen
from pipeline.decoding import DRAFTERS, METHODS, check_method
from pipeline.decoding.base import WARP_PARAMS, DrafterContext

DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))

# a pair that offers every asset a drafter can read: what a method accepts is then its own declaration
EVERYTHING = DrafterContext(has_draft=True, has_eagle=True, default="model", eagle_version=1, has_medusa=True)
EVERYTHING3 = DrafterContext(has_draft=True, has_eagle=True, default="model", eagle_version=3, has_medusa=True)


def table(text: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the markdown table whose header row starts with ``| <first_header> |``, as header -> cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    header = [c.strip() for c in lines[start].strip().strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == len(header), f"a row of the {first_header!r} table has {len(cells)} cells: {line}"
        rows.append(dict(zip(header, cells)))
    return rows


def code_name(cell: str) -> str:
    match = re.fullmatch(r"`([^`]+)`", cell)
    assert match, f"expected one `name`, got {cell!r}"
    return match.group(1)


def parameters(cell: str) -> dict[str, object]:
    """``\\`gamma\\` 3, \\`k_config\\` [4, 2, 2], \\`drafter\\` pair`` -> {gamma: 3, k_config: [4, 2, 2],
    drafter: 'pair'}."""
    if cell in ("–", "-", ""):
        return {}
    found = re.findall(r"`(\w+)` (\[[^\]]*\]|[^,]+)", cell)
    assert found, f"no `name` default pairs in {cell!r}"
    return {name: yaml.safe_load(value.strip()) for name, value in found}


def kinds(cell: str) -> set[str]:
    return set() if cell in ("–", "-", "") else {k.strip() for k in cell.split(",")}


def accepted_drafters(method: str) -> set[str]:
    """The drafter kinds ``method`` takes, asked of the code with a pair that offers everything."""
    if "drafter" not in METHODS[method].all_params():
        return set()
    taken = set()
    for kind in DRAFTERS:
        try:
            check_method(method, {"drafter": kind}, drafters=EVERYTHING3 if kind == "eagle3" else EVERYTHING)
        except ValueError:
            continue
        taken.add(kind)
    return taken


METHODS_MD = (DOCS / "methods.md").read_text()
METHOD_ROWS = {code_name(r["method"]): r for r in table(METHODS_MD, "method")}


def test_methods_md_has_one_row_per_registered_method():
    assert sorted(METHOD_ROWS) == sorted(METHODS.names())


def test_methods_md_states_the_warping_defaults_every_method_takes():
    stated = dict(re.findall(r"`(temperature|top_k|top_p)`\s+([0-9.]+) \(", METHODS_MD))
    assert {k: float(v) for k, v in stated.items()} == {k: float(p.default) for k, p in WARP_PARAMS.items()}


@pytest.mark.parametrize("method", METHODS.names())
def test_methods_md_row_matches_the_declaration(method):
    row, cls = METHOD_ROWS[method], METHODS[method]
    module = "pipeline/" + code_name(row["module"]).removesuffix(".py")
    assert module.replace("/", ".") == cls.__module__, f"{method}: the table names {row['module']}"
    assert row["shape"] == cls.draft_shape
    assert row["lossless"] == ("yes" if cls.lossless else "no")
    assert row["batchable"] == ("yes" if cls.loop != "own" else "no")
    declared = {name: p.default for name, p in cls.params.items()}
    assert parameters(row["parameters (default)"]) == declared, f"{method}: the table's parameters or defaults"
    assert kinds(row["drafters"]) == accepted_drafters(method), f"{method}: the drafters it accepts"


def test_drafters_md_table_matches_the_registered_drafters():
    rows = {code_name(r["drafter"]): r for r in table((DOCS / "drafters.md").read_text(), "drafter")}
    assert sorted(rows) == sorted(DRAFTERS.names())
    for kind, cls in DRAFTERS.items():
        declared = {name: p.default for name, p in cls.params.items()}
        assert parameters(rows[kind]["scope (default)"]) == declared, f"drafter {kind}: its scope's defaults"


def test_make_docs_changes_nothing(capsys):
    assert docs_gen.main(["--check"]) == 0, capsys.readouterr().out


def test_a_drifted_copy_fails_the_check_naming_make_docs(tmp_path, capsys):
    for sub in ("conf/method", "docs"):
        shutil.copytree(REPO / sub, tmp_path / sub)
    spd = tmp_path / "conf" / "method" / "spd.yaml"
    spd.write_text(spd.read_text().replace("gamma: 3 ", "gamma: 5 "))
    page = tmp_path / "docs" / "methods.md"
    page.write_text(page.read_text().replace("| `block` |", "| `blocks` |"))
    assert docs_gen.main(["--check", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "-gamma: 5" in out and "+gamma: 3" in out and "+| `block` |" in out and "run `make docs`" in out
    assert docs_gen.main(["--root", str(tmp_path)]) == 0  # the generator mends both
    assert docs_gen.main(["--check", "--root", str(tmp_path)]) == 0
    assert spd.read_text() == (REPO / "conf" / "method" / "spd.yaml").read_text()


def test_a_page_without_its_generated_region_is_refused_naming_the_markers(tmp_path, capsys):
    for sub in ("conf/method", "docs"):
        shutil.copytree(REPO / sub, tmp_path / sub)
    page = tmp_path / "docs" / "drafters.md"
    page.write_text(page.read_text().replace(docs_gen.END, ""))
    assert docs_gen.main(["--check", "--root", str(tmp_path)]) == 2
    assert "needs one generated region" in capsys.readouterr().err


def test_no_docs_page_is_a_note_moved_without_rewriting():
    for page in [REPO / "README.md", *PAGES]:
        assert "without rewriting" not in page.read_text(), f"{page.name} still says it was moved without rewriting"


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", [REPO / "README.md", *PAGES], ids=lambda p: p.name)
def test_relative_links_name_files_that_exist(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s):, mailto:
            continue
        assert (page.parent / target).exists(), f"{page.name} links {target}, which does not exist"


@pytest.mark.parametrize(
    "value",
    [
        ["a,b", "c"],  # issue 57: written [a,b, c], read back as three elements
        {"k:x": "v", "a": ["x]", "{y}"]},
        ["null", "true", "1"],
        {"x": {"y": "z,w"}},
        [4, 2, 2],
        {"kind": "eagle3", "path": "models/x"},
        float("inf"),
    ],
)
def test_yaml_value_reads_back_as_the_default(value):
    assert yaml.safe_load(docs_gen.yaml_value(value)) == value


# Names the code no longer has (renamed or removed): the docs and the docstrings must not send a reader to them. A
# name retired by a change joins this list in that change (issue 55: the docs drifted from the code's names).
RETIRED = (
    "DraftTree",
    "EagleTypicalTree",
    "attach_medusa_heads",
    "can_draft_chain",
    "chain_proposal",
    "check_medusa_combination",
    "commit_draft",
    "dataset_module",
    "draft_chain_sparse",
    "eagle_head_of",
    "eagle_step_time",
    "exact_rows",
    "has_chain_loop",
    "load_token_map",
    "medusa_heads_of",
    "ngram_step_time",
    "run_window_batched",
    "step_costs",
    "transformers_rows",
    "tree_generate",
    "warm_up_batched",
    # issue 55: the contract's capabilities and protocols replaced the probes and the per-question helpers
    "shape_of",
    "shape_for",
    "depth_of",
    "lossless_of",
    "drafter_of",
    "walk_for",
    "has_loop",
    "plain_loop",
    # issue 53: costs are read off the loop's own clock, never timed beside it
    "chain_draft_cost",
    "proposal_cost",
    "drafter_costs",
    "calibrate_draft_length",
    "calibrate_pair",
    "beam_drafts",
)
OUR_PAGES = [REPO / "README.md", REPO / "jobs" / "README.md", *(p for p in PAGES if p.name != "ALGORITHMS.md")]


def _docstrings() -> dict[str, str]:
    """Every docstring of pipeline/ and analysis/ (modules, classes, functions), by ``<module>:<name>``."""
    out = {}
    for package in ("pipeline", "analysis"):
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc:
                        out[f"{path.relative_to(REPO)}:{getattr(node, 'name', '')}"] = doc
    return out


def _defined() -> set[str]:
    """Every name a module of pipeline/ or analysis/ defines (functions, classes, assignments)."""
    names = set()
    for package in ("pipeline", "analysis"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
    return names


def test_no_page_or_docstring_names_a_retired_symbol():
    """README.md, jobs/README.md, docs/*.md (ALGORITHMS.md cites other projects' code, so it is left out) and every
    docstring of the code name none of ``RETIRED``, and the code defines none of them (a name back in use leaves the
    list)."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, RETIRED)) + r")\b")
    texts = {str(p.relative_to(REPO)): p.read_text() for p in OUR_PAGES} | _docstrings()
    found = {where: sorted(set(pattern.findall(text))) for where, text in texts.items() if pattern.search(text)}
    assert not found, f"retired names in the docs or docstrings (name what the code has now): {found}"
    assert not set(RETIRED) & _defined(), "a retired name is defined again: remove it from RETIRED"
