"""Token trees: nodes appended level by level after a cached prefix, with ancestor masks and depths.

Used for every method that runs several candidate continuations through one model at once (beam
drafts of MTAD and MTJD, beam search, and the token trees of SpecInfer/MCSS/Medusa). Nodes live in
the model's KV cache contiguously from ``start``; node i attends to the prefix, its ancestors and
itself. After a path is chosen, ``CachedModel.compact(start, path)`` moves its KV into place.
"""

from __future__ import annotations

import torch


class TokenTree:
    """A growing forest of token nodes whose roots continue a cached prefix of ``start`` positions.

    ``root_position`` is the absolute position of depth-0 nodes (usually ``start``).
    """

    def __init__(self, start: int, root_position: int | None = None, device: torch.device | str = "cpu") -> None:
        self.start = start
        self.root_position = start if root_position is None else root_position
        self.device = device
        self.parents: list[int] = []
        self.depths: list[int] = []
        self.tokens: list[int] = []
        self._anc = torch.zeros(0, 0, dtype=torch.bool)

    def __len__(self) -> int:
        return len(self.parents)

    def add(self, tokens: list[int], parents: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append nodes (parent -1 = a root) and return (token ids, positions, mask rows) to forward."""
        old = len(self.parents)
        new = len(tokens)
        anc = torch.zeros(old + new, old + new, dtype=torch.bool)
        anc[:old, :old] = self._anc
        for i, (tok, parent) in enumerate(zip(tokens, parents)):
            node = old + i
            if parent >= 0:
                if parent >= node:
                    raise ValueError("a node's parent must be added before it")
                anc[node] = anc[parent]
                depth = self.depths[parent] + 1
            else:
                depth = 0
            anc[node, node] = True
            self.parents.append(parent)
            self.depths.append(depth)
            self.tokens.append(int(tok))
        self._anc = anc
        ids = torch.tensor(tokens, dtype=torch.long)
        positions = torch.tensor(self.depths[old:], dtype=torch.long) + self.root_position
        return ids, positions, anc[old:]

    def path(self, node: int) -> list[int]:
        """Node indices from the root down to ``node``."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]
