"""The exact calculator's table, written: its numbers as short fractions where they are ones (``exact`` re-exports
these; kept apart so that the calculator stays under the house's module size)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Sequence


def as_fraction(x: float, limit: int = 10_000) -> str:
    """``x`` as a short fraction when it is one (to float64 precision), else as a decimal."""
    f = Fraction(x).limit_denominator(limit)
    return str(f) if abs(float(f) - x) < 1e-12 else f"{x:.6f}"


def format_table(rows: Sequence[Any]) -> str:
    """The exact calculator's table (``exact.Outcome`` rows) as markdown."""
    lines = [
        "| rule | claimed lossless | E[accepted drafts] | E[tokens] / iteration | TV(output, target) "
        "| single-draft bound |",
        "|---|---|---|---|---|---|",
    ]
    for o in rows:
        bound = as_fraction(o.bound) if o.bound is not None else "–"
        lines.append(
            f"| {o.rule} | {'yes' if o.lossless else 'no'} | {as_fraction(o.accepted)} ({o.accepted:.4f}) | "
            f"{as_fraction(o.tokens)} | {as_fraction(o.distance)} | {bound} |"
        )
    return "\n".join(lines)
