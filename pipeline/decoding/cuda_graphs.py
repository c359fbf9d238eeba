"""CUDA graphs of the lean forward's short steps: one graph launch instead of ~45 kernel launches per layer.

On an H200 (benchmarks/gpu-random-llama3-8b-1b.md, 2026-11-26) the random 8B target's one-token step took 16.0 ms
of which its kernels were 6.2 ms: the GPU waited on the host's 1,461 launches per step, and the 1B draft's step
(7.55 ms against 0.57 ms of bytes) even more. gpt-fast's answer is to capture the step once and replay it. A graph
replays fixed addresses and shapes, so the step is written over the cache's whole buffers (``static_forward``):

- the new rows' keys and values are written at ``positions`` (a device tensor) with ``index_copy_``;
- every query row attends to the whole buffer under a mask that allows exactly the positions up to its own
  (rolled-back and never-written slots are masked; the buffers are zero-initialised, so masked slots hold
  finite values);
- the rotary rows are gathered from the model's own static table at ``positions``;
- grouped-query heads are folded into the query rows (``[kv_heads, groups * n]``), so the keys are never
  repeated in memory.

``GraphedSteps`` keeps one graph per (rows, kept logits) for the cache buffers it was captured on, and captures
again when the buffers grow (they double) or change. It serves causal chains right after the cache (``positions``
and ``mask`` None: the one-token step, a verification chain, a draft step) without hidden-state capture; everything
else goes through ``LeanForward.forward`` as before. Off unless ``PIPELINE_CUDA_GRAPHS=1``: the step is the same
arithmetic over more (masked) keys, so logits match the eager step to rounding, not bit for bit.
``static_forward`` runs eagerly on any device (the CPU tests compare it with the eager step).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

# ``lean`` below is a ``fast_forward.LeanForward`` (typed Any: fast_forward imports this module)
MAX_GRAPH_ROWS = 16  # chains up to this many rows are graphed (a verification of gamma + 1 <= 16 rows)


def _ensure_buffers(lean: Any, cache: Any, end: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's key and value buffers ``[1, kv_heads, capacity, d]`` with room for ``end`` positions."""
    if len(cache.layers) < len(lean._layers) or not cache.layers[0].is_initialized:
        blank = lean._embed[0].weight.new_empty(1, lean.num_kv_heads, 0, lean.head_dim)
        for i in range(len(lean._layers)):
            cache.update(blank, blank, i)
    out = []
    for layer in cache.layers[: len(lean._layers)]:
        layer._reserve(end)
        out.append((layer._k, layer._v))
    return out


def static_forward(
    lean: Any,
    ids: torch.Tensor,
    start: torch.Tensor,
    buffers: list[tuple[torch.Tensor, torch.Tensor]],
    keep: int,
) -> torch.Tensor:
    """Logits ``[1, keep, V]`` of the causal chain ``ids [1, n]`` at positions ``start .. start + n - 1``
    (``start``: a one-element long tensor on the device), attending to each layer's whole buffer under a mask;
    the chain's keys and values are written into the buffers. Fixed shapes and addresses: capturable."""
    n = ids.shape[1]
    device = ids.device
    cap = buffers[0][0].shape[-2]
    positions = start + torch.arange(n, device=device)
    cos_t, sin_t = lean._static_rope_table(cap)
    cos = cos_t.index_select(0, positions)[None, None]  # [1, 1, n, d]
    sin = sin_t.index_select(0, positions)[None, None]
    groups, kvh, d = lean.groups, lean.num_kv_heads, lean.head_dim
    allowed = torch.arange(cap, device=device)[None, :] <= positions[:, None]  # [n, cap]
    mask = allowed.repeat(groups, 1)[None, None]  # [1, 1, groups * n, cap]: query rows are (group, row)
    x = lean._embed[0](ids)
    for (w_in, eps_in, wq, wk, wv, wo, w_post, eps_post, wg, wu, wd, act), (kb, vb) in zip(lean._layers, buffers):
        h = _rms(x, w_in, eps_in)
        q = F.linear(h, *wq).view(1, n, lean.num_heads, d).transpose(1, 2)
        k = F.linear(h, *wk).view(1, n, kvh, d).transpose(1, 2)
        v = F.linear(h, *wv).view(1, n, kvh, d).transpose(1, 2)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        kb.index_copy_(2, positions, k)
        vb.index_copy_(2, positions, v)
        # head h = kv_head * groups + g (transformers' repeat_kv): fold the groups into the query rows
        qg = q.reshape(1, kvh, groups * n, d)
        a = F.scaled_dot_product_attention(qg, kb, vb, attn_mask=mask, scale=lean.scaling)
        a = a.reshape(1, lean.num_heads, n, d).transpose(1, 2).reshape(1, n, -1)
        x = x + F.linear(a, *wo)
        h = _rms(x, w_post, eps_post)
        x = x + F.linear(act(F.linear(h, *wg)) * F.linear(h, *wu), *wd)
    x = _rms(x[:, -keep:], *lean._norm)
    head = lean._head[0]
    return F.linear(x, head.weight, head.bias)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Graph:
    """One captured step: its static inputs and output, and the buffers it was captured on."""

    def __init__(self, lean: Any, buffers, n: int, keep: int, ids: torch.Tensor, start: int) -> None:
        device = ids.device
        self.key = (buffers[0][0].data_ptr(), buffers[0][0].shape[-2])
        self.ids = ids.clone()
        self.start = torch.tensor([start], dtype=torch.long, device=device)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm-up off the capture (lazy initialisations, workspace choices)
            for _ in range(2):
                static_forward(lean, self.ids, self.start, buffers, keep)
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = static_forward(lean, self.ids, self.start, buffers, keep)

    def run(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        self.ids.copy_(ids)
        self.start.fill_(start)
        self.graph.replay()
        return self.out.clone()


class GraphedSteps:
    """The CUDA graphs of one lean forward's causal chains after the cache, per (rows, kept logits)."""

    def __init__(self, lean: Any) -> None:
        self.lean = lean
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.captures = 0  # how many graphs were captured (grown or changed buffers capture again)

    def serves(self, n: int, positions, mask, keep: int, hidden_out) -> bool:
        return positions is None and mask is None and hidden_out is None and 0 < keep <= n <= MAX_GRAPH_ROWS

    def __call__(self, ids: torch.Tensor, cache: Any, keep: int) -> torch.Tensor:
        n = ids.shape[1]
        start = cache.get_seq_length()
        buffers = _ensure_buffers(self.lean, cache, start + n)
        key = (buffers[0][0].data_ptr(), buffers[0][0].shape[-2])
        graph = self.graphs.get((n, keep))
        if graph is None or graph.key != key:
            self.graphs.pop((n, keep), None)  # its private memory goes with it
            graph = self.graphs[(n, keep)] = _Graph(self.lean, buffers, n, keep, ids, start)
            self.captures += 1
        logits = graph.run(ids, start)
        for layer in cache.layers[: len(self.lean._layers)]:
            layer._set_length(start + n)
        return logits
