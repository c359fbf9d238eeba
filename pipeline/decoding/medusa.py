"""medusa: Medusa heads on the target (Cai et al. 2024), a token tree of their top-k, one target pass.

Heads (docs/ALGORITHMS.md 10.2): head i (i = 1..K) reads the target's last hidden state h_t (the input of
its LM head) and predicts token t+i+1: ``logits_i = LMHead(ResBlock_i^L(h_t))`` with
``ResBlock(x) = x + SiLU(Linear(x))``, Linear zero-initialised (a head starts as the LM head itself).
Here the head's output projection is the target's own (tied) LM head, shared and frozen, so a head is
one 576x576 block for SmolLM2 (a few MB for all heads); ``python -m pipeline.train_medusa`` trains the
blocks with the backbone frozen (Medusa-1).

The heads themselves (architecture, save/load/attach) are in ``medusa_heads.py``. Where they come
from: a pair config's ``medusa: models/<dir>`` key; ``load_pair`` calls ``load_medusa_heads(path, target)``, which attaches them to the target model as the attribute
``target.medusa_heads``. ``build_decoder("medusa", target)`` (and ``typical`` with
``drafter: medusa``) read that attribute; attach heads yourself with ``attach_medusa_heads``.

Decoding: the root (the last emitted token) comes from the target; depth d of the tree holds the
``k_config[d]`` most likely tokens of head d+1 under every depth-(d-1) node (a Cartesian tree, the
heads see only the root's hidden state). One target pass with tree attention scores every node;
``acceptance: typical`` keeps the longest path whose tokens pass typical acceptance (lossy, Medusa-2's
rule, ties broken by likelihood) and ``acceptance: exact`` walks the tree with the one-hot recursive
rule for deterministic children (lossless: the output follows the warped target exactly). The next
token is drawn from the target row at the end of the path (``recovery: argmax`` takes its argmax, as
Medusa's default "fast" mode does); its hidden state feeds the heads for the next tree.
"""

from __future__ import annotations

import torch

from .base import Decoder, Generation, Param, emit, in_closed, nonneg_number, one_of
from .medusa_heads import MedusaHeads, medusa_heads_of
from .tree_verify import (
    cartesian_tree,
    greedy_tree_walk,
    int_list_at_least,
    one_hot_tree_walk,
    tree_verify_forward,
    typical_tree_walk,
)
from .warping import sample

MEDUSA_PARAMS = {
    "k_config": Param([4, 2, 2], int_list_at_least(1), "top-k of head d+1 under each depth-d node (depth <= heads)"),
    "acceptance": Param("typical", one_of("typical", "exact"), "typical (lossy, Medusa-2) or exact (one-hot walk)"),
    "epsilon": Param(0.09, in_closed(0.0, 1.0), "typical acceptance: posterior threshold"),
    "delta": Param(0.3, nonneg_number, "typical acceptance: posterior alpha (entropy factor)"),
    "recovery": Param("sample", one_of("sample", "argmax"), "next token after the path: sample or argmax"),
}


def check_medusa_combination(method: str, values) -> None:
    if values["acceptance"] == "exact" and values["recovery"] != "sample":
        raise ValueError(
            f"method {method!r}: acceptance=exact is lossless only with recovery=sample; "
            f"set recovery: sample, or use acceptance: typical"
        )


def medusa_generate(decoder: Decoder, heads: MedusaHeads, prompt, max_new_tokens, eos, generator) -> Generation:
    """The Medusa loop over ``decoder.target`` (shared by ``medusa`` and ``typical`` with ``drafter: medusa``)."""
    target, warper = decoder.target, decoder.warper
    lm_head = target.model.get_output_embeddings()
    target.reset()
    target.prefill(prompt[:-1])
    context = list(prompt)
    out: list[int] = []
    accepted: list[int] = []
    target.capture_hidden = True
    try:
        # the first token comes from the target alone; its hidden state seeds the first tree
        logits = target.forward(context[-1:], keep=1)
        emitted = [_next(logits[-1], warper, generator, decoder.recovery)]
        head_row = target.hidden[-1]
        while True:
            if emit(emitted, eos, max_new_tokens, out, context, accepted):
                break
            depth = min(len(decoder.k_config), heads.num_heads, max_new_tokens - len(out) - 1)
            length = len(context)
            if depth == 0:
                logits = target.forward(context[-1:], keep=1)
                emitted = [_next(logits[-1], warper, generator, decoder.recovery)]
                head_row = target.hidden[-1]
                continue
            head_logits = heads(head_row, lm_head)  # [K, V]
            tree = cartesian_tree(head_logits[:depth], decoder.k_config[:depth])
            logits = tree_verify_forward(target, context, tree)  # [1 + n, V]
            states = target.hidden
            if warper.greedy:
                path, y = greedy_tree_walk(logits.argmax(-1), tree)
                end_row = 1 + path[-1] if path else 0
            elif decoder.acceptance == "typical":
                P = warper(logits)
                path, end_row = typical_tree_walk(P, tree, decoder.epsilon, decoder.delta)
                y = _next_from_probs(P[end_row], generator, decoder.recovery)
            else:
                path, dist = one_hot_tree_walk(warper(logits), tree, generator)
                end_row = 1 + path[-1] if path else 0
                y = int(sample(dist, generator))
            target.compact(length, path)
            head_row = states[end_row]
            emitted = [tree.tokens[i] for i in path] + [y]
    finally:
        target.capture_hidden = False
    return Generation(out, target.forwards, 0, accepted)


def _next(logits: torch.Tensor, warper, generator, mode: str) -> int:
    if warper.greedy:
        return int(logits.argmax(-1))
    return _next_from_probs(warper(logits), generator, mode)


def _next_from_probs(probs: torch.Tensor, generator, mode: str) -> int:
    if mode == "argmax":
        return int(probs.argmax(-1))
    return int(sample(probs, generator))


class MedusaDecoder(Decoder):
    """Medusa heads + Cartesian token tree + typical (lossy) or exact one-hot tree acceptance."""

    name = "medusa"
    needs_draft = False
    params = MEDUSA_PARAMS

    @classmethod
    def check_combination(cls, values) -> None:
        check_medusa_combination(cls.name, values)

    def __init__(self, target, draft=None, **params) -> None:
        super().__init__(target, draft, **params)
        self.heads = medusa_heads_of(target, self.name)

    def _generate(self, prompt, max_new_tokens, eos, generator) -> Generation:
        return medusa_generate(self, self.heads, prompt, max_new_tokens, eos, generator)
