"""The exact calculator (``pipeline.decoding.exact``): every lossless rule's output law equals the target's
exactly, the orderings the papers prove hold in expectation, Block Verification's toy example, the published
HSD form's exact distance, HSD's README figures against every counting, and ``python -m pipeline.exact``."""

from __future__ import annotations

import itertools

import pytest
import torch

from pipeline import exact as exact_cli
from pipeline.decoding.exact import (
    Pair,
    as_fraction,
    chain_cases,
    chain_rules,
    coin_cases,
    draft_trees,
    evaluate,
    prefix_bound,
    sequence_law,
    uniform_cases,
    walk_cases,
)

TOY = Pair.context_free([1 / 3, 2 / 3], [2 / 3, 1 / 3])  # Block Verification's example; HSD's README toy
A, B = 0, 1
EXACT = 1e-12


def close(x: float, y: float) -> bool:
    return abs(x - y) < EXACT


def test_block_verifications_toy_example():
    """Sun et al. (Block Verification), p(A) = 1/3, q(A) = 2/3, gamma 2: token verification 10/9 expected accepted
    drafts, block verification 11/9, and 12/9 = sum_k (1 - TV(P_k, Q_k)), the bound no lossless rule passes."""
    token, block, hsd = (evaluate(r, TOY, gamma=2) for r in ("spd", "block", "hsd"))
    assert close(token.accepted, 10 / 9) and close(block.accepted, 11 / 9) and close(token.bound, 12 / 9)
    assert close(hsd.accepted, 11 / 9) and as_fraction(block.tokens) == "20/9"
    assert token.distance < EXACT and block.distance < EXACT and hsd.distance < EXACT


def test_the_published_hsd_form_is_lossy_by_exactly_this_much():
    """hsd_ref accepts the whole draft with min(1, P(x)/Q(x)): at gamma 2 on the toy it emits BA first with
    probability 1/3 where the target's is 2/9, its output law is 1/9 from the target's in total variation, and its
    4/3 expected accepted drafts sit on the bound. At gamma 1 the cap changes nothing: it is exact there."""
    ref = evaluate("hsd_ref", TOY, gamma=2)
    first_two = {s: sum(pr for t, pr in ref.law.items() if t[:2] == s) for s in itertools.product((A, B), repeat=2)}
    assert close(first_two[(B, A)], 1 / 3) and close(sequence_law(TOY, 2)[(B, A)], 2 / 9)
    assert close(ref.distance, 1 / 9) and close(ref.accepted, 4 / 3) and close(ref.accepted, ref.bound)
    assert {k: as_fraction(v) for k, v in ref.accepted_law.items()} == {0: "1/3", 2: "2/3"}
    assert evaluate("hsd_ref", TOY, gamma=1).distance < EXACT
    assert as_fraction(evaluate("hsd_ref", TOY, gamma=3).distance) == "5/81"
    distances = [evaluate("hsd_ref", Pair.random(3, seed), gamma=3).distance for seed in range(3)]
    assert sum(d > 1e-3 for d in distances) >= 2, distances  # on random families too (not on every one)


CHAIN_CASES = [(3, 3), (4, 3), (6, 2)]  # (vocabulary, gamma)
TREE_CASES = {
    "specinfer": [(4, [2, 1]), (3, [2, 1, 1])],
    "mcss": [(4, [3, 2]), (3, [2, 1, 1])],
    "traversal": [(4, [3, 2]), (3, [2, 1, 1]), (3, [2, 2]), (5, [2, 1])],
    "spectr": [(3, [2, 1])],
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rule", ["spd", "block", "hsd", "mtad"])
def test_lossless_chain_rules_reproduce_the_target_exactly(rule, seed):
    """Random prefix-dependent p and q (a quarter of the entries 0), vocabularies up to 6, drafts up to 3 deep
    (MTAD at tau = 1: plain sampling)."""
    for vocab, gamma in CHAIN_CASES:
        out = evaluate(rule, Pair.random(vocab, seed), gamma=gamma, tau=1.0)
        assert out.distance < 1e-12, (rule, vocab, gamma, out.distance)
        assert abs(sum(out.law.values()) - 1) < 1e-12


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rule", sorted(TREE_CASES))
def test_lossless_tree_rules_reproduce_the_target_exactly(rule, seed):
    for vocab, k_config in TREE_CASES[rule][: 1 if rule == "spectr" and seed else None]:
        out = evaluate(rule, Pair.random(vocab, seed), k_config=k_config)
        assert out.distance < 1e-12, (rule, vocab, k_config, out.distance)


def test_hsd_is_block_verification_draft_by_draft():
    """With the cap on the whole draft, HSD's step-back walk draws block verification's (n, next-token) law for
    every single draft, not just on average."""
    for seed in range(4):
        pair, gamma = Pair.random(3, seed), 3
        for x in itertools.product(range(3), repeat=gamma):
            Q = torch.stack([pair.draft(x[:i]) for i in range(gamma)])
            if any(Q[i, t] == 0 for i, t in enumerate(x)):
                continue
            P = torch.stack([pair.target(x[:i]) for i in range(gamma + 1)])
            laws = []
            for rule in ("hsd", "block"):
                law = {}
                for pr, n, dist in chain_cases(rule, P, Q, torch.tensor(x), 1.0):
                    for y in range(3):
                        law[(n, y)] = law.get((n, y), 0.0) + pr * float(dist[y] / dist.sum())
                laws.append(law)
            assert all(abs(laws[0].get(k, 0) - laws[1].get(k, 0)) < EXACT for k in set(laws[0]) | set(laws[1])), x


def test_traversal_on_a_chain_is_block_verification():
    """Weng et al.'s single-chain case: the same law of accepted drafts and output as block verification."""
    for seed in range(3):
        pair = Pair.random(3, seed)
        chain, block = evaluate("traversal", pair, k_config=[1, 1, 1]), evaluate("block", pair, gamma=3)
        assert all(abs(chain.accepted_law.get(k, 0) - block.accepted_law.get(k, 0)) < EXACT for k in range(4))
        assert all(
            abs(chain.emitted.get(s, 0) - block.emitted.get(s, 0)) < EXACT
            for s in set(chain.emitted) | set(block.emitted)
        )


@pytest.mark.parametrize("vocab", [2, 3])
def test_the_proven_orderings_hold_in_expectation_on_random_families(vocab):
    """Per iteration, averaged over drafts and coins: block >= token (Block Verification, Theorem 2), and on the
    same tree shape traversal >= MCSS >= SpecInfer; no lossless chain rule passes the single-draft bound."""
    for seed in range(12):
        pair = Pair.random(vocab, seed)
        chain = {r: evaluate(r, pair, gamma=3) for r in ("spd", "block", "hsd")}
        assert chain["block"].accepted >= chain["spd"].accepted - 1e-9
        assert all(o.accepted <= o.bound + 1e-9 for o in chain.values())
        for k_config in ([2, 1], [2, 2]):
            e = {r: evaluate(r, pair, k_config=k_config).accepted for r in ("specinfer", "mcss", "traversal")}
            assert e["traversal"] >= e["mcss"] - 1e-9 and e["mcss"] >= e["specinfer"] - 1e-9, (seed, k_config, e)


def test_the_orderings_do_not_hold_draft_by_draft():
    """What the theorems do not say: for one given draft, block verification can expect fewer accepted tokens
    than token verification, and traversal fewer than MCSS on one given tree (found on these families)."""
    pair = Pair.random(3, 0)
    x = (B, A, A)
    P = torch.stack([pair.target(x[:i]) for i in range(4)])
    Q = torch.stack([pair.draft(x[:i]) for i in range(3)])
    e = {r: sum(pr * n for pr, n, _ in chain_cases(r, P, Q, torch.tensor(x), 1.0)) for r in ("spd", "block")}
    assert e["block"] < e["spd"] - 0.1
    found = False
    for tree, P, _ in draft_trees(pair, [2, 1], replacement=False):
        e = {r: sum(pr * len(path) for pr, path, _ in walk_cases(r, P, tree)) for r in ("mcss", "traversal")}
        found |= e["traversal"] < e["mcss"] - 0.01
    assert found


# HSD's README: "Expected number of accepted tokens (E[N]): Tokenwise 5/9, Blockwise 4/9, HSD 7/9" on the toy.
COUNTINGS = {
    "E[accepted]": lambda law, g: sum(n * p for n, p in law.items()),
    "E[emitted]": lambda law, g: sum((n + 1) * p for n, p in law.items()),
    "E[accepted] / gamma": lambda law, g: sum(n * p for n, p in law.items()) / g,
    "E[emitted] / (gamma + 1)": lambda law, g: sum((n + 1) * p for n, p in law.items()) / (g + 1),
    **{f"P(N = {k})": (lambda law, g, k=k: law.get(k, 0.0)) for k in range(6)},
    **{f"P(N >= {k})": (lambda law, g, k=k: sum(p for n, p in law.items() if n >= k)) for k in range(1, 6)},
    "P(N = gamma)": lambda law, g: law.get(g, 0.0),
    "P(N < gamma)": lambda law, g: 1 - law.get(g, 0.0),
}


def test_hsds_readme_figures_match_no_counting():
    """No gamma from 1 to 5 and no counting of accepted tokens gives token 5/9, block 4/9 and HSD 7/9 together
    (either HSD form); and 7/9 as the probability of accepting at least one token is above 1 - TV(p, q) = 2/3,
    which no lossless rule passes at any gamma."""
    matches = []
    for g in range(1, 6):
        laws = {r: evaluate(r, TOY, gamma=g).accepted_law for r in ("spd", "block", "hsd", "hsd_ref")}
        for name, count in COUNTINGS.items():
            v = {r: count(law, g) for r, law in laws.items()}
            if (
                close(v["spd"], 5 / 9)
                and close(v["block"], 4 / 9)
                and (close(v["hsd"], 7 / 9) or close(v["hsd_ref"], 7 / 9))
            ):
                matches.append((g, name))
            assert v["block"] >= v["spd"] - EXACT or not name.startswith(
                "E["
            )  # so token 5/9 > block 4/9 is no expectation
    assert matches == []
    assert close(prefix_bound(TOY, 1), 2 / 3) and 7 / 9 > prefix_bound(TOY, 1)
    for g in range(1, 5):
        assert close(sum(p for n, p in evaluate("hsd", TOY, gamma=g).accepted_law.items() if n >= 1), 2 / 3)


def test_the_case_splits_are_complete():
    cells = list(uniform_cases([0.25, 1.0, 0.0, 0.5]))
    assert len(cells) == 4 and close(sum(p for _, p in cells), 1.0)
    assert all(0 <= u < 1 for us, _ in cells for u in us)

    def run(coin):
        return (coin(0.5), coin(0.25) if coin(1.0) else None, coin(0.0))

    cases = coin_cases(run)
    assert close(sum(w for w, _ in cases), 1.0) and len(cases) == 4


def test_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match="summing to 1"):
        Pair.context_free([0.5, 0.4], [0.5, 0.5]).target(())
    with pytest.raises(ValueError, match="give gamma"):
        evaluate("block", TOY)
    with pytest.raises(ValueError, match="k i.i.d. chains"):
        evaluate("spectr", TOY, k_config=[2, 2])
    with pytest.raises(ValueError, match="unknown rule 'nope'"):
        evaluate("nope", TOY, gamma=2)


def test_the_command_prints_the_table(capsys):
    assert exact_cli.main(["--p", "1/3,2/3", "--q", "2/3,1/3", "--gamma", "2"]) == 0
    out = capsys.readouterr().out
    assert "| spd | yes | 10/9 (1.1111) |" in out and "| block | yes | 11/9 (1.2222) |" in out
    assert "| hsd_ref | no | 4/3 (1.3333) | 7/3 | 1/9 | 4/3 |" in out and "single-draft bound at gamma 2: 4/3" in out
    assert set(chain_rules()) <= set(out.replace("|", " ").split())


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--p", "1/3,2/3", "--q", "1"], "--p has 2 probabilities and --q 1"),
        (["--p", "1/3,x", "--q", "1/2,1/2"], "--p must be comma-separated probabilities"),
        (["--p", "0.3,0.3", "--q", "1/2,1/2"], "--p must be 2 non-negative numbers summing to 1"),
        (["--random", "3", "--rules", "spd,nope"], "unknown rules ['nope']"),
        ([], "give --p and --q"),
        # huge gamma: refused before the default k_config's list is built, whatever the number of digits
        (["--random", "2", "--gamma", "1000000000"], "--gamma must be an integer in [1, 64]"),
        (["--random", "2", "--gamma", "9" * 4000], "--gamma must be an integer in [1, 64]"),
        (["--random", "2", "--gamma", "0"], "--gamma must be an integer in [1, 64]"),
        # V^(gamma+1) is enumerated, not V^gamma: 2^18 > 200,000 >= 2^17
        (["--random", "2", "--gamma", "17", "--rules", "spd"], "2^(18)"),
        # a tree counted by its nodes (3 + 9 + 27), not the sum of k_config
        (["--random", "2", "--k-config", "3,3,3"], "trees of 39 nodes"),
        (["--random", "3", "--k-config", "9" * 30 + "," + "9" * 30], "more than 200,000 nodes"),
        (["--random", "2", "--k-config", ",".join(["1"] * 65), "--rules", "mcss"], "--k-config has 65 depths"),
        (["--random", "2", "--k-config", "9" * 5000], "--k-config must be comma-separated integers"),
        # SpecTr's num_drafts chains of gamma tokens
        (["--random", "2", "--num-drafts", "30"], "spectr: 30 chains of 2 tokens"),
        (["--random", "2", "--num-drafts", "-3"], "--num-drafts must be an integer"),
        (["--random", "2", "--num-drafts", "10" * 200], "--num-drafts must be an integer"),
        # probabilities: overflow, non-finite, negative, above 1
        (["--p", "1e400,0", "--q", "1,0"], "--p must be comma-separated probabilities"),
        (["--p", "1,0", "--q=-1e400,1"], "--q must be comma-separated probabilities"),
        (["--p", "nan,1", "--q", "1/2,1/2"], "--p must be comma-separated probabilities"),
        (["--p", "2,-1", "--q", "1/2,1/2"], "each a finite number in [0, 1]"),
        (["--p", "1/0,1", "--q", "1/2,1/2"], "--p must be comma-separated probabilities"),
        (["--p", ",", "--q", "1/2,1/2"], "--p must be comma-separated probabilities"),
        # MTAD's threshold
        (["--p", "1/2,1/2", "--q", "1/2,1/2", "--tau", "nan"], "--tau must be a number in [0, 1]"),
        (["--p", "1/2,1/2", "--q", "1/2,1/2", "--tau", "-0.5"], "--tau must be a number in [0, 1]"),
        (["--p", "1/2,1/2", "--q", "1/2,1/2", "--tau", "inf"], "--tau must be a number in [0, 1]"),
        (["--p", "1/2,1/2", "--q", "1/2,1/2", "--tau", "1e400"], "--tau must be a number in [0, 1]"),
        # vocabulary and seed
        (["--random", "1" + "0" * 30], "--random needs a vocabulary of at least 2 tokens"),
        (["--random", "1"], "--random needs a vocabulary of at least 2 tokens"),
        (["--random", "2", "--seed", "-1"], "--seed must be an integer in [0, 4294967295]"),
        (["--random", "2", "--seed", str(2**64)], "--seed must be an integer in [0, 4294967295]"),
        (["--random", "2", "--p", "1/2,1/2"], "give either --p and --q, or --random V"),
    ],
)
def test_bad_settings_are_refused_before_any_enumeration_with_exit_2(argv, message, capsys, monkeypatch):
    """One line naming the setting, exit 2 (as the sweep and generate), nothing enumerated, no huge number formed."""
    monkeypatch.setattr(exact_cli, "evaluate", lambda *a, **k: pytest.fail("enumerated past a refusal"))
    monkeypatch.setattr(exact_cli.Pair, "random", lambda *a, **k: pytest.fail("built a pair past a refusal"))
    assert exact_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert len(err) < 600


def test_the_guard_counts_what_is_enumerated():
    """The guard's counts are the enumeration's: V^(gamma+1) law entries of a chain rule, V^n trees of n nodes."""
    assert exact_cli.tree_nodes([2, 1, 1]) == 6 and exact_cli.tree_nodes([3, 3, 3]) == 39
    assert exact_cli.tree_nodes([10**30] * 3) == exact_cli.MAX_ENUMERATED + 1  # capped, never formed
    assert exact_cli.enumerated(2, 17) == 2**17 and exact_cli.enumerated(2, 18) is None
    assert exact_cli.enumerated(10**50, 2) is None and exact_cli.enumerated(3, 10**6) is None
    pair = Pair.context_free([0.5, 0.5], [0.5, 0.5])  # full support: every node is any of the V tokens
    trees = draft_trees(pair, [2, 2], replacement=True)
    assert len(trees) == 2 ** exact_cli.tree_nodes([2, 2])
    out = evaluate("spd", pair, gamma=3)
    assert len(out.law) <= 2 ** (3 + 1) and exact_cli.enumerated(2, 4) == 16


def test_the_command_runs_at_the_largest_accepted_size_and_exits_0(capsys):
    assert exact_cli.main(["--random", "2", "--gamma", "3", "--k-config", "2,1", "--num-drafts", "2"]) == 0
    assert "| traversal | yes |" in capsys.readouterr().out
