"""A model's KV cache as the loop (``batched.py``, chains and trees) and the draft model's drafting
(``drafting.draft_chain``, ``tree_verify.draft_trees``, ``beam_sampling.draft_beams``) see it: the sequences of
the requests in its slots.

Two kinds, with one interface (``length``, ``start``, ``step``, ``step_hidden``, ``rollback``, ``keep_path``,
``release``, ``close``):

- ``PackedCache``: several sequences in one cache (batch > 1): each new row sees exactly its own sequence's live
  positions, in order (``CachedModel.forward_masked_rows``), and a sequence rolls back, keeps a tree path or leaves
  without touching the others; a prompt rides in its request's first step;
- ``SoloCache``: one sequence in the model's own cache (batch 1): the prompt is prefilled (timed as
  ``prefill_s``), a step is the model's plain forward (the bf16 kernels' fused draft chain and the CUDA graphs
  serve it as they serve ``CachedModel.forward``).

On the bf16 CPU kernels the two give a sequence the same rows, bit for bit (``PackedCache``'s doc).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv import CachedModel


@dataclass
class PackedRows:
    """New rows of one request in a packed step: ``tokens`` [m]; ``positions`` (None: right after its live
    positions); ``sees`` bool [m, live] over its live positions (None: all); ``inner`` bool [m, m] among the
    new rows (None: causal); ``keep``: the rows (0..m-1) whose logits are wanted."""

    slot: int
    tokens: torch.Tensor
    keep: list[int]
    positions: torch.Tensor | None = None
    sees: torch.Tensor | None = None
    inner: torch.Tensor | None = None


class PackedCache:
    """Several sequences in one ``CachedModel`` cache, each row seeing only its own sequence's live positions.

    ``owner[j]`` is the slot (request) whose position sits in cache slot j, -1 once rolled back or released;
    a sequence's live positions stay in cache order (= position order), so its rows see the keys it would
    see alone, in the same order. Dead slots are compacted away when they outnumber the live ones.
    """

    solo = False

    def __init__(self, model: CachedModel, compact_at: int = 256) -> None:
        model.reset()
        self.model = model
        self.owner = torch.empty(0, dtype=torch.long)
        self.lengths: dict[int, int] = {}
        self.compact_at = compact_at

    def start(self, prompts: dict[int, list[int]], hidden: bool = False) -> dict[int, torch.Tensor]:
        """New sequences in ``slots`` (slot -> prompt): nothing is written (a prompt rides in its request's first
        step) unless ``hidden``: then ``prompt[:-1]`` of every sequence is written in one packed forward and
        their hidden states returned (slot -> ``[len - 1, width]``; a drafter that reads the target's features
        starts on them)."""
        for slot in prompts:
            self.release(slot)
        if not hidden:
            return {}
        groups = [PackedRows(s, torch.tensor(p[:-1], dtype=torch.long), []) for s, p in prompts.items() if len(p) > 1]
        rows = dict(zip([g.slot for g in groups], self.step_hidden(groups)[1])) if groups else {}
        empty = self.model.prefill_hidden([])
        return {s: rows.get(s, empty) for s in prompts}

    def close(self) -> None:
        """Empty the cache of every sequence (the loop starts or ends a run; the model's own ``generate`` can
        run in between)."""
        self.model.reset()
        self.owner = torch.empty(0, dtype=torch.long)
        self.lengths = {}

    def length(self, slot: int) -> int:
        return self.lengths.get(slot, 0)

    def _live(self, slot: int) -> torch.Tensor:
        return (self.owner == slot).nonzero().squeeze(-1)

    def rollback(self, slot: int, length: int) -> None:
        """Keep the first ``length`` live positions of ``slot``."""
        if self.length(slot) > length:
            self.owner[self._live(slot)[length:]] = -1
            self.lengths[slot] = length

    def keep_path(self, slot: int, start: int, path: list[int]) -> None:
        """Of ``slot``'s positions after its first ``start``, keep the tree nodes ``path`` (ascending)."""
        idx = self._live(slot)[start:]
        dead = torch.ones(idx.numel(), dtype=torch.bool)
        dead[torch.tensor(path, dtype=torch.long)] = False
        self.owner[idx[dead]] = -1
        self.lengths[slot] = start + len(path)

    def release(self, slot: int) -> None:
        self.owner[self.owner == slot] = -1
        self.lengths.pop(slot, None)

    def _maybe_compact(self) -> None:
        live = (self.owner >= 0).nonzero().squeeze(-1)
        dead = self.owner.numel() - live.numel()
        if dead >= max(self.compact_at, live.numel()):
            self.model.compact(0, live)
            self.owner = self.owner[live]

    def step(self, groups: list[PackedRows]) -> list[torch.Tensor]:
        """One forward of every group's rows; per group the own-head logits of its ``keep`` rows ``[len(keep), V]``."""
        self._maybe_compact()
        L = self.owner.numel()
        sizes = [g.tokens.numel() for g in groups]
        N = sum(sizes)
        slots = torch.cat([torch.full((m,), g.slot, dtype=torch.long) for g, m in zip(groups, sizes)])
        allowed = torch.zeros(N, L + N, dtype=torch.bool)
        allowed[:, :L] = self.owner[None, :] == slots[:, None]
        positions: list[torch.Tensor] = []
        rows: list[int] = []
        r = 0
        for g, m in zip(groups, sizes):
            if g.sees is not None:
                live = self._live(g.slot)
                block = torch.zeros(m, L, dtype=torch.bool)
                block[:, live] = g.sees
                allowed[r : r + m, :L] = block
            allowed[r : r + m, L + r : L + r + m] = (
                torch.ones(m, m, dtype=torch.bool).tril() if g.inner is None else g.inner
            )
            n0 = self.length(g.slot)
            positions.append(torch.arange(n0, n0 + m) if g.positions is None else g.positions.cpu())
            rows.extend(r + k for k in g.keep)
            self.lengths[g.slot] = n0 + m
            r += m
        tokens = torch.cat([g.tokens.reshape(-1).cpu() for g in groups])
        raw = self.model.forward_masked_rows(
            tokens, torch.cat(positions), allowed, torch.tensor(rows, dtype=torch.long)
        )
        self.owner = torch.cat([self.owner, slots])
        return list(raw.split([len(g.keep) for g in groups]))

    def step_hidden(self, groups: list[PackedRows]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``step``, and per group the target's hidden states of all its rows ``[m, width]`` (what an EAGLE head
        reads: the LM head's input, or with ``capture_layers`` the inputs of those decoder layers, which
        ``forward_masked_rows`` taps in the lean forward, on the CPU kernels too)."""
        with self.model.capturing() as model:
            raws = self.step(groups)
        return raws, list(model.captured().split([g.tokens.numel() for g in groups]))


class SoloCache:
    """One sequence in ``model``'s own cache (batch 1), with ``PackedCache``'s interface (any slot number names it):
    the prompt is prefilled (``CachedModel.prefill``, timed in ``prefill_s``), a step is one plain forward."""

    solo = True

    def __init__(self, model: CachedModel) -> None:
        self.model = model

    def length(self, slot: int) -> int:
        return self.model.length

    def start(self, prompts: dict[int, list[int]], hidden: bool = False) -> dict[int, torch.Tensor]:
        """Empty the cache and write ``prompt[:-1]`` (with ``hidden``: and return its hidden states)."""
        ((slot, prompt),) = prompts.items()
        self.model.reset()
        if hidden:
            return {slot: self.model.prefill_hidden(prompt[:-1])}
        self.model.prefill(prompt[:-1])
        return {}

    def step(self, groups: list[PackedRows]) -> list[torch.Tensor]:
        """``PackedCache.step`` of the one sequence: its ``keep`` rows (the last ones; all of a tree's nodes)."""
        ((g,),) = (groups,)
        model = self.model
        if g.positions is None and g.sees is None and g.inner is None:  # a causal chain after the cache
            return [model.forward_raw(g.tokens, keep=len(g.keep))]
        m = g.tokens.numel()
        sees = torch.ones(m, model.length, dtype=torch.bool) if g.sees is None else g.sees
        inner = torch.ones(m, m, dtype=torch.bool).tril() if g.inner is None else g.inner
        positions = torch.arange(model.length, model.length + m) if g.positions is None else g.positions
        rows = model.forward_masked(g.tokens, positions, torch.cat([sees, inner], 1), raw=True)
        if len(g.keep) == m:  # every row (a tree's): no copy
            return [rows]
        return [rows[torch.tensor(g.keep, dtype=torch.long, device=rows.device)]]

    def step_hidden(self, groups: list[PackedRows]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``step``, and the target's hidden states of the kept rows."""
        with self.model.capturing() as model:
            raws = self.step(groups)
        return raws, [model.captured()]

    def rollback(self, slot: int, length: int) -> None:
        if self.model.length > length:
            self.model.rollback(length)

    def keep_path(self, slot: int, start: int, path: list[int]) -> None:
        self.model.compact(start, path)

    def release(self, slot: int) -> None:
        """Nothing to free: the next ``start`` empties the cache."""

    def close(self) -> None:
        """Nothing to do: the cache keeps the last sequence (and its ``prefill_s``) until the next ``start``."""


Lanes = PackedCache | SoloCache
