"""medusa: Medusa heads on the target (Cai et al. 2024), a token tree of their top-k, one target pass.

Heads (ALGORITHMS.md 10.2): head i (i = 1..K) reads the target's last hidden state h_t (the input of
its LM head) and predicts token t+i+1: ``logits_i = LMHead(ResBlock_i^L(h_t))`` with
``ResBlock(x) = x + SiLU(Linear(x))``, Linear zero-initialised (a head starts as the LM head itself).
Here the head's output projection is the target's own (tied) LM head, shared and frozen, so a head is
one 576x576 block for SmolLM2 (a few MB for all heads); ``python -m pipeline.train_medusa`` trains the
blocks with the backbone frozen (Medusa-1).

Where the heads come from: a pair config's ``medusa: models/<dir>`` key; ``load_pair`` calls
``load_medusa_heads(path, target)``, which attaches them to the target model as the attribute
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

import json
from pathlib import Path

import torch
from torch import nn

from .base import Decoder, Generation, Param, emit, in_closed, nonneg_number, one_of
from .tree_verify import (
    cartesian_tree,
    greedy_tree_walk,
    int_list_at_least,
    one_hot_tree_walk,
    tree_verify_forward,
    typical_tree_walk,
)
from .fast_forward import small_linear
from .warping import sample

HEADS_FILE = "medusa_heads.safetensors"
CONFIG_FILE = "medusa_config.json"


class ResBlock(nn.Module):
    """``x + SiLU(Linear(x))`` with the Linear zero-initialised: the identity at the start of training."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K Medusa heads: K stacks of ``num_layers`` ResBlocks; logits through the target's own LM head.

    The LM head is not a parameter of this module (it is shared with the target and never saved);
    pass it to ``forward``.
    """

    def __init__(self, hidden_size: int, num_heads: int, num_layers: int = 1) -> None:
        super().__init__()
        self.hidden_size, self.num_heads, self.num_layers = hidden_size, num_heads, num_layers
        self.blocks = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)]) for _ in range(num_heads)
        )

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` -> ``[K, ..., H]``: each head's transformed hidden state."""
        return torch.stack([block(hidden) for block in self.blocks])

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """``[..., H]`` -> logits ``[K, ..., V]``."""
        feats = self.features(hidden.to(self.blocks[0][0].linear.weight.dtype)).to(lm_head.weight.dtype)
        if type(lm_head) is nn.Linear and not torch.is_grad_enabled():  # decoding: a few rows, the fast form
            return small_linear(feats, lm_head.weight, lm_head.bias)
        return lm_head(feats)

    def config_dict(self) -> dict:
        return {"hidden_size": self.hidden_size, "num_heads": self.num_heads, "num_layers": self.num_layers}


def save_medusa_heads(heads: MedusaHeads, directory: str | Path, dtype: torch.dtype = torch.bfloat16, **info) -> Path:
    """Write ``medusa_config.json`` (architecture + ``info``) and the heads' weights (safetensors)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in heads.state_dict().items()}
    save_file(state, directory / HEADS_FILE)
    config = {**heads.config_dict(), "dtype": str(dtype).replace("torch.", ""), **info}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return directory


def load_medusa_heads(path: str | Path, target: nn.Module | None = None) -> MedusaHeads:
    """Load heads saved by ``save_medusa_heads``; with ``target``, check the shapes and attach them to it.

    A relative ``path`` is looked up from the current directory, then from the repository root.
    """
    from safetensors.torch import load_file

    directory = Path(path)
    if not directory.is_absolute() and not directory.exists():
        directory = Path(__file__).resolve().parents[2] / directory
    if not (directory / CONFIG_FILE).exists():
        raise ValueError(
            f"no Medusa heads at {path!r} (expected {CONFIG_FILE} and {HEADS_FILE}); train them with "
            f"`python -m pipeline.train_medusa pair=<pair> out_dir={path}`"
        )
    config = json.loads((directory / CONFIG_FILE).read_text())
    heads = MedusaHeads(config["hidden_size"], config["num_heads"], config.get("num_layers", 1))
    heads.load_state_dict({k: v.float() for k, v in load_file(directory / HEADS_FILE).items()})
    heads.eval().requires_grad_(False)
    if target is not None:
        attach_medusa_heads(target, heads)
    return heads


def attach_medusa_heads(target: nn.Module, heads: MedusaHeads) -> nn.Module:
    """Put ``heads`` on ``target`` (as ``target.medusa_heads``, on its device and dtype) after checking shapes."""
    hidden = target.get_output_embeddings().weight.shape[1]
    if heads.hidden_size != hidden:
        raise ValueError(f"Medusa heads expect hidden size {heads.hidden_size}, the target has {hidden}")
    weight = target.get_output_embeddings().weight
    heads.to(weight.device, weight.dtype)
    # plain attribute (not a registered submodule): the target's state dict and forward stay untouched
    object.__setattr__(target, "medusa_heads", heads)
    return target


def medusa_heads_of(target: nn.Module, method: str) -> MedusaHeads:
    """The heads attached to ``target``, or a clear error saying how to provide them."""
    heads = getattr(target, "medusa_heads", None)
    if heads is None:
        raise ValueError(
            f"method {method!r} needs Medusa heads on the target: add `medusa: models/<dir>` to the pair "
            f"config (train heads with `python -m pipeline.train_medusa pair=<pair>`), or call "
            f"pipeline.decoding.medusa.attach_medusa_heads(target, heads) / load_medusa_heads(path, target)"
        )
    return heads


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
