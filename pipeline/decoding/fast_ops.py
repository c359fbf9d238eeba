"""The lean forward's small float32 operations (``fast_forward.LeanForward`` uses them; ``medusa_heads`` too):
``small_linear`` (``F.linear``, or for a few rows on CPU float32 a transposed matmul that is faster there:
``PIPELINE_FAST_MATMUL``), the rotary half-rotation and RMS norm, and ``compare`` (``python -m
pipeline.decoding.fast_forward`` prints both forms' times on the offline pair's shapes)."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from .cpu_kernels import env_flag

FAST_MATMUL_MAX_ROWS = 8  # above this (prefill), F.linear's gemm is as fast


def small_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, in the fast form for a few rows on CPU float32 (see module doc)."""
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if (
        0 < rows <= FAST_MATMUL_MAX_ROWS
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and x.dtype == torch.float32
        and env_flag("PIPELINE_FAST_MATMUL")
    ):
        return _fast_matmul(x, weight, bias)
    return F.linear(x, weight, bias)


def _fast_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    n = x.numel() // x.shape[-1]
    rows = x.reshape(n, x.shape[-1])
    if n == 1:
        rows = rows.expand(2, -1).contiguous()
    y = (weight @ rows.T).T[:n].reshape(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x.to(dtype)


def compare(model_rows: tuple[int, ...] = (1, 2, 4, 5, 8), reps: int = 9) -> None:
    """Print F.linear vs the fast form on the offline pair's target weights shapes (30 layers)."""
    shapes = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
    weights = [torch.randn(o, i) for _ in range(30) for o, i in shapes]
    head = torch.randn(49152, 576)

    def clock(fn):
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return sorted(times)[reps // 2] * 1e3

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; SmolLM2-135M shapes, fp32, ms per forward")
    print("rows | F.linear layers | fast layers | F.linear head | fast head")
    for n in model_rows:
        xs = {576: torch.randn(1, n, 576), 1536: torch.randn(1, n, 1536)}
        lin = clock(lambda: [F.linear(xs[w.shape[1]], w) for w in weights])
        fst = clock(lambda: [_fast_matmul(xs[w.shape[1]], w, None) for w in weights])
        hl = clock(lambda: F.linear(xs[576], head))
        hf = clock(lambda: _fast_matmul(xs[576], head, None))
        print(f"{n:4d} | {lin:15.1f} | {fst:11.1f} | {hl:13.1f} | {hf:9.1f}")
