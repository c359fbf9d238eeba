"""The graphed step's levers (pipeline/decoding/cuda_graphs.py: ``window``, ``mask_copy``, ``qkv_epilogue``), off by
default, each equal to the plain step: the static step with each lever against the plain static step (logits and
keys), the launch path (``GraphedSteps`` with ``capture=False``: each "replay" runs the step on its graph's static
inputs, as on CPU) decoding the eager engine's tokens with every lever, the mask handed over in one copy, and the same
on CUDA with the graphs captured (marked ``gpu``)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.models import tiny_llama
from pipeline.decoding import build_decoder
from pipeline.decoding.batched import BatchedDecoder
from pipeline.decoding.cuda_graphs import (
    LEVERS,
    MIN_WINDOW,
    GraphedSteps,
    _ensure_buffers,
    _Graph,
    attention_window,
    parse_levers,
    static_forward,
)
from pipeline.decoding.fast_forward import lean_forward_for
from pipeline.decoding.kv import CachedModel

ALL_SETS = [frozenset(c) for r in range(len(LEVERS) + 1) for c in itertools.combinations(LEVERS, r)]


def _model(seed=3, kv_heads=2, device="cpu"):
    return tiny_llama(
        seed, vocab=40, hidden=32, layers=2, max_positions=512, heads=4, kv_heads=kv_heads, intermediate=48
    ).to(device)


def test_levers_parse_and_refuse_unknown_names(monkeypatch):
    assert parse_levers(None) == frozenset() and parse_levers(" ") == frozenset()
    assert parse_levers("window, mask_copy") == {"window", "mask_copy"}
    with pytest.raises(ValueError, match="unknown graph lever.*'windows'.*comma-separated subset"):
        parse_levers("windows")
    model = _model()
    monkeypatch.setenv("PIPELINE_GRAPH_LEVERS", "qkv_epilogue")
    assert GraphedSteps(lean_forward_for(model), compile_layers=False).levers == {"qkv_epilogue"}
    monkeypatch.delenv("PIPELINE_GRAPH_LEVERS")
    assert GraphedSteps(lean_forward_for(model), compile_layers=False).levers == frozenset()  # off by default
    with pytest.raises(ValueError, match="unknown graph lever"):
        GraphedSteps(lean_forward_for(model), levers={"fast"})


def test_the_attention_window_is_the_next_power_of_two_within_the_buffers():
    assert attention_window(1, 1024) == MIN_WINDOW == 128
    assert attention_window(128, 1024) == 128 and attention_window(129, 1024) == 256
    assert attention_window(700, 1024) == 1024 and attention_window(700, 800) == 800


def _prefilled(model, prompt, length):
    cm = CachedModel(model)
    cm.prefill(prompt)
    cm.rollback(length)  # stale slots stay in the buffers past the valid length
    return cm


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize(
    "levers", [{"window"}, {"qkv_epilogue"}, {"window", "qkv_epilogue"}], ids=lambda s: "+".join(sorted(s))
)
def test_a_chain_step_with_levers_equals_the_plain_static_step(kv_heads, levers):
    """A five-token chain after 150 positions (window 256 of the 1,024-slot buffer): logits and keys as the plain
    static step's."""
    model = _model(kv_heads=kv_heads)
    lean = lean_forward_for(model)
    prompt = [int(t) for t in torch.randint(0, 40, (160,), generator=torch.Generator().manual_seed(4))]
    chain = torch.tensor([[7, 3, 9, 1, 22]])
    outs = []
    with torch.inference_mode():
        for on in (frozenset(), frozenset(levers)):
            cm = _prefilled(model, prompt, 150)
            buffers = _ensure_buffers(lean, cm.cache, 1024)
            window = attention_window(155, 1024) if "window" in on else 0
            logits = static_forward(
                lean, chain, torch.tensor([150]), buffers, 5, window=window, fold="qkv_epilogue" in on
            )
            outs.append((logits, [(k[..., :155, :].clone(), v[..., :155, :].clone()) for k, v in buffers]))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-5)
    for (k0, v0), (k1, v1) in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(k1, k0, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v1, v0, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("levers", [s for s in ALL_SETS if s], ids=lambda s: "+".join(sorted(s)))
def test_a_padded_tree_step_through_the_graph_with_levers_equals_the_plain_one(levers):
    """A five-node tree padded to eight rows after 20 positions, loaded into a graph's static inputs whose mask,
    ids and positions hold another step's leftovers: the real rows' logits and keys equal the plain graph's, whose
    inputs were clean (with mask_copy the step itself masks the leftovers)."""
    model = _model()
    lean = lean_forward_for(model)
    prompt = [int(t) for t in torch.randint(0, 40, (26,), generator=torch.Generator().manual_seed(2))]
    tokens = torch.tensor([[5, 8, 13, 2, 30]])
    parents = [-1, 0, 0, 1, 1]
    start, n = 20, 5
    depth, node = [0] * n, torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            depth[i], node[i] = depth[p] + 1, node[i] | node[p]
    positions = torch.tensor([start + d for d in depth])
    allowed = torch.ones(n, start + n, dtype=torch.bool)
    allowed[:, start:] = node
    outs = []
    with torch.inference_mode():
        for on in (frozenset(), levers):
            cm = _prefilled(model, prompt, start)
            buffers = _ensure_buffers(lean, cm.cache, 1024)
            window = attention_window(start + 8, 1024) if "window" in on else 0
            graph = _Graph(
                lean, buffers, 0, torch.zeros(1, 8, dtype=torch.long), 0, True, True, None, window, on, False
            )
            graph.mask.fill_(True)  # another step's leftovers everywhere
            graph.positions.fill_(3)
            graph.ids.fill_(9)
            graph.load(tokens, start, positions, allowed)
            logits, hidden = graph.run()
            outs.append((logits[0, :n], hidden[0, :n], [k[..., : start + n, :].clone() for k, _ in buffers]))
            assert all(torch.isfinite(k).all() and torch.isfinite(v).all() for k, v in buffers)
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=1e-5, atol=1e-5)
    for a, b in zip(outs[0][2], outs[1][2]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


VIEWS = {"slice", "view", "reshape", "_reshape_alias", "select", "alias", "detach", "as_strided", "unsqueeze", "expand"}


class _Ops(TorchDispatchMode):
    """The aten ops run inside that write or make a tensor (views left out: they launch nothing), by name."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in VIEWS:
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_mask_copy_hands_the_mask_over_in_one_copy():
    """Loading a padded masked step: the plain path zeroes the mask, copies the caller's in and writes the padding
    rows' slots (and zeroes the padding ids and positions); with mask_copy the only op on the mask is one copy."""
    model = _model()
    lean = lean_forward_for(model)
    ops = {}
    with torch.inference_mode():
        cm = _prefilled(model, list(range(1, 21)), 20)
        buffers = _ensure_buffers(lean, cm.cache, 1024)
        for on in (frozenset(), frozenset({"mask_copy"})):
            graph = _Graph(lean, buffers, 0, torch.zeros(1, 8, dtype=torch.long), 0, True, False, None, 0, on, False)
            step = (torch.tensor([[5, 8, 13]]), 20, torch.tensor([20, 21, 21]), torch.ones(3, 23, dtype=torch.bool))
            with _Ops() as seen:
                graph.load(*step)
            ops[on] = seen.ops
    plain, lever = ops[frozenset()], ops[frozenset({"mask_copy"})]
    # ids, start, positions; the mask zeroed, copied, its padding rows' slots (arange, add, a True lifted, index_put_);
    # the padding ids and positions zeroed
    mask_ops = ["zero_", "copy_", "arange", "add", "lift_fresh", "index_put_"]
    assert sorted(plain) == sorted(["copy_", "fill_", "copy_", *mask_ops, "zero_", "zero_"])
    # ids, start, positions, the real rows' count, the mask in one copy
    assert sorted(lever) == sorted(["copy_", "fill_", "copy_", "fill_", "copy_"])


def _decode(target, draft, method, params, levers, graphs=True, capture=False, batch=0):
    """Greedy tokens of ``method`` with the target's and draft's steps through ``GraphedSteps`` (``levers``), or the
    eager lean steps (``graphs`` False); ``batch`` > 0: three prompts through the batched loop (packed masked
    steps)."""
    for model in (target, draft):
        lean = lean_forward_for(model)
        lean.graphs = GraphedSteps(lean, compile_layers=False, levers=levers, capture=capture) if graphs else None
    dec = build_decoder(method, target, draft if method != "ar" else None, temperature=0.0, **params)
    prompt = list(range(1, 30))
    if batch:
        prompts = [prompt, prompt[3:], prompt[:7]]
        out = BatchedDecoder(dec, batch).generate(prompts, max_new_tokens=40, eos_token_ids=[])
        return [g.tokens for g in out], lean_forward_for(target).graphs
    tokens = dec.generate(prompt, max_new_tokens=120, eos_token_ids=[]).tokens
    return tokens, lean_forward_for(target).graphs


CASES = [("ar", {}, 0), ("spd", {"gamma": 3}, 0), ("specinfer", {"k_config": [2, 2, 1]}, 0), ("spd", {"gamma": 2}, 3)]


@pytest.mark.parametrize("method,params,batch", CASES, ids=["ar", "spd", "specinfer", "spd-batch3"])
def test_decoding_through_the_launch_path_with_every_lever_gives_the_eager_tokens(method, params, batch):
    """ar and spd (chains), specinfer (tree steps, masked and padded) and spd at batch 3 (packed masked steps) over
    120 / 40 new tokens, past the first window: the eager engine's greedy tokens with the levers off and with every
    combination on, the steps served by the graphs (one graph per window where the window lever is on)."""
    target, draft = _model(), _model(seed=4, kv_heads=1)
    try:
        want, _ = _decode(target, draft, method, params, frozenset(), graphs=False, batch=batch)
        for levers in ALL_SETS:
            got, graphs = _decode(target, draft, method, params, levers, batch=batch)
            assert got == want, sorted(levers)
            assert graphs.replays >= 30
            windows = {slot[-1] for slot in graphs.graphs}
            if "window" not in levers:
                assert windows == {0}
            elif batch:  # the packed cache holds three requests: it passes more windows
                assert 0 not in windows and {MIN_WINDOW, 2 * MIN_WINDOW} <= windows
            else:
                assert windows == {MIN_WINDOW, 2 * MIN_WINDOW}, sorted(levers)
    finally:
        for model in (target, draft):
            lean_forward_for(model).graphs = None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method,params,batch", CASES, ids=["ar", "spd", "specinfer", "spd-batch3"])
def test_captured_graphs_with_every_lever_give_the_eager_tokens_on_cuda(method, params, batch):
    """The same on CUDA with the graphs captured and replayed (fp32, uncompiled layers)."""
    target, draft = _model(device="cuda"), _model(seed=4, kv_heads=1, device="cuda")
    want, _ = _decode(target, draft, method, params, frozenset(), graphs=False, batch=batch)
    for levers in ALL_SETS:
        got, graphs = _decode(target, draft, method, params, levers, capture=True, batch=batch)
        assert got == want, sorted(levers)
        assert graphs.captures >= 1 and graphs.replays >= 30
