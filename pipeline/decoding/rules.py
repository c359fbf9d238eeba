"""What a speculative method declares: a chain rule or a tree walk (run by the loop of ``batched.py``).

A chain rule is a pure function of the warped target rows ``P [g+1, V]``, the draft's rows ``Q [g, V]``
(or, as the rule declares, their log-probabilities at the drafts ``log q [g]``, or None; a rule that declares
``point_mass`` gets None for a deterministic proposal: row i is the point mass at ``x[i]``), the draft tokens ``x [g]``
and uniforms ``u [g]`` (None for a rule without coins), with the method's parameters as keywords::

    rule(P, Q, x, u, **params) -> (n accepted (0-d tensor), next-token distribution [V] or token (0-d))

The dense rule is the reference and all a new rule needs. A fast path is optional and attached to the
rule: ``sparse`` takes P as its top-k entries ``(P_index, P_probs [g+1, k])`` instead of P and returns
``(n, index, weights)`` (it may call the engine's C++ kernels); ``tests/test_decoding_rules.py`` checks
every registered method's sparse path against its dense rule. ``greedy`` is the rule at temperature 0 on
the raw logits (default: the longest prefix equal to the target's argmax, then the argmax).

A tree walk is a function of the warped rows ``P [1 + n, V]`` (row 0: the root's), the ``TokenTree`` and
the generator: ``walk(P, tree, generator, **params) -> (path, next-token distribution or token)``, and
declares how the tree's children must be drawn for it to be exact (``children``: ``iid`` from the draft
row q, ``distinct`` from q without replacement, or the ``top`` k). Temperature 0 walks every tree by the
target's argmax (``greedy_tree_walk``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .verification import greedy_verify

RuleOut = tuple[torch.Tensor, torch.Tensor]


def argmax_prefix(logits: torch.Tensor, x: torch.Tensor, **params) -> RuleOut:
    """Temperature 0: the longest prefix equal to the target's argmax, then the argmax (exactly ``ar`` greedy)."""
    return greedy_verify(logits.argmax(-1), x)


@dataclass(frozen=True)
class ChainRule:
    """A chain verification rule and what it needs (see the module docstring)."""

    dense: Callable[..., RuleOut]
    params: tuple[str, ...] = ()  # the method's parameters passed to the rule as keywords
    coins: bool = True  # it takes uniforms u [g] (False: u is None and no random number is drawn for it)
    sparse: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
    greedy: Callable[..., RuleOut] = argmax_prefix
    # what it reads as Q: the draft rows ("rows", [g, V]), their log-probabilities at x ("log_q", [g]) or nothing
    # ("none")
    draft: str = "rows"
    # with draft "rows": it takes a deterministic proposal (prompt lookup) as Q = None, the point mass at each
    # draft, without a vocabulary-sized one-hot (``verification.draft_at`` / ``minus_point_mass``); a rule that does
    # not declare it is given the one-hot rows
    point_mass: bool = False
    # the rule by exact case analysis (``pipeline.decoding.exact``): ``exact(P, Q, x, **params)`` yields
    # (probability, accepted n, next-token distribution) of every outcome of its randomness; a rule that declares
    # it is a row of the exact calculator (``python -m pipeline.exact``), named by its method
    exact: Callable[..., Any] | None = None


@dataclass(frozen=True)
class TreeWalk:
    """A tree walk and the children it needs (see the module docstring)."""

    walk: Callable[..., tuple[list[int], torch.Tensor]]
    children: str = "iid"
    params: tuple[str, ...] = ()
    chains: bool = False  # it verifies k chains (a tree of [k, 1, ..., 1]: SpecTr's K-SEQ)
    # the walk by exact case analysis (``pipeline.decoding.exact``): ``exact(P, tree)`` -> [(probability, path,
    # next-token distribution)] of every outcome; a walk that declares it is a row of the exact calculator
    exact: Callable[..., Any] | None = None
