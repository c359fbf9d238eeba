"""Warping: temperature, then top-k, then top-p, turned into a probability vector (fp32).

Identical for target and draft rows (docs/ALGORITHMS.md, Decisions 1). Temperature 0 means greedy: the
warped distribution is one-hot at the argmax. Sampling draws only from the ``generator`` passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cpu_kernels import kernels

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

    def draw(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One token from a row of logits ``[V]``: the argmax when greedy, else a draw from the warped
        row (``sample(self(logits))``'s draw, from the top-k entries alone when ``sparse``)."""
        if self.greedy:
            return logits.argmax(-1)
        rows = self.sparse_rows(logits) if logits.dim() == 1 else None
        if rows is not None:
            return sample_sparse(*rows, generator)
        return sample(self(logits), generator)

    def sparse_rows(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``top_k_rows(logits)`` where the engine works on the k entries (top-k warping, CPU), else None."""
        if self.sparse(logits.shape[-1]) and logits.device.type == "cpu":
            return self.top_k_rows(logits)
        return None

    def sparse(self, vocab: int) -> bool:
        """Whether rows of ``vocab`` logits warp to at most ``top_k`` non-zero entries (``top_k_rows``)."""
        return self.temperature > 0 and 0 < self.top_k < vocab

    def top_k_rows(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The warped row as ``(index, probs)`` of its top-k entries (``sparse`` must hold): ``warp``'s
        non-zero entries, computed the same way."""
        return warp_top_k(logits, min(self.top_k, logits.shape[-1]), self.temperature, self.top_p)


def _cpu_kernels(logits: torch.Tensor):
    """The engine's C++ kernels where they can warp ``logits`` (CPU, float32 or bf16), else None."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.bfloat16):
        return kernels()
    return None


def warp_top_k(logits: torch.Tensor, k: int, temperature: float, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The non-zero part of ``warp``'s top-k rows (``0 < k <= V``): ``(index, probs)`` ``[..., k]``, index
    descending in the logits, probs warped (temperature on the k values, softmax, top-p prefix,
    renormalised; 0 past the prefix). On CPUs with the engine's kernels one C++ call (``warp_topk``) for
    all rows; elsewhere the same steps as tensor ops."""
    ext = _cpu_kernels(logits)
    if ext is not None:
        index, probs = ext.warp_topk(logits.reshape(-1, logits.shape[-1]), k, float(temperature), float(top_p))
        shape = (*logits.shape[:-1], k)
        return index.reshape(shape), probs.reshape(shape)
    values, index = logits.float().topk(k, dim=-1)
    return index, _top_p_sorted((values / temperature).softmax(-1), top_p)


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
    # top-k, then the temperature on the k values only (with the C++ kernels also top_k >= vocab: every
    # top-k warp then takes the same path, e.g. a restricted draft head smaller than top_k and its full row)
    if 0 < top_k and (top_k < vocab or _cpu_kernels(logits) is not None):
        index, probs = warp_top_k(logits, min(top_k, vocab), temperature, top_p)
        return torch.zeros_like(logits).scatter_(-1, index, probs)
    logits = logits / temperature
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
    """One index per row of ``probs`` (``[..., V]`` -> ``[...]``), exactly from the (unnormalised) rows.

    On CPU by inverse CDF: one float64 uniform per row against the float64 cumulative sum (a
    twentieth of ``torch.multinomial``'s cost on a 49k vocabulary). On accelerators the exponential
    race ``argmax(p / E)``, E ~ Exp(1), which needs no host synchronisation.
    """
    flat = probs.reshape(-1, probs.shape[-1])
    if flat.device.type == "cpu":
        out = _inverse_cdf(flat, 1, generator).squeeze(-1)
    else:
        race = torch.empty_like(flat).exponential_(generator=generator)
        out = (flat / race).argmax(-1)
    return out.reshape(probs.shape[:-1])


def sample_sparse(index: torch.Tensor, probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``sample`` of the row whose only non-zero entries are ``probs`` at ``index`` (1-D, distinct ids):
    the same inverse CDF in index order, so the same draw as ``sample`` of the dense row, without it
    (one C++ call on CPUs with the engine's kernels)."""
    if index.device.type == "cpu" and index.dtype == torch.long and probs.dtype == torch.float32:
        ext = kernels()
        if ext is not None:
            u = torch.rand(1, 1, generator=generator, dtype=torch.float64)
            return ext.sample_sparse(index, probs, float(u))
    order = index.argsort()
    cdf = probs[order].double().cumsum(-1)
    total = cdf[-1:]
    if not bool(total > 0):
        raise ValueError("cannot sample from a row with no probability mass")
    u = torch.rand(1, 1, generator=generator, dtype=torch.float64, device=probs.device)
    pos = torch.searchsorted(cdf, u[0] * total, right=True).clamp_(max=index.numel() - 1)
    return index[order][pos][0]


def _inverse_cdf(flat: torch.Tensor, draws: int, generator: torch.Generator | None) -> torch.Tensor:
    """``draws`` i.i.d. indices per row of ``flat [n, V]`` (non-negative weights), ``[n, draws]``.

    Index i is chosen when ``cdf[i-1] <= u * total < cdf[i]``, so a zero weight is never chosen.
    """
    if flat.shape[0] == 1:
        # a warped row has few non-zero weights (top-k, top-p): the same inverse CDF over them alone
        # (the zeros add nothing to the cumulative sum, and are never chosen) at a fraction of the cost
        nonzero = flat[0].nonzero().squeeze(-1)
        if 0 < nonzero.numel() <= flat.shape[-1] // 8:
            cdf = flat[0, nonzero].double().cumsum(-1)
            total = cdf[-1:]
            if not bool(total > 0):
                raise ValueError("cannot sample from a row with no probability mass")
            u = torch.rand(1, draws, generator=generator, dtype=torch.float64, device=flat.device)
            pos = torch.searchsorted(cdf, u[0] * total, right=True).clamp_(max=nonzero.numel() - 1)
            return nonzero[pos][None]
    cdf = flat.double().cumsum(-1)
    total = cdf[:, -1:]
    if not bool((total > 0).all()):
        raise ValueError("cannot sample from a row with no probability mass")
    u = torch.rand(flat.shape[0], draws, generator=generator, dtype=torch.float64, device=flat.device)
    # u < 1, so u * total < total but for rounding at the very top (probability ~1e-16): clamp
    return torch.searchsorted(cdf, u * total, right=True).clamp_(max=flat.shape[-1] - 1)


def sample_k(
    weights: torch.Tensor, k: int, replacement: bool, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``k`` indices from non-negative ``weights [N]``, like ``torch.multinomial(weights, k, replacement)``.

    With replacement: k i.i.d. draws. Without: the first ``min(k, support)`` draws of sequential
    sampling without replacement, in draw order, by the exponential race (Gumbel-top-k): sorting
    ``w_i / E_i`` (E ~ Exp(1)) in descending order has the law of sequential draws.
    """
    if replacement:
        if weights.device.type == "cpu":
            return _inverse_cdf(weights.reshape(1, -1), k, generator)[0]
        return torch.multinomial(weights, k, replacement=True, generator=generator)
    support = weights.nonzero().squeeze(-1)  # the draws never leave it
    if support.numel() == 0:
        raise ValueError("cannot sample from weights with no probability mass")
    w = weights[support].double()
    race = w / torch.empty_like(w).exponential_(generator=generator)
    return support[race.topk(min(k, support.numel())).indices]


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A seeded generator on ``device``: the only source of randomness a decoder uses."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen
