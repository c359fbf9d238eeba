"""Warping: temperature, then top-k, then top-p, turned into a probability vector (fp32).

Identical for target and draft rows (ALGORITHMS.md, Decisions 1). Temperature 0 means greedy: the
warped distribution is one-hot at the argmax. Sampling draws only from the ``generator`` passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_K = 10
DEFAULT_TOP_P = 0.9


@dataclass(frozen=True)
class Warper:
    """Turns logits ``[..., V]`` into warped probabilities ``[..., V]`` (fp32, rows sum to 1).

    ``top_k = 0`` and ``top_p = 1`` switch those filters off. top-k runs before top-p, so top-p is
    computed on the k kept values only (exact, and avoids a full-vocabulary sort).
    """

    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return warp(logits, self.temperature, self.top_k, self.top_p)


def warp(
    logits: torch.Tensor,
    temperature: float = DEFAULT_TEMPERATURE,
    top_k: int = DEFAULT_TOP_K,
    top_p: float = DEFAULT_TOP_P,
) -> torch.Tensor:
    """Warped probabilities of ``logits`` (any leading shape), in fp32."""
    logits = logits.float()
    vocab = logits.shape[-1]
    if temperature == 0:
        out = torch.zeros_like(logits)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / temperature
    if 0 < top_k < vocab:
        values, index = logits.topk(top_k, dim=-1)  # sorted, descending
        probs = _top_p_sorted(values.softmax(-1), top_p)
        return torch.zeros_like(logits).scatter_(-1, index, probs)
    if top_p < 1.0:
        values, index = logits.sort(dim=-1, descending=True)
        probs = _top_p_sorted(values.softmax(-1), top_p)
        return torch.zeros_like(logits).scatter_(-1, index, probs)
    return logits.softmax(-1)


def _top_p_sorted(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of descending ``probs`` whose mass reaches ``top_p`` (crossing token kept)."""
    if top_p >= 1.0:
        return probs
    before = probs.cumsum(-1) - probs  # mass strictly before each token
    probs = probs.masked_fill(before >= top_p, 0.0)
    return probs / probs.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of ``probs`` (``[..., V]`` -> ``[...]``).

    On CPU this is ``torch.multinomial``; on accelerators the exponential race
    ``argmax(p / E)``, E ~ Exp(1), which is exact and needs no host synchronisation.
    """
    flat = probs.reshape(-1, probs.shape[-1])
    if flat.device.type == "cpu":
        out = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    else:
        race = torch.empty_like(flat).exponential_(generator=generator)
        out = (flat / race).argmax(-1)
    return out.reshape(probs.shape[:-1])


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A seeded generator on ``device``: the only source of randomness a decoder uses."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen
