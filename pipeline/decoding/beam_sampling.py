"""Beam sampling over a token tree (MTAD drafts, MTJD): W beams extended for a fixed depth.

All beams share the context KV: each step feeds the W beams' last tokens as tree nodes (one
forward of W tokens with an ancestor mask), never a copy of the context per beam. At the end the
chosen beam's nodes are compacted into place, so the model's cache holds ``context + x[:-1]``.

Beam weights (docs/ALGORITHMS.md 1.4, 4.2; Decisions 2):
- ``paper``: normalized joint probabilities (MTAD eq. 2): the W selected (beam, token) pairs
  are renormalized among themselves;
- ``reference_code``: the released code's ``log_softmax`` over probabilities (a softmax of
  numbers in [0, 1], nearly uniform), kept to reproduce it.
Temperature 0 is deterministic beam search on the unwarped log-probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .drafting import ChainAsk
from .kv import CachedModel
from .packed import Lanes, PackedRows, SoloCache
from .tree import TokenTree
from .warping import Warper, sample_k

BEAM_WEIGHTS = ("paper", "reference_code")


@dataclass
class Beam:
    tokens: list[int]  # the chosen beam's tokens
    log_q: torch.Tensor  # [depth] per-token warped log-probabilities along it


def _select(weights: torch.Tensor, k: int, replacement: bool, generator, greedy: bool) -> torch.Tensor:
    """Indices of k (beam, token) pairs from flat ``weights`` (probabilities, or log-probs when greedy)."""
    if greedy:
        finite = int(torch.isfinite(weights).sum())
        return weights.topk(min(k, finite)).indices
    return sample_k(weights, k, replacement, generator)


def _renormalize(selected: torch.Tensor, beam_weights: str) -> torch.Tensor:
    """Log beam weights of the selected pairs (from their probabilities)."""
    if beam_weights == "reference_code":
        return torch.log_softmax(selected, 0)
    return torch.log(selected / selected.sum())


def first_beams(
    logits: torch.Tensor, num_beams: int, warper: Warper, generator, beam_weights: str, replacement: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first depth's beams from the context's last row ``logits`` [V]: their tokens [W], log beam weights
    [W] and warped log-probabilities [W, 1] (temperature 0: the top W of the unwarped log-probabilities)."""
    if warper.greedy:
        row = torch.log_softmax(logits, -1)
        idx = _select(row, num_beams, False, generator, True)
        weights = row[idx]  # joint log-likelihoods
        return idx, weights, weights[:, None]
    q0 = warper(logits)
    idx = _select(q0, num_beams, replacement, generator, False)
    return idx, _renormalize(q0[idx], beam_weights), torch.log(q0[idx])[:, None]


def next_beams(
    out: torch.Tensor,
    weights: torch.Tensor,
    num_beams: int,
    warper: Warper,
    generator,
    beam_weights: str,
    replacement: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One depth more from the beams' rows ``out`` [W, V] and log weights ``weights`` [W]: for each of the W
    selected (beam, token) pairs its beam ``b`` and token ``v``, the new log weights and the step's warped
    log-probabilities."""
    vocab = out.shape[-1]
    if warper.greedy:
        step = torch.log_softmax(out, -1)
        flat = (weights[:, None] + step).flatten()
        pick = _select(flat, num_beams, False, generator, True)
        b, v = pick // vocab, pick % vocab
        return b, v, flat[pick], step[b, v]
    q = warper(out)
    flat = (torch.exp(weights)[:, None] * q).flatten()
    pick = _select(flat, num_beams, replacement, generator, False)
    b, v = pick // vocab, pick % vocab
    return b, v, _renormalize(flat[pick], beam_weights), torch.log(q[b, v])


def first_beams_sparse(
    ids: torch.Tensor, probs: torch.Tensor, num_beams: int, generator, beam_weights: str, replacement: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``first_beams`` from the context's last top-k row ``(ids, probs) [k]`` (sampled, not greedy)."""
    _, cand, w = _nonzero_by_id(ids, probs)
    sel = sample_k(w, num_beams, replacement, generator)
    return cand[sel], _renormalize(w[sel], beam_weights), torch.log(w[sel])[:, None]


def next_beams_sparse(
    ids: torch.Tensor,
    probs: torch.Tensor,
    weights: torch.Tensor,
    num_beams: int,
    generator,
    beam_weights: str,
    replacement: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``next_beams`` from the beams' top-k rows ``(ids, probs) [W, k]`` (sampled, not greedy)."""
    k = ids.shape[-1]
    keep, cand, q = _nonzero_by_id(ids, probs)
    flat = torch.exp(weights)[keep // k] * q
    pick = sample_k(flat, num_beams, replacement, generator)
    return keep[pick] // k, cand[pick], _renormalize(flat[pick], beam_weights), torch.log(q[pick])


def draft_beams(
    model: CachedModel,
    cache: Lanes,
    asks: list[ChainAsk],
    num_beams: int,
    warper: Warper,
    beam_weights: str = "paper",
    replacement: bool = False,
) -> list[Beam]:
    """Beam sampling after each ask's context, ``ask.gamma`` deep (``>= 1``), on ``model`` whose sequences are
    ``cache`` (its own cache at batch 1; several requests packed at batch > 1): each request's W beams are tree
    nodes of its own sequence, one forward per depth over every request, each drawn with its own generator; the
    best beam of each (its nodes compacted into place: the sequence then holds ``context + x[:-1]``).

    A top-k warper on the CPU warps on the rows' k entries (the same beams and draws as the dense rows: the
    candidates are their non-zero entries, in their order)."""
    sparse = not warper.greedy and model.device.type == "cpu" and warper.sparse(model.vocab_size)
    state: list[dict[str, Any]] = [{} for _ in asks]
    for j in range(max((a.gamma for a in asks), default=0)):
        step = [i for i, a in enumerate(asks) if a.gamma > j]
        groups = []
        for i in step:
            a, s = asks[i], state[i]
            if j == 0:
                feed = torch.tensor(a.context[cache.length(a.slot) :], dtype=torch.long)
                groups.append(PackedRows(a.slot, feed, [feed.numel() - 1]))
                continue
            parents = [n[-1] if n else -1 for n in s["nodes"]]
            s["fed"] = s["tree"].extend(s["beams"][:, -1].tolist(), parents)
            old = s["tree"].fed
            ids, positions, mask = s["tree"].feed()
            m = ids.numel()
            sees = torch.cat([torch.ones(m, s["start"], dtype=torch.bool), mask[:, :old].cpu()], 1)
            groups.append(
                PackedRows(a.slot, ids, list(range(m)), positions=positions, sees=sees, inner=mask[:, old:].cpu())
            )
        raws = cache.step(groups)
        for i, raw in zip(step, raws):
            a, s = asks[i], state[i]
            gen = a.generator
            if j == 0:
                s["start"] = cache.length(a.slot)
                s["tree"] = TokenTree(s["start"])
                if sparse:
                    ids, probs = model.top_k_rows(raw[-1], warper)
                    first, s["weights"], s["log_q"] = first_beams_sparse(
                        ids, probs, num_beams, gen, beam_weights, replacement
                    )
                else:
                    logits = model.logits(raw[-1:])[0]
                    first, s["weights"], s["log_q"] = first_beams(
                        logits, num_beams, warper, gen, beam_weights, replacement
                    )
                s["beams"] = first[:, None]
                s["nodes"] = [[] for _ in range(len(first))]
                continue
            if sparse:
                ids, probs = model.top_k_rows(raw, warper)
                b, v, s["weights"], step_lq = next_beams_sparse(
                    ids, probs, s["weights"], num_beams, gen, beam_weights, replacement
                )
            else:
                b, v, s["weights"], step_lq = next_beams(
                    model.logits(raw), s["weights"], num_beams, warper, gen, beam_weights, replacement
                )
            s["log_q"] = torch.cat([s["log_q"][b], step_lq[:, None]], 1)
            s["beams"] = torch.cat([s["beams"][b], v[:, None]], 1)
            s["nodes"] = [s["nodes"][k] + [s["fed"][k]] for k in b.tolist()]
    out = []
    for a, s in zip(asks, state):
        best = int(s["weights"].argmax())
        path = s["nodes"][best]
        if path:
            cache.keep_path(a.slot, s["start"], path)
        out.append(Beam(s["beams"][best].tolist(), s["log_q"][best]))
    return out


def beam_sample(
    model: CachedModel,
    context: list[int],
    depth: int,
    num_beams: int,
    warper: Warper,
    generator: torch.Generator | None,
    beam_weights: str = "paper",
    replacement: bool = False,
) -> Beam:
    """Draw ``depth`` tokens by beam sampling from ``model`` after ``context``; return the best beam
    (``draft_beams`` of one sequence in the model's own cache: mtjd's draws from the target)."""
    ask = ChainAsk(0, context, depth, generator)
    return draft_beams(model, SoloCache(model), [ask], num_beams, warper, beam_weights, replacement)[0]


def _nonzero_by_id(ids: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k rows ``(ids, probs) [..., k]`` as the non-zero entries of the dense rows, in the order a dense
    row lists them (token id ascending within a row, rows in order): flattened ``(position, ids, probs)``."""
    order = ids.argsort(-1)
    ids, probs = ids.gather(-1, order), probs.gather(-1, order)
    keep = (probs > 0).flatten().nonzero().squeeze(-1)
    return keep, ids.flatten()[keep], probs.flatten()[keep]
