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

import torch

from .kv import CachedModel
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
    """Draw ``depth`` tokens by beam sampling from ``model`` after ``context``; return the best beam."""
    if not warper.greedy and model.device.type == "cpu" and warper.sparse(model.vocab_size):
        return _beam_sample_sparse(model, context, depth, num_beams, warper, generator, beam_weights, replacement)
    logits = model.forward(context[model.length :], keep=1)[-1]
    start = model.length  # == len(context)
    idx, weights, log_q = first_beams(logits, num_beams, warper, generator, beam_weights, replacement)
    beams = idx[:, None]  # [W, s] tokens
    nodes: list[list[int]] = [[] for _ in range(len(idx))]
    tree = TokenTree(start)
    for _ in range(1, depth):
        parents = [n[-1] if n else -1 for n in nodes]
        fed = tree.extend(beams[:, -1].tolist(), parents)
        ids, positions, mask = tree.feed()
        out = model.forward_tree(ids, positions, mask, start)  # [W, V]
        b, v, weights, step_lq = next_beams(out, weights, num_beams, warper, generator, beam_weights, replacement)
        log_q = torch.cat([log_q[b], step_lq[:, None]], 1)
        beams = torch.cat([beams[b], v[:, None]], 1)
        bl = b.tolist()
        nodes = [nodes[i] + [fed[i]] for i in bl]
    best = int(weights.argmax())
    path = nodes[best]
    if path:
        model.compact(start, path)
    return Beam(beams[best].tolist(), log_q[best])


def _nonzero_by_id(ids: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k rows ``(ids, probs) [..., k]`` as the non-zero entries of the dense rows, in the order a dense
    row lists them (token id ascending within a row, rows in order): flattened ``(position, ids, probs)``."""
    order = ids.argsort(-1)
    ids, probs = ids.gather(-1, order), probs.gather(-1, order)
    keep = (probs > 0).flatten().nonzero().squeeze(-1)
    return keep, ids.flatten()[keep], probs.flatten()[keep]


def _beam_sample_sparse(model, context, depth, num_beams, warper, generator, beam_weights, replacement) -> Beam:
    """``beam_sample`` for a top-k warper on the CPU, on the rows' k entries: the same beams and the same
    random draws as the dense form (the candidates are the dense rows' non-zero entries, in their order)."""
    ids, probs = model.forward_sparse(context[model.length :], warper)
    start = model.length
    first, weights, log_q = first_beams_sparse(ids, probs, num_beams, generator, beam_weights, replacement)
    beams = first[:, None]
    nodes: list[list[int]] = [[] for _ in range(len(first))]
    tree = TokenTree(start)
    for _ in range(1, depth):
        parents = [n[-1] if n else -1 for n in nodes]
        fed = tree.extend(beams[:, -1].tolist(), parents)
        tok, positions, mask = tree.feed()
        ids, probs = model.forward_tree(tok, positions, mask, start, warper=warper)  # [W, k] each
        b, v, weights, step_lq = next_beams_sparse(ids, probs, weights, num_beams, generator, beam_weights, replacement)
        log_q = torch.cat([log_q[b], step_lq[:, None]], 1)
        beams = torch.cat([beams[b], v[:, None]], 1)
        nodes = [nodes[i] + [fed[i]] for i in b.tolist()]
    best = int(weights.argmax())
    path = nodes[best]
    if path:
        model.compact(start, path)
    return Beam(beams[best].tolist(), log_q[best])
