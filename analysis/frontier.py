"""The frontier of verification rules in a sweep's claims report (issue 44): the exact calculator's rules the sweep
measured, each rule's exact E[tokens] and total variation on the calculator's toy table beside its cells' measured
tokens/step, acceptance and perplexity, and the HSD finding where the sweep ran hsd_ref.

    frontier_rules(runs)                             # the calculator's rules that label batch-1 cells
    frontier_markdown(runs, samples)                 # the section: exact vs measured
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from analysis import schema
from analysis.transfer import batch_one, num

EXACT_COMMAND = "python -m pipeline.exact --p 1/3,2/3 --q 2/3,1/3 --gamma 2"


def exact_table() -> list[Any]:
    """The rows ``EXACT_COMMAND`` prints: every chain and tree rule that declares its exact case analysis
    (``ChainRule.exact``, ``TreeWalk.exact``), in the registry's order, on the calculator's toy table (p = 1/3, 2/3;
    q = 2/3, 1/3): chains of 2 at tau 1, trees of k_config [2, 1] (SpecTr: 2 chains of 2). Analysis reads the library,
    not the command-line module."""
    from pipeline.decoding.exact import Pair, chain_rules, evaluate, tree_config, tree_rules  # noqa: PLC0415

    pair = Pair.context_free([1 / 3, 2 / 3], [2 / 3, 1 / 3])
    rows = [evaluate(r, pair, gamma=2, tau=1.0) for r in chain_rules()]
    rows += [evaluate(r, pair, k_config=tree_config(r, [2, 1], 2, 2)) for r in tree_rules()]
    return rows


def exact_command_output() -> str:
    """The table ``EXACT_COMMAND`` prints (the same calculator on the same toy table)."""
    from pipeline.decoding.exact import format_table  # noqa: PLC0415

    return format_table(exact_table()) + "\n"


def frontier_rules(runs: pd.DataFrame) -> list[str]:
    """The exact calculator's rules this sweep measured: the methods that declare an exact case analysis and label
    batch-1 cells (a method at its configured defaults is labelled by its name), in the calculator's order."""
    from pipeline.decoding.exact import chain_rules, tree_rules  # noqa: PLC0415

    labels = set(batch_one(runs)["label"].astype(str)) if "label" in runs else set()
    return [r for r in chain_rules() + tree_rules() if r in labels]


def exact_at_cells(rule: str, cells: pd.DataFrame, toy: Any) -> tuple[Any, str]:
    """The calculator's outcome for ``rule`` beside its cells: the toy table's (``toy``), except where the cells ran
    a threshold other than the table's tau 1 (MTAD: at tau 1 it accepts nothing on the toy table, which says nothing
    of cells at tau 0.5): then the same table at the cells' tau, named in the rule column."""
    from pipeline.decoding.exact import Pair, evaluate  # noqa: PLC0415

    taus = pd.to_numeric(cells["tau"], errors="coerce").dropna().unique() if "tau" in cells else []
    if len(taus) != 1 or float(taus[0]) == 1.0:
        return toy, rule
    pair = Pair.context_free([1 / 3, 2 / 3], [2 / 3, 1 / 3])
    return evaluate(rule, pair, gamma=2, tau=float(taus[0])), f"{rule} (tau {float(taus[0]):g})"


def frontier_markdown(runs: pd.DataFrame, samples: pd.DataFrame) -> str:
    """Every rule of the exact calculator the sweep measured (``frontier_rules``): the calculator's exact E[tokens]
    and total variation on its toy table beside the method's measured tokens/step, acceptance and perplexity (ratio
    to ar's, mean over paired generations' cells); the HSD finding where the sweep has hsd_ref."""
    from pipeline.decoding.exact import as_fraction, format_table  # noqa: PLC0415

    one, rules = batch_one(runs), frontier_rules(runs)
    table = exact_table()
    exact = {o.rule: o for o in table}
    ar_ppl = float(num(one[one["label"] == schema.BASELINE], "perplexity").mean())

    def measured(label: str) -> tuple[str, str, str]:
        g = one[one["label"] == label]
        tps = float(pd.to_numeric(g["accepted_per_step"], errors="coerce").mean())
        alpha = float(num(g, "draft_acceptance_rate_pooled").mean())
        ppl = float(num(g, "perplexity").mean())
        rel = f"{ppl:.2f} ({100 * (ppl / ar_ppl - 1):+.1f}% vs ar)" if math.isfinite(ppl) and ar_ppl > 0 else "–"
        return f"{tps:.3f}", ("–" if not math.isfinite(alpha) else f"{alpha:.3f}"), rel

    lines = [
        "Exact columns: the calculator on its toy table (`" + EXACT_COMMAND + "`; target p = (1/3, 2/3), draft q = "
        "(2/3, 1/3), gamma 2, trees k_config [2, 1]; a rule with a threshold at its cells' tau, named beside it): "
        "E[tokens] per iteration and the total variation between the "
        "rule's output law and the target's (0 = lossless). Measured columns: this sweep's cells at batch 1 (tokens "
        "per target step, pooled draft acceptance rate, mean perplexity and its ratio to ar's; the pairwise tests are "
        "the claims above).",
        "",
        "| method | exact rule | exact E[tokens]/iteration | exact TV(output, target) | measured tokens/step | "
        "measured draft acceptance | measured perplexity |",
        "|---|---|---|---|---|---|---|",
    ]
    for rule in rules:
        o, name = exact_at_cells(rule, one[one["label"] == rule], exact[rule])
        tps, alpha, ppl = measured(rule)
        lines.append(
            f"| {rule} | {name} | {as_fraction(o.tokens)} | {as_fraction(o.distance)} | {tps} | {alpha} | {ppl} |"
        )
    lines += ["", f"`{EXACT_COMMAND}` prints:", "", "```", format_table(table).rstrip(), "```"]
    if "hsd_ref" in rules:
        hsd_ref, hsd, block = exact["hsd_ref"], exact["hsd"], exact["block"]
        lines += [
            "",
            (
                f"**The HSD finding** (`{EXACT_COMMAND}`): HSD as its authors' code runs it (hsd_ref) emits "
                f"{as_fraction(hsd_ref.tokens)} tokens per iteration against block verification's "
                f"{as_fraction(block.tokens)}, but its output law is {as_fraction(hsd_ref.distance)} in total "
                f"variation from the target's: it is lossy for gamma >= 2. HSD's lossless form (hsd) emits "
                f"{as_fraction(hsd.tokens)} at distance {as_fraction(hsd.distance)}; block verification is the most "
                "a lossless single-draft rule accepts (its Theorem 2), so no lossless HSD beats it. The measured rows "
                "say whether the same ordering shows on the real pair (tokens/step) and whether hsd_ref's distance "
                "shows in its perplexity (the lossless-perplexity claims above decide it at their size)."
            ),
        ]
    return "\n".join(lines) + "\n"
