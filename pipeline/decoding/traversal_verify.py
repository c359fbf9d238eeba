"""Traversal Verification (Weng et al., NeurIPS 2025, arXiv 2505.12398) as a pure walk over a draft tree.

The tree is a ``tree.TokenTree`` whose children were drawn from the draft row of their parent WITHOUT
replacement (``q_rows[parent + 1]``), in the order they were drawn; ``P [1 + n, V]`` are the warped target
rows (row 0: the root's, row 1 + i: node i's). Each node X carries a sequence-level acceptance
probability ``p_a(X)``, a target row ``M_b(.|X)`` and a draft row ``M_s(.|X)`` (at first its plain rows):

- ``p_a(root) = 1``; a child c of X gets ``p_a(c) = min(1, p_a(X) M_b(c|X) / M_s(c|X))`` (paper eq. 1: the
  capped joint ratio of the path, as block verification's ``pi``) when the walk first reaches it.
- The walk takes the first leaf in post-order (from the root, always the first remaining child) and accepts
  it with probability ``p_a(leaf)``: the path root..leaf is kept and the next token comes from ``M_b(.|leaf)``.
- A rejected leaf c with parent X is deleted and X is updated (paper eqs. 2-3, sequence-level RRS without
  replacement): ``R = [p_a(X) M_b(.|X) - M_s(.|X)]_+``, ``p_a(X) <- sum R / (sum R + 1 - p_a(X))``,
  ``M_b(.|X) <- norm(R)``, ``M_s(.|X) <- norm(M_s(.|X) without c)``; X's remaining children get their
  ``p_a`` from X's new values when the walk reaches them.
- When every child of the root is deleted the root is the leaf: it is accepted (``p_a(root)`` stays 1) and
  the next token comes from its residual.

On a chain this is block verification (Sun et al.); on a tree of depth 1 it is MCSS's rule
(docs/ALGORITHMS.md section 19). The randomness comes from ``coin(prob) -> bool``: a seeded draw in the
engine, an exact case split in ``pipeline.decoding.exact``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .tree import TokenTree
from .verification import _normalize

Coin = Callable[[float], bool]


def generator_coin(generator: torch.Generator | None, device: torch.device | str = "cpu") -> Coin:
    """A coin that is True with probability ``prob``, one uniform from ``generator`` per flip."""

    def coin(prob: float) -> bool:
        return float(torch.rand((), generator=generator, device=device)) < prob

    return coin


def traversal_walk(P: torch.Tensor, tree: TokenTree, coin: Coin) -> tuple[list[int], torch.Tensor]:
    """Traversal Verification of ``tree`` under the target rows ``P``: ``(path, dist)``, the accepted path
    (node indices, root down; empty when only the root survives) and the distribution of the next token."""
    alive = [list(kids) for kids in tree.children]  # alive[X + 1]: X's remaining children, in draw order
    p_a: dict[int, float] = {-1: 1.0}
    m_b: dict[int, torch.Tensor] = {}
    m_s: dict[int, torch.Tensor] = {}

    def rows(node: int) -> None:
        if node not in m_b:
            m_b[node] = P[node + 1]
            m_s[node] = tree.q_rows[node + 1]

    while True:
        node, path = -1, []
        while alive[node + 1]:  # down the first remaining children to the first leaf in post-order
            child = alive[node + 1][0]
            if child not in p_a:
                rows(node)
                token = tree.tokens[child]
                q = float(m_s[node][token])
                p_a[child] = min(1.0, p_a[node] * float(m_b[node][token]) / q) if q > 0 else 0.0
            path.append(child)
            node = child
        if node < 0:
            return [], m_b.get(-1, P[0])
        if coin(p_a[node]):
            return path, m_b.get(node, P[node + 1])
        parent = tree.parents[node]
        alive[parent + 1].pop(0)
        rows(parent)
        a, target, draft = p_a[parent], m_b[parent], m_s[parent]
        residual = (a * target - draft).clamp_min(0.0)
        mass = float(residual.sum())
        den = mass + (1.0 - a)
        p_a[parent] = mass / den if den > 0 else 1.0
        m_b[parent] = _normalize(residual, target)
        without = draft.clone()
        without[tree.tokens[node]] = 0.0
        m_s[parent] = _normalize(without, without)
