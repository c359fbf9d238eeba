"""CUDA graphs of the lean forward's short steps (pipeline/decoding/cuda_graphs.py).

The graphed step is ``static_forward``: the same arithmetic as the lean forward's causal chain or masked step, written
over the cache's whole buffers under a mask. It runs eagerly on any device, so the CPU checks it against the eager
step (logits, hidden rows and cache) after a prefill, a rollback that leaves stale slots, for one token, a chain and a
tree padded to its bucket, and checks the buffers' hand-over to new caches; the capture and replay themselves need a
GPU (marked ``gpu``).
"""

from __future__ import annotations

import pytest
import torch

from helpers.models import tiny_llama
from pipeline.decoding import build_decoder
from pipeline.decoding.cuda_graphs import GraphedSteps, _ensure_buffers, compiled_layer, fused_weights, static_forward
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


def test_graphs_are_on_by_default_on_cuda_only_and_serve_the_steps_they_can(monkeypatch):
    monkeypatch.delenv("PIPELINE_CUDA_GRAPHS", raising=False)
    assert lean_forward_for(_model()).graphs is None  # a CPU model: nothing to capture
    graphs = GraphedSteps(lean_forward_for(_model()), compile_layers=False)
    assert graphs.serves(1, None, None, 1, None) and graphs.serves(5, None, None, 5, None)
    assert graphs.serves(5, None, None, 5, [])  # a chain whose hidden rows an EAGLE drafter reads
    tree_mask = torch.ones(1, 1, 5, 25, dtype=torch.bool)
    assert graphs.serves(5, torch.arange(5)[None], tree_mask, 0, None)  # a tree step (positions, mask)
    assert graphs.serves(40, torch.arange(40)[None], tree_mask, -1, [])  # a packed batch step, hidden rows
    assert not graphs.serves(65, torch.arange(65)[None], tree_mask, 0, None)  # past the largest bucket
    assert not graphs.serves(5, torch.arange(5)[None], tree_mask.float(), 0, None)  # an additive mask
    assert not graphs.serves(5, None, None, 5, [], taps=(1,))  # EAGLE-3's layer taps go the eager way
    assert not graphs.serves(300, None, None, 1, None)  # a long prefill too


def _prefilled(model, prompt, rollback):
    cm = CachedModel(model)
    cm.prefill(prompt)
    cm.rollback(rollback)
    return cm


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("n,bucket", [(3, 4), (5, 8), (8, 8)])
def test_the_static_masked_step_equals_the_eager_masked_step(kv_heads, n, bucket):
    """A tree step (rows at tree positions, each seeing the cache and its ancestors) padded to its bucket: the real
    rows' logits, hidden rows and keys equal the eager lean step's; the padding rows leave finite keys past the
    valid length."""
    model = _model(kv_heads=kv_heads)
    lean = lean_forward_for(model)
    prompt = [int(t) for t in torch.randint(0, 40, (20,), generator=torch.Generator().manual_seed(2))]
    tokens = torch.tensor([5, 8, 13, 2, 30, 11, 7, 19][:n])
    parents = [-1, 0, 0, 1, 1, 2, 3, 4][:n]
    with torch.inference_mode():
        eager, static = _prefilled(model, prompt, 14), _prefilled(model, prompt, 14)
        start = eager.length
        depth = [0] * n
        node = torch.eye(n, dtype=torch.bool)
        for i, p in enumerate(parents):
            if p >= 0:
                depth[i] = depth[p] + 1
                node[i] |= node[p]
        positions = torch.tensor([start + d for d in depth])
        allowed = torch.ones(n, start + n, dtype=torch.bool)
        allowed[:, start:] = node
        eager.capture_hidden = True
        want = eager.forward_masked(tokens, positions, allowed)
        want_hidden = eager.final_hidden
        buffers = _ensure_buffers(lean, static.cache, start + bucket)
        cap = buffers[0][0].shape[-2]
        ids = torch.zeros(1, bucket, dtype=torch.long)
        ids[0, :n] = tokens
        pos = torch.zeros(bucket, dtype=torch.long)
        pos[:n] = positions
        mask = torch.zeros(bucket, cap, dtype=torch.bool)
        mask[:n, : start + n] = allowed
        pad = torch.arange(n, bucket)
        mask[pad, start + pad] = True
        logits, hidden = static_forward(lean, ids, torch.tensor([start]), buffers, 0, pos, mask, hidden=True)
    torch.testing.assert_close(logits[0, :n], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden[0, :n], want_hidden[:n], rtol=1e-5, atol=1e-5)
    for a, (kb, vb) in zip(eager.cache.layers, buffers):
        torch.testing.assert_close(a.keys, kb[..., : start + n, :])
        torch.testing.assert_close(a.values, vb[..., : start + n, :])
        assert torch.isfinite(kb).all() and torch.isfinite(vb).all()


def test_a_new_empty_cache_takes_the_graphs_buffers_and_a_used_one_keeps_its_own():
    """The buffers the graphs were captured on outlive a cache: a new generation's empty cache (a cost probe's,
    a reset's) takes them, so nothing is captured again; a cache holding positions, or buffers it cannot
    write (inference tensors outside inference mode), keeps its own."""
    model = _model()
    graphs = GraphedSteps(lean_forward_for(model), compile_layers=False)
    first = CachedModel(model)
    buffers = graphs.prepare(first.cache, 5)
    assert buffers[0][0].shape[-2] >= 1024 and graphs.pool is not None
    assert not buffers[0][0].is_inference()
    with torch.inference_mode():
        second = CachedModel(model)
        second.prefill([1, 2, 3])  # its own 256-position buffers, then a new generation
        second.reset()
        assert graphs.prepare(second.cache, 4)[0][0] is buffers[0][0]
        third = CachedModel(model)
        third.prefill([1, 2, 3])
        own = third.cache.layers[0]._k
        assert graphs.prepare(third.cache, 8)[0][0] is own  # 3 positions held: not adopted
    graphs.pool = [(own, own)] * len(graphs.pool)  # inference tensors
    fourth = CachedModel(model)
    fourth.prefill([1])
    fourth.reset()
    assert graphs.prepare(fourth.cache, 4)[0][0] is not own


@pytest.mark.slow
def test_the_compiled_layer_equals_the_eager_layer():
    """``torch.compile`` of the graphed layer (fused small ops) gives the eager layer's logits and keys (float32,
    Inductor's CPU code here; Triton on a GPU). Opt-in: the compile took 234 s on this CPU beside other jobs."""
    model = _model(kv_heads=2)
    lean = lean_forward_for(model)
    prompt = list(range(1, 21))
    with torch.inference_mode():
        outs = []
        for layer in (None, compiled_layer()):
            cm = _prefilled(model, prompt, 14)
            buffers = _ensure_buffers(lean, cm.cache, 19)
            outs.append(
                (
                    static_forward(lean, torch.tensor([[7, 3, 9, 1, 22]]), torch.tensor([14]), buffers, 5, layer=layer),
                    buffers,
                )
            )
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[0][1][0][0][..., :19, :], outs[1][1][0][0][..., :19, :], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("method", ["ar", "spd", "specinfer"])
def test_graphed_decoding_equals_eager_decoding_on_cuda(monkeypatch, method):
    """Greedy decoding with the steps replayed as graphs gives the eager engine's tokens (fp32, a tiny pair), and
    the graphs were captured and replayed."""
    outs = {}
    for graphs in ("0", "1"):
        monkeypatch.setenv("PIPELINE_CUDA_GRAPHS", graphs)
        target, draft = _model(device="cuda"), _model(kv_heads=1, device="cuda")
        params = {"spd": {"gamma": 3}, "specinfer": {"k_config": [2, 2, 1]}}.get(method, {})
        dec = build_decoder(method, target, draft if method != "ar" else None, temperature=0.0, **params)
        outs[graphs] = dec.generate(list(range(1, 30)), max_new_tokens=260, eos_token_ids=[]).tokens
        lean = lean_forward_for(target)
        assert (lean.graphs is not None) == (graphs == "1")
        if lean.graphs is not None:
            # captured once per step shape on buffers a generation of 289 positions does not outgrow, replayed
            # for every later step
            assert lean.graphs.captures >= 1 and lean.graphs.graphs and lean.graphs.replays >= 100
    assert outs["0"] == outs["1"]


def test_fused_projections_are_the_models_own_weights_held_once():
    """q/k/v and gate/up fused for the graphed layer: the model's parameters become views of the fused matrices
    (same numbers, one copy), and transformers' forward gives the logits it gave before."""
    model = _model(kind="qwen2", use_sliding_window=False)  # biases on q, k, v
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        before = model(ids).logits
        q = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
        fused = fused_weights(lean_forward_for(model))
        after = model(ids).logits
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    wqkv, bqkv, wgu = fused[0][2], fused[0][3], fused[0][8]
    assert attn.q_proj.weight.data_ptr() == wqkv.data_ptr() and torch.equal(attn.q_proj.weight, q)
    assert attn.v_proj.weight.untyped_storage().data_ptr() == wqkv.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == wgu.untyped_storage().data_ptr()
    assert torch.equal(bqkv[: q.shape[0]], attn.q_proj.bias)
    assert fused_weights(lean_forward_for(model)) is fused
    torch.testing.assert_close(before, after, rtol=0, atol=0)
