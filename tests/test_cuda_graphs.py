"""CUDA graphs of the lean forward's short steps (pipeline/decoding/cuda_graphs.py).

The graphed step is ``static_forward``: the same arithmetic as the lean forward's causal chain, written over the
cache's whole buffers under a mask. It runs eagerly on any device, so the CPU checks it against the eager step
(logits and cache) after a prefill, a rollback that leaves stale slots, and for one token and a chain; the
capture and replay themselves need a GPU (marked ``gpu``).
"""

from __future__ import annotations

import pytest
import torch

from helpers.models import tiny_llama
from pipeline.decoding import build_decoder
from pipeline.decoding.cuda_graphs import GraphedSteps, _ensure_buffers, static_forward
from pipeline.decoding.fast_forward import lean_forward_for
from pipeline.decoding.kv import CachedModel


def _model(kind: str = "llama", kv_heads: int = 2, device: str = "cpu", dtype=torch.float32, **extra):
    model = tiny_llama(
        3,
        vocab=40,
        hidden=32,
        layers=2,
        max_positions=512,
        heads=4,
        kv_heads=kv_heads,
        intermediate=48,
        kind=kind,
        **extra,
    )
    return model.to(device=device, dtype=dtype)


@pytest.mark.parametrize("kind,kv_heads", [("llama", 1), ("llama", 2), ("llama", 4), ("qwen2", 2), ("mistral", 2)])
@pytest.mark.parametrize("n,keep", [(1, 1), (5, 5), (4, 1)])
def test_the_static_step_equals_the_eager_step(kind, kv_heads, n, keep):
    """After a 20-token prefill and a rollback of 6 (stale slots stay in the buffers), the static step's logits and
    cache equal the eager lean step's, for grouped-query (1, 2 kv heads) and plain multi-head attention, and for
    Qwen2 (biases on q, k, v) and Mistral."""
    extra = {"qwen2": {"use_sliding_window": False}, "mistral": {"sliding_window": None}}.get(kind, {})
    model = _model(kind=kind, kv_heads=kv_heads, **extra)
    lean = lean_forward_for(model)
    assert lean is not None
    prompt = [int(t) for t in torch.randint(0, 40, (20,), generator=torch.Generator().manual_seed(1))]
    chain = torch.tensor([[7, 3, 9, 1, 22][:n]])
    eager, static = CachedModel(model), CachedModel(model)
    with torch.inference_mode():
        for cm in (eager, static):
            cm.prefill(prompt)
            cm.rollback(14)
        want = eager.forward(chain[0], keep=keep)
        start = static.length
        buffers = _ensure_buffers(lean, static.cache, start + n)
        got = static_forward(lean, chain, torch.tensor([start]), buffers, keep)
        for layer in static.cache.layers:
            layer._set_length(start + n)
    assert got.shape == (1, keep, 40) and want.shape == (keep, 40)  # CachedModel.forward: [rows, V]
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-5)
    for a, b in zip(eager.cache.layers, static.cache.layers):
        torch.testing.assert_close(a.keys, b.keys)
        torch.testing.assert_close(a.values, b.values)


def test_graphs_are_off_unless_asked_and_never_on_a_cpu(monkeypatch):
    monkeypatch.setenv("PIPELINE_CUDA_GRAPHS", "1")
    assert lean_forward_for(_model()).graphs is None  # a CPU model: nothing to capture
    graphs = GraphedSteps(lean_forward_for(_model()))
    assert graphs.serves(1, None, None, 1, None) and graphs.serves(5, None, None, 5, None)
    assert not graphs.serves(5, torch.arange(5)[None], None, 5, None)  # a tree (positions) goes the eager way
    assert not graphs.serves(1, None, None, 1, [])  # hidden-state capture too
    assert not graphs.serves(300, None, None, 1, None)  # a prefill too


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("method", ["ar", "spd"])
def test_graphed_decoding_equals_eager_decoding_on_cuda(monkeypatch, method):
    """Greedy decoding with the steps replayed as graphs gives the eager engine's tokens (fp32, a tiny pair), and
    the graphs were captured and replayed (buffers growing past 256 positions capture again)."""
    outs = {}
    for graphs in ("0", "1"):
        monkeypatch.setenv("PIPELINE_CUDA_GRAPHS", graphs)
        target, draft = _model(device="cuda"), _model(kv_heads=1, device="cuda")
        params = {"gamma": 3} if method == "spd" else {}
        dec = build_decoder(method, target, draft if method == "spd" else None, temperature=0.0, **params)
        outs[graphs] = dec.generate(list(range(1, 30)), max_new_tokens=260, eos_token_ids=[]).tokens
        lean = lean_forward_for(target)
        assert (lean.graphs is not None) == (graphs == "1")
        if lean.graphs is not None:
            assert lean.graphs.captures >= 2 and lean.graphs.graphs
    assert outs["0"] == outs["1"]
