"""Medusa heads (Cai et al. 2024): the modules, their files, and how they are placed beside a target model.

Head i (i = 1..K) reads the target's last hidden state h_t (the input of its LM head) and predicts
token t+i+1: ``logits_i = LMHead(ResBlock_i^L(h_t))`` with ``ResBlock(x) = x + SiLU(Linear(x))``,
Linear zero-initialised (a head starts as the LM head itself). The output projection is the target's
own (tied) LM head, shared and frozen, never saved. ``python -m pipeline.train_medusa`` trains them;
the decoders that use them are ``medusa`` and ``typical`` with ``drafter: medusa`` (``medusa.py``), which read them
from the assets they are passed (``build_decoder(..., assets={"medusa": heads})``; ``load_pair`` puts a pair's
heads in ``LoadedPair.assets``), never from the target model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoints import (
    HFModel,
    check_against_weights,
    config_ints,
    place,
    read_checkpoint,
    shapes_of,
    write_checkpoint,
)
from .fast_forward import small_linear

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

    def forward(self, hidden: torch.Tensor, lm_head: nn.Linear) -> torch.Tensor:
        """``[..., H]`` -> logits ``[K, ..., V]``."""
        feats = self.features(hidden.to(next(self.parameters()).dtype)).to(lm_head.weight.dtype)
        if type(lm_head) is nn.Linear and not torch.is_grad_enabled():  # decoding: a few rows, the fast form
            return small_linear(feats, lm_head.weight, lm_head.bias)
        return lm_head(feats)

    def config_dict(self) -> dict:
        return {"hidden_size": self.hidden_size, "num_heads": self.num_heads, "num_layers": self.num_layers}


def save_medusa_heads(heads: MedusaHeads, directory: str | Path, dtype: torch.dtype = torch.bfloat16, **info) -> Path:
    """Write ``medusa_config.json`` (architecture + ``info``) and the heads' weights (safetensors)."""
    config = {**heads.config_dict(), "dtype": str(dtype).replace("torch.", ""), **info}
    return write_checkpoint(
        directory, heads.state_dict(), config, dtype=dtype, config_file=CONFIG_FILE, weights_file=HEADS_FILE
    )


def load_medusa_heads(path: str | Path, target: HFModel | None = None) -> MedusaHeads:
    """Load heads saved by ``save_medusa_heads``; with ``target``, check the shapes and move them to the target's
    device and dtype (``place_medusa_heads``: not attached to it; pass them as ``assets={"medusa": heads}``).

    A relative ``path`` is looked up from the current directory, then from the repository root.
    """
    directory, config, state = read_checkpoint(
        path, config_file=CONFIG_FILE, weights_files=(HEADS_FILE,), what="Medusa heads", trainer="train_medusa"
    )
    where: dict[str, Any] = {"what": "Medusa heads", "directory": directory, "config_file": CONFIG_FILE}
    hidden, num_heads, num_layers = config_ints(
        config, ("hidden_size", "num_heads", "num_layers"), defaults={"num_layers": 1}, **where
    )
    if 2 * num_heads * num_layers != len(
        state
    ):  # before building even on the meta device: K x L blocks of 2 tensors each
        raise ValueError(
            f"Medusa heads at {directory}: {CONFIG_FILE} says {num_heads} head(s) x {num_layers} layer(s) "
            f"({2 * num_heads * num_layers} tensors), the weights hold {len(state)}; fix {CONFIG_FILE} or retrain"
        )
    check_against_weights(lambda: MedusaHeads(hidden, num_heads, num_layers), shapes_of(state), **where)
    heads = MedusaHeads(hidden, num_heads, num_layers)
    heads.load_state_dict({k: v.float() for k, v in state.items()})
    heads.eval().requires_grad_(False)
    if target is not None:
        place_medusa_heads(target, heads)
    return heads


def place_medusa_heads(target: HFModel, heads: MedusaHeads) -> MedusaHeads:
    """``heads`` checked against ``target`` (hidden size) and moved to its device and dtype; returned, not attached."""
    place(target, heads, "Medusa heads")
    return heads


def missing_medusa_heads(method: str) -> str:
    """What a method whose drafter reads Medusa heads says when none were passed."""
    return (
        f"method {method!r} needs Medusa heads: add `medusa: models/<dir>` to the pair config (train heads with "
        "`python -m pipeline.train_medusa pair=<pair>`), or pass assets={'medusa': heads} to build_decoder "
        "(pipeline.decoding.medusa_heads.load_medusa_heads(path, target))"
    )
