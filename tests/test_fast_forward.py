"""The lean forward (pipeline/decoding/fast_forward.py) against transformers' own forward.

With the fast matmul off it must give the very same logits and cache (bit for bit) for every way
the engine calls a model: prefill, one token, a causal chain, a tree with a mask; with it on, the
same up to float32 rounding. Models it does not support must fall back to ``model(...)``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

from helpers.models import tiny_llama
from pipeline.decoding import fast_forward
from pipeline.decoding.fast_forward import LeanForward, lean_forward_for, small_linear, unsupported_reason
from pipeline.decoding.kv import CachedModel


def _tiny(kind: str, seed: int = 0):
    """A 2-layer model of ``kind`` (llama with attention bias, llama-mha, qwen2, mistral), GQA unless mha."""
    shape = dict(
        vocab=32,
        hidden=32,
        layers=2,
        max_positions=128,
        heads=4,
        kv_heads=2,
        intermediate=48,
        bos=None,
        eos=None,
        scale=1.0,
    )
    extra = {
        "llama": dict(kind="llama", attention_bias=True),
        "llama-mha": dict(kind="llama", kv_heads=4),
        "qwen2": dict(kind="qwen2", use_sliding_window=False),
        "mistral": dict(kind="mistral", sliding_window=None),
    }[kind]
    return tiny_llama(seed, **{**shape, **extra})


def _tree_mask(n_old: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A 4-node tree (root 0, children 1 and 2 of 0, 3 child of 1) after ``n_old`` tree nodes."""
    tokens = torch.tensor([5, 9, 11, 3])
    parents = [-1, 0, 0, 1]
    mask = torch.zeros(4, 4, dtype=torch.bool)
    depth = []
    for i, p in enumerate(parents):
        mask[i, i] = True
        j = p
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
        depth.append(0 if p < 0 else depth[p] + 1)
    return tokens, torch.tensor(depth), mask


def _script(cm: CachedModel) -> list[torch.Tensor]:
    """Every call the engine makes, in one sequence; returns the logits and the final cache."""
    outs = []
    cm.reset()
    cm.prefill([1, 4, 7, 2, 9, 3, 8])
    outs.append(cm.forward([6], keep=1))
    outs.append(cm.forward([2, 5, 1], keep=3))
    cm.rollback(cm.length - 2)
    outs.append(cm.forward(torch.tensor([12, 13]), keep=2))
    start = cm.length
    tokens, depth, mask = _tree_mask(0)
    outs.append(cm.forward_tree(tokens, start + depth, mask, start))
    cm.compact(start, [0, 1, 3])
    outs.append(cm.forward([4], keep=1))
    layer = cm.cache.layers[0]
    outs += [layer.keys.clone(), layer.values.clone()]
    return outs


@pytest.mark.parametrize("kind", ["llama", "llama-mha", "qwen2", "mistral"])
def test_lean_forward_is_bit_identical_to_transformers_without_fast_matmul(kind, monkeypatch):
    model = _tiny(kind)
    assert unsupported_reason(model) is None
    ref = CachedModel(model, lean=False)
    ours = CachedModel(model)
    assert ours.lean is not None and ref.lean is None
    monkeypatch.setattr(ours.lean, "fast_matmul", False)
    with torch.inference_mode():
        expected, got = _script(ref), _script(ours)
    for a, b in zip(expected, got):
        assert a.shape == b.shape
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fast_matmul_changes_only_rounding(kind, monkeypatch):
    model = _tiny(kind, seed=3)
    ref = CachedModel(model, lean=False)
    ours = CachedModel(model)
    monkeypatch.setattr(ours.lean, "fast_matmul", True)
    with torch.inference_mode():
        expected, got = _script(ref), _script(ours)
    for a, b in zip(expected, got):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_fast_linear_equals_f_linear(rows, bias):
    torch.manual_seed(rows)
    lean = LeanForward(_tiny("llama"))
    lean.fast_matmul = True
    w = torch.randn(40, 24)
    b = torch.randn(40) if bias else None
    x = torch.randn(1, rows, 24)
    y = lean._linear(x, (w, b))
    assert y.shape == (1, rows, 40)
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_hidden_capture_matches_the_lm_head_input():
    model = _tiny("llama", seed=5)
    for lean in (True, False):
        cm = CachedModel(model, lean=lean)
        cm.capture_hidden = True
        with torch.inference_mode():
            cm.prefill([1, 2, 3])
            logits = cm.forward([4, 5], keep=2)
            assert cm.hidden.shape == (2, 32)
            torch.testing.assert_close(F.linear(cm.hidden, model.lm_head.weight), logits, rtol=1e-5, atol=1e-5)
    cm.capture_hidden = False
    with torch.inference_mode():
        cm.forward([6], keep=1)
    assert cm.hidden.shape == (2, 32)  # untouched while capture is off


def test_lean_module_holds_no_parameters_and_takes_hooks():
    model = _tiny("llama")
    before = [name for name, _ in model.named_parameters()]
    lean = lean_forward_for(model)
    assert lean is lean_forward_for(model)  # built once per model
    assert list(lean.parameters()) == [] and list(lean.buffers()) == []
    assert [name for name, _ in model.named_parameters()] == before  # nothing registered on the model either
    assert not any(m is lean for m in model.modules())
    calls = []
    handle = lean.register_forward_hook(lambda *a: calls.append(1))
    cm = CachedModel(model)
    with torch.inference_mode():
        cm.prefill([1, 2])
        cm.forward([3])
    handle.remove()
    assert len(calls) == 2


def test_unsupported_models_and_the_switch_fall_back_to_transformers(monkeypatch):
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=16, n_layer=1, n_head=2, n_positions=64)).eval()
    assert "model_type" in unsupported_reason(gpt2)
    cm = CachedModel(gpt2)
    assert cm.lean is None
    with torch.inference_mode():
        cm.prefill([1, 2, 3])
        assert cm.forward([4, 5], keep=2).shape == (2, 16)

    sliding = _tiny("mistral")
    sliding.config.sliding_window = 16
    assert "sliding" in unsupported_reason(sliding)

    eager = _tiny("llama")
    eager.config._attn_implementation = "eager"
    assert "attention" in unsupported_reason(eager)

    split = _tiny("llama")
    split.hf_device_map = {"model.layers.0": 0, "model.layers.1": 1}
    assert "several devices" in unsupported_reason(split)

    monkeypatch.setenv("PIPELINE_LEAN_FORWARD", "0")
    assert CachedModel(_tiny("llama")).lean is None
    monkeypatch.setenv("PIPELINE_LEAN_FORWARD", "1")
    monkeypatch.setattr(fast_forward, "_LEAN", type(fast_forward._LEAN)())
    assert CachedModel(_tiny("llama")).lean is not None


def test_fast_matmul_only_for_cpu_float32(monkeypatch):
    assert LeanForward(_tiny("llama")).fast_matmul
    assert not LeanForward(_tiny("llama").to(torch.bfloat16)).fast_matmul
    monkeypatch.setenv("PIPELINE_FAST_MATMUL", "0")
    assert not LeanForward(_tiny("llama")).fast_matmul


@pytest.mark.parametrize("shape", [(24,), (3, 24), (1, 2, 24), (2, 5, 24)])
def test_small_linear_matches_f_linear_for_any_leading_shape(shape, monkeypatch):
    torch.manual_seed(len(shape))
    w, b, x = torch.randn(40, 24), torch.randn(40), torch.randn(*shape)
    torch.testing.assert_close(small_linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("PIPELINE_FAST_MATMUL", "0")
    assert torch.equal(small_linear(x, w, b), F.linear(x, w, b))
