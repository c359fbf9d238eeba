"""python -m pipeline.exact: the exact table of every verification rule for a small target p and draft q.

    python -m pipeline.exact --p 1/3,2/3 --q 2/3,1/3 --gamma 2            # context-free rows (the toy example)
    python -m pipeline.exact --random 3 --seed 0 --gamma 3 --k-config 2,1,1  # random prefix-dependent rows

Per rule: E[accepted drafts] and E[tokens] per iteration, the total variation between the output law and
the target's (0 for every lossless rule), and beside the chain rules the bound no lossless single-draft
rule passes, sum_k (1 - TV(P_k, Q_k)). Numbers only, no model (``pipeline.decoding.exact``).
"""

from __future__ import annotations

import argparse
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


def _row(text: str, flag: str) -> list[float]:
    try:
        return [float(Fraction(v.strip())) for v in text.split(",") if v.strip()]
    except (ValueError, ZeroDivisionError):
        raise SystemExit(
            f"{flag} must be comma-separated probabilities such as 1/3,2/3 or 0.25,0.75; got {text!r}"
        ) from None


def _ints(text: str, flag: str) -> list[int]:
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{flag} must be comma-separated integers such as 2,1; got {text!r}") from None
    if not out or min(out) < 1:
        raise SystemExit(f"{flag} needs at least one number, each >= 1; got {text!r}")
    return out


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

    if args.random is not None:
        if args.p or args.q:
            raise SystemExit("give either --p and --q, or --random V, not both")
        if args.random < 2:
            raise SystemExit(f"--random needs a vocabulary of at least 2 tokens, got {args.random}")
        pair = Pair.random(args.random, args.seed)
    elif args.p and args.q:
        p, q = _row(args.p, "--p"), _row(args.q, "--q")
        if len(p) != len(q):
            raise SystemExit(f"--p has {len(p)} probabilities and --q {len(q)}: give both over the same vocabulary")
        try:
            pair = Pair.context_free(p, q)
            pair.target(())
            pair.draft(())
        except ValueError as err:
            raise SystemExit(
                str(err).replace("the target row after ()", "--p").replace("the draft row after ()", "--q")
            ) from None
    else:
        raise SystemExit("give --p and --q (e.g. --p 1/3,2/3 --q 2/3,1/3), or --random V")
    if args.gamma < 1 or args.num_drafts < 1:
        raise SystemExit("--gamma and --num-drafts must be >= 1")
    k_config = _ints(args.k_config, "--k-config") if args.k_config else [2] + [1] * (args.gamma - 1)
    every = chain_rules() + tree_rules()
    rules = [r.strip() for r in args.rules.split(",") if r.strip()] if args.rules else every
    unknown = sorted(set(rules) - set(every))
    if unknown:
        raise SystemExit(f"unknown rules {unknown}; rules: {', '.join(every)}")
    size = pair.vocab ** max(args.gamma, sum(k_config))
    if size > 200_000:
        raise SystemExit(f"about {size} drafts to enumerate: use a smaller vocabulary, gamma or k_config")

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


if __name__ == "__main__":
    sys.exit(main())
