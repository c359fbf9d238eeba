"""Token trees: the one node bookkeeping of every method that runs several candidates through one forward.

Beam search and beam sampling (MTAD drafts, MTJD) grow a forest of beams level by level; SpecTr,
SpecInfer, MCSS and Medusa draft a token tree that the target then scores in one pass
(``tree_verify.py``). Either way the nodes follow a cached prefix of ``start`` positions: node i
sits in the cache at slot ``start + i``, at position ``start + depth(i)``, and attends to the prefix,
its ancestors and itself (docs/ALGORITHMS.md A.2). After a path is chosen,
``CachedModel.compact(start, path)`` moves its KV into place.
"""

from __future__ import annotations

import torch


class TokenTree:
    """Token nodes after a cached prefix of ``start`` positions, numbered in the order they are added.

    Node i has ``tokens[i]``, ``parents[i]`` (-1: a root, the child of the prefix's last token) and
    ``depths[i]``; a parent is added before its children (BFS order when the tree grows level by
    level). ``children[p + 1]`` lists node p's children in the order they were added
    (``children[0]``: the roots); ``q_rows[p + 1]`` is the warped draft row node p's children were
    drawn from (sampled trees only). ``fed`` counts the nodes already run through a model by ``feed``
    (a prefix of the nodes, whose ancestor mask is kept).
    """

    def __init__(self, start: int) -> None:
        self.start = start
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depths: list[int] = []
        self.children: list[list[int]] = [[]]
        self.q_rows: dict[int, torch.Tensor] = {}
        self.fed = 0
        self._anc = torch.zeros(0, 0, dtype=torch.bool)  # ancestor-or-self mask of the fed nodes

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int) -> int:
        """Append one node under ``parent`` (-1: a root) and return its index."""
        node = len(self.tokens)
        if parent >= node:
            raise ValueError("a node's parent must be added before it")
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(0 if parent < 0 else self.depths[parent] + 1)
        self.children.append([])
        self.children[parent + 1].append(node)
        return node

    def extend(self, tokens: list[int], parents: list[int]) -> list[int]:
        """Append nodes (``parents[i]`` of ``tokens[i]``) and return their indices."""
        return [self.add(t, p) for t, p in zip(tokens, parents)]

    def feed(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The nodes added since the last ``feed``, to forward after the fed ones: (token ids, absolute
        positions, mask rows ``[new, fed + new]`` over every fed node) for ``CachedModel.forward_tree(...,
        tree_start=start)``."""
        old, n = self.fed, len(self.tokens)
        anc = torch.zeros(n, n, dtype=torch.bool)
        anc[:old, :old] = self._anc
        for node in range(old, n):
            parent = self.parents[node]
            if parent >= 0:
                anc[node] = anc[parent]
            anc[node, node] = True
        self._anc = anc
        self.fed = n
        ids = torch.tensor(self.tokens[old:], dtype=torch.long)
        positions = torch.tensor(self.depths[old:], dtype=torch.long) + self.start
        return ids, positions, anc[old:]

    def with_root(self, root: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``root`` (the prefix's last token, not yet cached: slot ``start - 1``) and then every node, as one
        forward: (ids ``[1 + n]``, positions, mask ``[1 + n, 1 + n]`` for ``tree_start = start - 1``).

        Row 0 is the root's, row 1 + i node i's; the ancestor rows of the fed nodes are reused.
        """
        old, n = self.fed, len(self.tokens)
        mask = torch.zeros(1 + n, 1 + n, dtype=torch.bool)
        mask[:, 0] = True
        mask[1 : 1 + old, 1 : 1 + old] = self._anc
        for node in range(old, n):
            parent = self.parents[node]
            if parent >= 0:
                mask[1 + node] = mask[1 + parent]
            mask[1 + node, 1 + node] = True
        ids = torch.tensor([root] + self.tokens, dtype=torch.long)
        positions = torch.tensor([-1] + self.depths, dtype=torch.long) + self.start
        return ids, positions, mask

    def path(self, node: int) -> list[int]:
        """Node indices from the root down to ``node``."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]
