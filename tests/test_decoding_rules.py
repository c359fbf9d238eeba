"""What a method declares is what the loops run: every registered chain rule's fast path equals its dense rule,
every declared walk is one its drafters can feed, and the registry refuses a taken name.

The dense rule is the reference (``pipeline/decoding/rules.py``); a sparse path attached to a rule must give the
same accepted count and the same next-token law on random top-k rows, so a new rule is correct with its dense
form alone and a fast path is checked here without a test of its own.
"""

from __future__ import annotations

import ast
import re

import pytest
import torch

from helpers.paths import REPO
from pipeline.decoding import DRAFTERS, METHODS, check_method, method_class
from pipeline.decoding.rules import ChainRule
from pipeline.decoding.speculative import DraftVerifyDecoder
from pipeline.decoding.warping import Warper, make_generator, sample, warp
from pipeline.registry import Registry, RegistryError

RULED = sorted(name for name, cls in METHODS.items() if getattr(cls, "rule", None) is not None)
SPARSE = [name for name in RULED if METHODS[name].rule.sparse is not None]


def _params(rule: ChainRule, name: str) -> dict:
    defaults = {k: p.default for k, p in method_class(name).all_params().items()}
    return {k: defaults[k] for k in rule.params}


def test_the_chain_methods_declare_their_rules_and_the_fast_ones_a_sparse_path():
    assert {"spd", "block", "mtad", "typical"} <= set(RULED)
    assert {"spd", "block", "mtad"} <= set(SPARSE)


@pytest.mark.parametrize("name", SPARSE)
def test_every_sparse_path_follows_its_dense_rule(name):
    """Same accepted count and the same next-token law as the rule's dense form on random top-k rows (drafts from
    Q, some outside P's support: rejections, residuals and bonus rows all occur), with the method's defaults."""
    rule = METHODS[name].rule
    params = _params(rule, name)
    vocab, k, g = 300, 10, 3
    warper = Warper(temperature=1.0, top_k=k, top_p=0.9)
    outcomes = set()
    for seed in range(150):
        gen = torch.Generator().manual_seed(seed)
        logits = torch.randn(g + 1, vocab, generator=gen) * 3
        P = warp(logits, 1.0, k, 0.9)
        Q = warp(logits[:g] + torch.randn(g, vocab, generator=gen) * 2.0, 1.0, k, 0.9)
        x = torch.stack([sample(Q[i], make_generator(seed * 10 + i)) for i in range(g)])
        draft = {"rows": Q, "log_q": torch.log(Q[torch.arange(g), x]), "none": None}[rule.draft]
        u = torch.rand(g, generator=gen) if rule.coins else None
        n, out = rule.dense(P, draft, x, u, **params)
        n_s, index, weights = rule.sparse(*warper.top_k_rows(logits), draft, x, u, **params)
        assert int(n) == int(n_s), seed
        dense_law = out if out.dim() else torch.nn.functional.one_hot(out, vocab).float()
        assert torch.allclose(
            torch.zeros(vocab).scatter_(-1, index, weights / weights.sum()), dense_law / dense_law.sum(), atol=1e-6
        )
        outcomes.add(int(n))
    assert len(outcomes) > 1


@pytest.mark.parametrize(
    "name", sorted(n for n, c in METHODS.items() if issubclass(c, DraftVerifyDecoder) and "drafter" in c.params)
)
def test_each_method_takes_exactly_the_drafters_its_shape_and_walk_allow(name):
    """Which drafter a method takes follows from the declared capabilities alone (no list of kinds anywhere)."""
    cls = METHODS[name]
    defaults = {k: p.default for k, p in cls.all_params().items()}
    for kind, drafter in DRAFTERS.items():
        why = cls.accepts(drafter, defaults)
        caps = cls.capabilities_of(defaults, drafter)  # the method's capabilities over this drafter
        shape = caps.draft_shape
        fits = shape in drafter.shapes and (shape == "chain" or caps.walk.children in drafter.tree_children)
        if name == "bild":
            fits = kind == "model"
        assert (why is None) == fits, (name, kind, why)
        if why is not None:
            with pytest.raises(ValueError, match=f"cannot use drafter: {kind}"):
                check_method(name, {"drafter": kind})


def test_tree_typical_acceptance_is_one_walk_over_any_tree_drafter():
    for kind in ("model", "medusa"):
        values = check_method("typical", {"drafter": kind, "tree": True})
        assert values["drafter"]["kind"] == kind
    caps = METHODS["typical"].capabilities_of(check_method("typical", {"drafter": "medusa"}))
    assert caps.draft_shape == caps.loop == "tree"
    with pytest.raises(ValueError, match="drafter ngram makes chain proposals; this method verifies a tree"):
        check_method("typical", {"drafter": "ngram", "tree": True})


def test_a_taken_name_is_an_error_and_module_attr_names_resolve():
    reg: Registry = Registry("thing", name_of=lambda e: e["name"])
    first = {"name": "a"}
    reg.register(first)
    reg.register(first)  # the same entry again is harmless
    with pytest.raises(RegistryError, match="thing name 'a' is taken"):
        reg.register({"name": "a"})
    with pytest.raises(RegistryError, match=r"unknown thing 'b'; valid things: the registered things \['a'\]"):
        reg.get("b")
    assert reg.get("pipeline.decoding.spd:SpeculativeDecoder") is METHODS["spd"]
    with pytest.raises(RegistryError, match="relative module"):
        reg.get(".spd:SpeculativeDecoder")
    with pytest.raises(RegistryError, match="cannot be imported"):
        reg.get("no_such_module_here:Thing")
    with pytest.raises(RegistryError, match="method name 'spd' is taken"):
        METHODS.register(type("Other", (METHODS["spd"],), {"name": "spd"}))
    with pytest.raises(RegistryError, match="not a Decoder subclass"):
        method_class("pipeline.decoding.verification:token_verify")


@pytest.mark.parametrize("name", ["../../../tmp/evil", "a/b", "..", ".hidden", "x y", "a:b", "", "-x", "a\\b"])
def test_a_path_like_name_is_refused(name):
    """Issue 57: a registered name becomes a file name (docs_gen writes conf/method/<name>.yaml): a name with a
    path in it wrote outside conf/method."""
    reg: Registry = Registry("thing", name_of=lambda e: e["name"])
    with pytest.raises(RegistryError, match="needs a plain name to be registered"):
        reg.register({"name": name})
    assert reg.register({"name": "my_rule-2"})["name"] == "my_rule-2"


def _literal_strings(node: ast.AST) -> list[str]:
    """The string elements of a tuple / list / set literal, the string keys of a dict literal, or the string
    positional arguments of a call (``one_of("a", "b")``; ``frozenset({...})`` is its inner set); a literal of rows
    (``(("eagle", eagle), ("medusa", medusa))``) gives its rows' strings; [] for anything else."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        elts = list(node.elts)
    elif isinstance(node, ast.Dict):
        elts = [k for k in node.keys if k is not None]
    elif isinstance(node, ast.Call):
        elts = list(node.args)
    else:
        return []
    rows = [r for e in elts if isinstance(e, (ast.Tuple, ast.List)) for r in e.elts]  # one level: a table's rows
    return [e.value for e in elts + rows if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def hand_lists(source: str, registries: dict[str, set[str]]) -> list[tuple[int, str, str, list[str]]]:
    """Every literal of ``source`` that names two or more entries of one registry, wherever it is written (module
    level, class bodies, function bodies, default arguments, call arguments): (line, where: the enclosing
    ``def`` / ``class`` path or ``<module>``, registry, the names). One registered name in a literal is a word that
    happens to match (a config key ``model``, Spec-Bench's category ``mt_bench``); two or more are a list kept
    beside the registry."""
    found = []

    def visit(node: ast.AST, where: str) -> None:
        for kind, names in registries.items():
            hit = sorted({s for s in _literal_strings(node) if s in names})
            if len(hit) >= 2:
                found.append((getattr(node, "lineno", 0), where, kind, hit))
        for child in ast.iter_child_nodes(node):
            scoped = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            visit(child, (child.name if where == "<module>" else f"{where}.{child.name}") if scoped else where)

    visit(ast.parse(source), "<module>")
    return sorted(found)


def _registries() -> dict[str, set[str]]:
    from pipeline.scoring.registry import SCORERS  # noqa: PLC0415 - the scorers register on import

    return {"method": set(METHODS), "drafter": set(DRAFTERS), "scorer": set(SCORERS)}


def test_no_module_keeps_a_list_of_registered_names_beside_the_registries():
    """Capabilities and rows come from what methods, drafters and scorers declare (issue 45): no module of the
    pipeline or the analysis holds a literal of their names anywhere (module level, class or function body,
    default or call argument), except the registry itself."""
    root = REPO
    registries = _registries()
    found = {
        p.relative_to(root).as_posix(): hits
        for d in ("pipeline", "analysis")
        for p in sorted((root / d).rglob("*.py"))
        if p != root / "pipeline" / "registry.py"
        for hits in [hand_lists(p.read_text(), registries)]
        if hits
    }
    assert not found, found
    text = "\n".join(p.read_text() for d in ("pipeline", "analysis") for p in (root / d).rglob("*.py"))
    assert len(re.findall(r"^\s*def draft_chain\(", text, re.M)) == 1


def test_the_hand_list_check_can_fail():
    """The check finds the lists it forbids in every literal form and every place one can be written (module
    level, class body, function body, default argument, call argument, a comparison), and lets single words
    pass."""
    registries = _registries()
    source = (
        'CHAIN = ("spd", "block")\n'
        'KINDS: frozenset[str] = frozenset({"model", "ngram"})\n'
        'LOSSLESS = {"spd": True, "hsd": True}\n'
        'SCORES = ["humaneval", "spider"]\n'
        'KEYS = ("model", "api_base")\n'
        "def f(methods=('ar', 'spd')):\n"
        "    for label in ('hsd', 'block'):\n"
        "        g(label, one_of('mcss', 'traversal'), pick=['rouge', 'spider'])\n"
        "    return label in {'eagle', 'eagle3'} or label == 'spd'\n"
        "class C:\n"
        "    OWN = ('medusa', 'ngram')\n"
        "    def m(self):\n"
        "        return ['typical', 'mtad']\n"
        "ROWS = (('eagle', 1), ('medusa', 2))\n"
        "PAIRS = [('model', 'a'), ('x', 'y')]\n"
    )
    got = [(line, where, kind) for line, where, kind, _ in hand_lists(source, registries)]
    assert got == [
        (1, "<module>", "method"),
        (2, "<module>", "drafter"),
        (3, "<module>", "method"),
        (4, "<module>", "scorer"),
        (6, "f", "method"),
        (7, "f", "method"),
        (8, "f", "method"),
        (8, "f", "scorer"),
        (9, "f", "drafter"),
        (11, "C", "drafter"),
        (13, "C.m", "method"),
        (14, "<module>", "drafter"),
    ]
