"""python -m pipeline.exact: the exact table of every verification rule for a small target p and draft q.

    python -m pipeline.exact --p 1/3,2/3 --q 2/3,1/3 --gamma 2            # context-free rows (the toy example)
    python -m pipeline.exact --random 3 --seed 0 --gamma 3 --k-config 2,1,1  # random prefix-dependent rows

Per rule: E[accepted drafts] and E[tokens] per iteration, the total variation between the output law and
the target's (0 for every lossless rule), and beside the chain rules the bound no lossless single-draft
rule passes, sum_k (1 - TV(P_k, Q_k)). Numbers only, no model (``pipeline.decoding.exact``).

Every setting is checked before anything is enumerated, and a bad one exits 2 with one line naming it and the
fix: the work is counted as it is really done (``enumerated``): V^(gamma+1) sequences for the chain rules, V^n
draft trees for a tree of n nodes (the products of ``k_config`` summed over its depths; SpecTr's tree is
``num_drafts`` chains of gamma tokens), and refused above ``MAX_ENUMERATED`` without forming the number.
"""

from __future__ import annotations

import argparse
import math
import sys
from fractions import Fraction

from pipeline.decoding.exact import (
    Pair,
    as_fraction,
    chain_rules,
    evaluate,
    format_table,
    tree_config,
    tree_rules,
)

MAX_ENUMERATED = 200_000  # sequences or draft trees one rule may enumerate (seconds and bounded memory)
MAX_DEPTH = 64  # gamma and the depth of k_config: beyond it even V = 2 is far past MAX_ENUMERATED
MAX_SEED = 2**32 - 1  # --seed: Pair.random's generator seeds are seed * 1_000_003 + a prefix's index


class ExactSettingError(Exception):
    """A setting ``main`` refuses before enumerating anything: printed as one line, exit 2."""


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _row(text: str, flag: str) -> list[float]:
    fix = f"{flag} must be comma-separated probabilities such as 1/3,2/3 or 0.25,0.75"
    try:
        row = [float(Fraction(v.strip())) for v in text.split(",") if v.strip()]
    except (ValueError, ZeroDivisionError, OverflowError):  # OverflowError: 1e400 is no float
        raise ExactSettingError(f"{fix}; got {_short(text)}") from None
    if not row:
        raise ExactSettingError(f"{fix}; got {_short(text)}")
    bad = [v for v in row if not math.isfinite(v) or v < 0 or v > 1]
    if bad:
        raise ExactSettingError(f"{fix}, each a finite number in [0, 1]; got {bad[0]!r} in {_short(text)}")
    return row


def _ints(text: str, flag: str) -> list[int]:
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:  # also a number past Python's 4300-digit limit
        raise ExactSettingError(f"{flag} must be comma-separated integers such as 2,1; got {_short(text)}") from None
    if not out or min(out) < 1:
        raise ExactSettingError(f"{flag} needs at least one number, each >= 1; got {_short(text)}")
    return out


def tree_nodes(k_config: list[int], cap: int = MAX_ENUMERATED) -> int:
    """The nodes of a tree with ``k_config[d]`` children under each depth-d node: sum over depths of the
    products of ``k_config`` (2,1,1: 2 + 2 + 2; 3,3,3: 3 + 9 + 27), capped at ``cap`` + 1 so that no product
    of large factors is ever formed."""
    total, width = 0, 1
    for k in k_config:
        width = min(width * k, cap + 1)
        total = min(total + width, cap + 1)
    return total


def enumerated(vocab: int, exponent: int) -> int | None:
    """``vocab ** exponent`` when it is at most ``MAX_ENUMERATED``, else None (never formed when it is not)."""
    if vocab < 2:
        return 1
    if exponent > math.log2(MAX_ENUMERATED) + 1 or vocab > MAX_ENUMERATED:
        return None
    size = vocab**exponent
    return size if size <= MAX_ENUMERATED else None


def _nodes_text(nodes: int) -> str:
    return f"more than {MAX_ENUMERATED:,}" if nodes > MAX_ENUMERATED else str(nodes)


def _too_many(vocab: int, exponent: int, what: str, fix: str) -> ExactSettingError:
    digits = exponent * math.log10(vocab)  # exponent is at most MAX_ENUMERATED + 1: no huge number is formed
    return ExactSettingError(
        f"{what}: {vocab}^({_nodes_text(exponent)}) (about 10^{digits:.0f} or more) to enumerate, more than "
        f"{MAX_ENUMERATED:,}; {fix}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.exact", description=__doc__.splitlines()[0])
    parser.add_argument("--p", help="target row, e.g. 1/3,2/3 (the same after every prefix)")
    parser.add_argument("--q", help="draft row over the same vocabulary, e.g. 2/3,1/3")
    parser.add_argument(
        "--random",
        type=int,
        metavar="V",
        help="instead of --p/--q: random rows over V tokens that depend on the prefix",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --random (default 0)")
    parser.add_argument(
        "--gamma", type=int, default=2, help="draft length of the chain rules and of SpecTr's chains (default 2)"
    )
    parser.add_argument(
        "--k-config",
        default=None,
        help="children per depth of the tree rules (default: 2 then 1 per further depth, gamma deep)",
    )
    parser.add_argument("--num-drafts", type=int, default=2, help="SpecTr's i.i.d. chains (default 2)")
    parser.add_argument("--tau", type=float, default=1.0, help="MTAD's threshold (default 1: plain sampling)")
    parser.add_argument(
        "--rules",
        default=None,
        help="comma-separated subset of the rules (default: every method that declares its exact case analysis)",
    )
    args = parser.parse_args(argv)
    try:
        pair, k_config, rules = _checked(args)
    except ExactSettingError as err:
        print(f"python -m pipeline.exact: error: {err}", file=sys.stderr)
        return 2

    rows = []
    for rule in rules:
        if rule in chain_rules():
            rows.append(evaluate(rule, pair, gamma=args.gamma, tau=args.tau))
        else:
            rows.append(evaluate(rule, pair, k_config=tree_config(rule, k_config, args.num_drafts, args.gamma)))
    print(
        f"vocabulary {pair.vocab}, gamma {args.gamma}, trees {k_config}, SpecTr {args.num_drafts} x {args.gamma}, MTAD "
        f"tau {args.tau}"
    )
    print(format_table(rows))
    if rows and rows[0].bound is not None:
        print(f"\nsingle-draft bound at gamma {args.gamma}: {as_fraction(rows[0].bound)} expected accepted drafts")
    return 0


def _checked(args: argparse.Namespace) -> tuple[Pair, list[int], list[str]]:
    """The pair, the trees' ``k_config`` and the rules of ``args``, every setting checked and the work counted
    before anything is built or enumerated (``ExactSettingError`` names the setting and the fix)."""
    if not 1 <= args.gamma <= MAX_DEPTH:
        raise ExactSettingError(
            f"--gamma must be an integer in [1, {MAX_DEPTH}] (the chain's draft length); got {_short(str(args.gamma))}"
        )
    if not 1 <= args.num_drafts <= MAX_ENUMERATED:
        raise ExactSettingError(
            f"--num-drafts must be an integer in [1, {MAX_ENUMERATED:,}] (SpecTr's chains); "
            f"got {_short(str(args.num_drafts))}"
        )
    if not (math.isfinite(args.tau) and 0.0 <= args.tau <= 1.0):
        raise ExactSettingError(
            f"--tau must be a number in [0, 1] (MTAD's threshold: 0 accepts every draft, 1 none); got {args.tau}"
        )
    if not 0 <= args.seed <= MAX_SEED:
        raise ExactSettingError(f"--seed must be an integer in [0, {MAX_SEED}]; got {_short(str(args.seed))}")
    every = chain_rules() + tree_rules()
    rules = [r.strip() for r in args.rules.split(",") if r.strip()] if args.rules is not None else every
    unknown = sorted(set(rules) - set(every))
    if unknown or not rules:
        raise ExactSettingError(
            f"unknown rules {unknown[:5] if unknown else _short(args.rules)}; --rules takes a comma-separated subset "
            f"of {', '.join(every)}"
        )
    if args.k_config:
        k_config = _ints(args.k_config, "--k-config")
        if len(k_config) > MAX_DEPTH:
            raise ExactSettingError(f"--k-config has {len(k_config)} depths: give at most {MAX_DEPTH}")
    else:
        k_config = [2] + [1] * (args.gamma - 1)

    if args.random is not None:
        if args.p or args.q:
            raise ExactSettingError("give either --p and --q, or --random V, not both")
        if not 2 <= args.random <= MAX_ENUMERATED:
            raise ExactSettingError(
                f"--random needs a vocabulary of at least 2 tokens (and at most {MAX_ENUMERATED:,}); "
                f"got {_short(str(args.random))}"
            )
        vocab = args.random
    elif args.p and args.q:
        p, q = _row(args.p, "--p"), _row(args.q, "--q")
        if len(p) != len(q):
            raise ExactSettingError(
                f"--p has {len(p)} probabilities and --q {len(q)}: give both over the same vocabulary"
            )
        vocab = len(p)
    else:
        raise ExactSettingError("give --p and --q (e.g. --p 1/3,2/3 --q 2/3,1/3), or --random V")

    # the work as it is done: the chain rules enumerate V^gamma drafts and the law of V^(gamma+1) sequences; a
    # tree rule V^nodes draft trees (and the law of V^(depth+1) sequences, never more than that)
    chains = [r for r in rules if r in chain_rules()]
    if chains and enumerated(vocab, args.gamma + 1) is None:
        raise _too_many(
            vocab,
            args.gamma + 1,
            f"the chain rules ({', '.join(chains)}) at gamma {args.gamma}",
            "lower --gamma or the vocabulary, or leave the chain rules out of --rules",
        )
    trees = [r for r in rules if r in tree_rules() and r != "spectr"]
    if trees:
        nodes = max(tree_nodes(k_config), len(k_config) + 1)
        if enumerated(vocab, nodes) is None:
            raise _too_many(
                vocab,
                nodes,
                f"the tree rules ({', '.join(trees)}) draw trees of {_nodes_text(nodes)} nodes",
                "give a smaller --k-config (its default is 2,1,... gamma deep) or vocabulary, or leave the tree rules "
                "out of --rules",
            )
    if "spectr" in rules:
        nodes = max(tree_nodes([args.num_drafts] + [1] * (args.gamma - 1)), args.gamma + 1)
        if enumerated(vocab, nodes) is None:
            raise _too_many(
                vocab,
                nodes,
                f"spectr: {args.num_drafts} chains of {args.gamma} tokens",
                "lower --num-drafts, --gamma or the vocabulary, or leave spectr out of --rules",
            )

    if args.random is not None:
        return Pair.random(vocab, args.seed), k_config, rules
    try:
        pair = Pair.context_free(p, q)
        pair.target(())
        pair.draft(())
    except ValueError as err:
        raise ExactSettingError(
            str(err).replace("the target row after ()", "--p").replace("the draft row after ()", "--q")
        ) from None
    return pair, k_config, rules


if __name__ == "__main__":
    sys.exit(main())
