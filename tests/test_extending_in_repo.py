"""A chain rule added inside the repository costs three hand-written files; `make docs` writes the rest (issue 45).

In a scratch copy of the repository (pipeline/, conf/, docs/, analysis/, tests/, the Makefile), the test writes the
rule's module (``pipeline/decoding/capped.py``), its registration (two lines added to
``pipeline/decoding/__init__.py``) and its test (``tests/test_decoding_capped.py``), runs the generator
(``python -m pipeline.docs_gen``, what ``make docs`` runs) and then, in a fresh interpreter on the copy, checks
that the sweep plan accepts ``sweep.methods=[capped]`` through the generated ``conf/method/capped.yaml``, that the
exact calculator lists the rule (lossless: total variation 0), that the analysis knows its parameter, and that
the rule's own test passes. Every file of the copy that differs from the repository is one of the three
hand-written ones or one the generator wrote, and the generator's check mode finds nothing left to write.

Then it runs, in the copy, every test file that a new rule (or drafter, dataset, scorer) can break (``SUITE``: the
house rules with DESIGN.md's layout, the shipped sweeps and their pinned cell keys, the datasets, the docs, the
guard on lists of registered names): the three files are the whole cost only if that suite passes untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.paths import REPO

RULE = '''\
"""capped: token verification of at most ``cap`` drafts (a shorter chain is still a chain: lossless)."""

from .base import Param, int_at_least
from .exact import token_cases
from .rules import ChainRule
from .speculative import DraftVerifyDecoder
from .verification import token_verify


def capped_token_rule(P, Q, x, u, *, cap):
    m = min(cap, x.shape[0])
    return token_verify(P[: m + 1], Q[:m], x[:m], u[:m])


def capped_cases(P, Q, x, cap=2):
    m = min(cap, x.shape[0])
    yield from token_cases(P[: m + 1], Q[:m], x[:m])


class CappedToken(DraftVerifyDecoder):
    name = "capped"
    lossless = True
    rule = ChainRule(capped_token_rule, params=("cap",), exact=capped_cases)
    params = {**DraftVerifyDecoder.params, "cap": Param(2, int_at_least(1), "drafts verified at most")}
'''

REGISTRATION = """
from .capped import CappedToken  # noqa: E402

METHODS.register(CappedToken)
"""

RULE_TEST = '''\
"""capped: greedy identity with ar, and its exact law is the target's (lossless)."""

from helpers.models import tiny_llama
from pipeline.decoding import build_decoder
from pipeline.decoding.exact import Pair, evaluate


def test_capped_is_greedy_ar_at_temperature_0():
    target, draft = tiny_llama(0, vocab=32, layers=2), tiny_llama(1, vocab=32, layers=1)
    prompt = [3, 5, 7]
    capped = build_decoder("capped", target, draft, temperature=0, gamma=4, cap=2)
    gen = capped.generate(prompt, max_new_tokens=12)
    assert gen.tokens == build_decoder("ar", target, temperature=0).generate(prompt, max_new_tokens=12).tokens
    assert max(gen.drafted) <= 4 and max(gen.accepted) <= 3  # at most cap drafts kept, plus the bonus


def test_capped_is_lossless_exactly():
    pair = Pair(lambda s: [0.2, 0.5, 0.3], lambda s: [0.6, 0.1, 0.3], vocab=3)
    out = evaluate("capped", pair, gamma=3)
    assert out.distance < 1e-12 and max(out.accepted_law) == 2
'''

CHECKS = """
import contextlib, io, json, sys
from pathlib import Path
from pipeline import docs_gen, exact, sweep
from analysis import schema

root = Path.cwd()
out = {"check": docs_gen.main(["--check"])}
plan = sweep.expand(sweep.compose(["sweep=smoke", "sweep.methods=[capped]", "sweep.baseline=null"]), root)
out["cells"] = sorted({(c.method, c.params["cap"], c.params["gamma"]) for c in plan.cells})
text = io.StringIO()
with contextlib.redirect_stdout(text):
    exact.main(["--p", "1/3,2/3", "--q", "2/3,1/3", "--gamma", "2"])
rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.getvalue().splitlines()]
out["exact"] = {cells[0]: cells[1:] for cells in rows if cells[0] in ("capped", "spd")}
out["analysis"] = [schema.PARAMS.get("cap"), "cap" in schema.ABLATION_PARAMS, "capped" in schema.METHOD_ORDER]
print(json.dumps(out))
"""

# The test files an in-repo extension can break without touching them; they run in the copy with the new rule.
SUITE = (
    "tests/test_house.py",
    "tests/test_sweep_config.py",
    "tests/test_cell_keys.py",
    "tests/test_data_datasets.py",
    "tests/test_docs.py",
    "tests/test_decoding_rules.py",
)

COPIED = (
    "pipeline",
    "conf",
    "docs",
    "analysis",
    "tests",
    "Makefile",
    "pyproject.toml",
    "README.md",
    "requirements.lock",
)
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "build")


def snapshot(root: Path) -> dict[str, bytes]:
    files = {}
    for top in COPIED:
        base = root / top
        paths = (
            [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        )
        files.update({str(p.relative_to(root)): p.read_bytes() for p in paths})
    return files


def run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_a_chain_rule_in_the_repository_needs_three_hand_written_files(tmp_path):
    copy = tmp_path / "repo"
    copy.mkdir()
    for top in COPIED:
        src = REPO / top
        if src.is_dir():
            shutil.copytree(src, copy / top, ignore=SKIP)
        else:
            shutil.copy2(src, copy / top)
    for linked in (
        "data",
        "models",
        "benchmarks",
        "jobs",
        "reports",
        ".ci",
    ):  # read-only: the plan's inputs, the docs' links
        if (REPO / linked).exists():
            (copy / linked).symlink_to((REPO / linked).resolve(), target_is_directory=True)
    before = snapshot(copy)

    # the three hand-written files
    (copy / "pipeline" / "decoding" / "capped.py").write_text(RULE)
    init = copy / "pipeline" / "decoding" / "__init__.py"
    init.write_text(init.read_text() + REGISTRATION)
    (copy / "tests" / "test_decoding_capped.py").write_text(RULE_TEST)
    hand_written = {"pipeline/decoding/capped.py", "pipeline/decoding/__init__.py", "tests/test_decoding_capped.py"}

    generated = run(["-m", "pipeline.docs_gen"], copy)
    assert generated.returncode == 0, generated.stderr
    wrote = {line.removeprefix("wrote ") for line in generated.stdout.splitlines() if line.startswith("wrote ")}
    assert wrote == {"conf/method/capped.yaml", "docs/methods.md"}, generated.stdout

    after = snapshot(copy)
    changed = {p for p in after if before.get(p) != after[p]} | (set(before) - set(after))
    assert changed == hand_written | wrote, "files beyond the three hand-written ones and the generated ones"
    assert "`capped` | `decoding/capped.py`" in (copy / "docs" / "methods.md").read_text()
    assert "cap: 2" in (copy / "conf" / "method" / "capped.yaml").read_text()

    checks = run(["-c", CHECKS], copy)
    assert checks.returncode == 0, checks.stderr[-3000:]
    found = json.loads(checks.stdout.strip().splitlines()[-1])
    assert found["check"] == 0  # nothing left for `make docs` to write
    assert found["cells"] and {tuple(c[:2]) for c in found["cells"]} == {("capped", 2)}  # planned from the YAML
    # the exact calculator lists the rule: claimed lossless, total variation 0, and at gamma 2 <= cap it is spd
    assert found["exact"]["capped"] == found["exact"]["spd"] and found["exact"]["capped"][3] == "0", found["exact"]
    assert found["analysis"] == ["method.cap", True, True]

    own_test = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "tests/test_decoding_capped.py"], copy)
    assert own_test.returncode == 0, own_test.stdout[-3000:]
    assert "2 passed" in own_test.stdout

    # the full suite's files that the rule could break, untouched, pass with it (the new sweep includes it: "*")
    suite = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *SUITE], copy, timeout=900)
    assert suite.returncode == 0, suite.stdout[-4000:]
