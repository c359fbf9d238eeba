"""CUDA graphs of the lean forward's steps: one graph launch instead of ~45 kernel launches per layer.

On an H200 (benchmarks/gpu-random-llama3-8b-1b.md, 2026-11-26) the random 8B target's one-token step took 16.0 ms
of which its kernels were 6.2 ms: the GPU waited on the host's 1,461 launches per step, and the 1B draft's step
(7.55 ms against 0.57 ms of bytes) even more. gpt-fast's answer is to capture the step once and replay it. A graph
replays fixed addresses and shapes, so the step is written over the cache's whole buffers (``static_forward``):

- the new rows' keys and values are written at the cache slots ``start .. start + n - 1`` with ``index_copy_``;
- every query row attends to the whole buffer under a boolean mask: for a causal chain after the cache the
  positions up to its own (computed inside the graph from ``start``), for a masked step (a tree after the
  cache, requests packed into one cache by the batched engine) the caller's mask, copied into a static
  ``[rows, capacity]`` buffer (rolled-back and never-written slots are masked; the buffers are zero-initialised,
  so masked slots hold finite values);
- the rotary rows are gathered from the model's own static table at the rows' positions;
- grouped-query heads are folded into the query rows (``[kv_heads, groups * n]``), so the keys are never
  repeated in memory;
- q, k and v are one matmul, gate and up another (``fused_weights``: the model's parameters become views of the
  fused matrices, so nothing is held twice).

Which steps (``GraphedSteps.serves``): causal chains of up to ``MAX_GRAPH_ROWS`` rows at their own size (the
one-token step, a verification chain, a draft step, a short prefill chunk), and masked steps of up to
``MAX_MASKED_ROWS`` rows padded to the next power of two (tree steps; the batched engine's packed steps in size
buckets; the padding rows write finite keys at slots past the valid length, which the next write overwrites),
with the final hidden rows when the caller asks for them (EAGLE's drafters read them). Layer taps (EAGLE-3) and
longer prefills go through ``LeanForward.forward``.

On by default on CUDA for the static rope types (``PIPELINE_CUDA_GRAPHS=0`` switches it off). The step is the
same arithmetic over more (masked) keys, so logits match the eager step to rounding, not bit for bit.

Buffers that outlive a cache: a new ``Cache`` (a cost probe, the perplexity stage, a reset under another
inference mode) would bring new buffers and every graph would be captured again (two eager warm-up steps and a
capture, ~0.1 s on the 8B target, paid inside a measured window). ``GraphedSteps`` keeps the buffers its graphs
were captured on and hands them to any empty cache of the same model (every layer at length 0: a new
generation), so a model captures each step shape once per buffer size. Two caches of one model are never in use
within one generation (the engine's decoders own one cache per model), which is what makes sharing safe.

Fused small ops (``PIPELINE_COMPILE_STEPS``, on by default with the graphs): the decoder layer of the static step
(RMSNorm, rotary, the KV write, attention, SwiGLU, the residual adds around the matmuls) goes through
``torch.compile`` once per step shape, so the ~1.7 ms of small kernels per 8B step become a few fused ones; the
graph then captures the compiled kernels. A compile that fails falls back to the eager layer with a warning.
``static_forward`` runs eagerly on any device (the CPU tests compare it with the eager step); so does a
``GraphedSteps`` built with ``capture=False`` (the default off CUDA: each "replay" runs the step on its static inputs),
which is how the CPU tests check the launch path below against the eager lean step.

Step-time levers, off by default, for a device run to A/B (``jobs/gpu_levers.py``; ``PIPELINE_GRAPH_LEVERS`` a
comma-separated list, or ``GraphedSteps(levers=...)``), each equal to the plain step up to rounding (tests/
test_graph_levers.py):

- ``window``: attention over the valid prefix only. The step attends to the first ``window`` slots of each buffer
  instead of all ``capacity`` (``window`` = the next power of two >= the step's end, at least ``MIN_WINDOW``), one graph
  per window: at 100 positions in a 1,024-slot buffer the attention reads 128 slots, not 1,024.
- ``mask_copy``: a masked step's inputs handed over in one copy. Today each masked step zeroes the graph's
  ``[rows, capacity]`` mask, copies the caller's mask in, and marks the padding rows' own slots (3-4 small kernels
  on the launch path, plus zeroing the padding ids and positions); with the lever the caller's mask is copied in
  alone and the graph itself masks what lies outside ``[valid rows, start + valid rows]`` (a device scalar, like
  ``start``) and gives the padding rows their own slot.
- ``qkv_epilogue``: the QKV matmul's epilogue in one pass: the rotary of q and k applied to their joint slice of the
  fused output (one rotation instead of two: 5 kernels fewer per layer in an uncompiled graph), the keys and values
  written into the cache straight from it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.nn.functional as F

from .cpu_kernels import env_flag

log = logging.getLogger(__name__)

# ``lean`` below is a ``fast_forward.LeanForward`` (typed Any: fast_forward imports this module)
MAX_GRAPH_ROWS = 16  # causal chains up to this many rows are graphed at their size (a verification of gamma + 1 <= 16)
MAX_MASKED_ROWS = 64  # masked steps (trees, packed batches) up to this many rows, padded to a power of two
GRAPH_CAPACITY = 1024  # the first buffers a graphed model's cache gets (positions; doubled when outgrown)
MIN_WINDOW = 128  # the ``window`` lever's smallest attention window (slots)
LEVERS = ("window", "mask_copy", "qkv_epilogue")  # the step-time levers (module doc), off by default


def parse_levers(text: str | None) -> frozenset[str]:
    """The levers named in ``text`` (comma-separated; None or empty: none); an unknown name is refused."""
    names = frozenset(n.strip() for n in (text or "").split(",") if n.strip())
    unknown = sorted(names - set(LEVERS))
    if unknown:
        raise ValueError(
            f"unknown graph lever(s) {unknown} in PIPELINE_GRAPH_LEVERS: use a comma-separated subset of {list(LEVERS)}"
        )
    return names


def attention_window(end: int, capacity: int) -> int:
    """The ``window`` lever's slots for a step ending at ``end``: the next power of two >= ``end``, at least
    ``MIN_WINDOW``, at most the buffers' ``capacity``."""
    return min(capacity, max(MIN_WINDOW, _bucket(end)))


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


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _layer(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    mask: torch.Tensor,
    kb: torch.Tensor,
    vb: torch.Tensor,
    weights: tuple,
    shape: tuple[int, int, int, int, float],
    act: Any = F.silu,
    fold: bool = False,
) -> torch.Tensor:
    """One decoder layer of the static step over ``x [1, n, hidden]`` (``shape``: heads, kv heads, groups, head
    dim, scaling; ``weights``: ``fused_weights``'s, q/k/v and gate/up as one matrix each); its keys and values are
    written into ``kb`` / ``vb`` at ``slots``. ``fold``: the ``qkv_epilogue`` lever (q and k rotated in one pass)."""
    w_in, eps_in, wqkv, bqkv, wo, bo, w_post, eps_post, wgu, bgu, wd, bd = weights
    heads, kvh, groups, d, scaling = shape
    n = x.shape[1]
    h = _rms(x, w_in, eps_in)
    qkv = F.linear(h, wqkv, bqkv)
    v = qkv[..., (heads + kvh) * d :].view(1, n, kvh, d).transpose(1, 2)
    if fold:  # q and k are adjacent in the fused output: one rotation over both
        qk = qkv[..., : (heads + kvh) * d].view(1, n, heads + kvh, d).transpose(1, 2)
        qk = (qk * cos) + (_rotate_half(qk) * sin)
        q, k = qk[:, :heads], qk[:, heads:]
    else:
        q = qkv[..., : heads * d].view(1, n, heads, d).transpose(1, 2)
        k = qkv[..., heads * d : (heads + kvh) * d].view(1, n, kvh, d).transpose(1, 2)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
    kb.index_copy_(2, slots, k)
    vb.index_copy_(2, slots, v)
    # head h = kv_head * groups + g (transformers' repeat_kv): fold the groups into the query rows
    qg = q.reshape(1, kvh, groups * n, d)
    a = F.scaled_dot_product_attention(qg, kb, vb, attn_mask=mask, scale=scaling)
    a = a.reshape(1, heads, n, d).transpose(1, 2).reshape(1, n, -1)
    x = x + F.linear(a, wo, bo)
    h = _rms(x, w_post, eps_post)
    gu = F.linear(h, wgu, bgu)
    inter = gu.shape[-1] // 2
    return x + F.linear(act(gu[..., :inter]) * gu[..., inter:], wd, bd)


def fused_weights(lean: Any) -> list[tuple]:
    """Each layer's weights with q, k, v as one matrix and gate, up as another (two matmuls fewer per layer, and
    the small k / v matrices no longer read on their own). Made once per model: the model's own q/k/v and gate/up
    parameters become row slices (views) of the fused matrices, so no weight is held twice and transformers'
    forward reads the same numbers."""
    fused = lean.__dict__.get("_fused_weights")
    if fused is not None:
        return fused
    fused = []
    with torch.no_grad(), torch.inference_mode(False):
        for w_in, eps_in, wq, wk, wv, wo, w_post, eps_post, wg, wu, wd, _act in lean._layers:
            wqkv = _fuse([wq[0], wk[0], wv[0]])
            bqkv = None
            if any(b is not None for _, b in (wq, wk, wv)):
                bqkv = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in (wq, wk, wv)])
            if any(b is not None for _, b in (wg, wu)):
                raise ValueError("gate/up projections with biases: not a Llama-family MLP")
            wgu = _fuse([wg[0], wu[0]])
            fused.append((w_in, eps_in, wqkv, bqkv, *wo, w_post, eps_post, wgu, None, *wd))
    lean.__dict__["_fused_weights"] = fused
    return fused


def _fuse(params: list[torch.Tensor]) -> torch.Tensor:
    """The parameters' rows stacked into one matrix; each parameter then holds a view of its rows."""
    whole = torch.cat([p.detach() for p in params])
    row = 0
    for p in params:
        rows = p.shape[0]
        p.data = whole[row : row + rows]
        row += rows
    return whole


_COMPILED: dict[str, Any] = {}


def compiled_layer() -> Any:
    """``_layer`` through ``torch.compile`` (built once; each step shape compiles once, the layers share it)."""
    if "layer" not in _COMPILED:
        import torch._dynamo  # noqa: PLC0415 - heavy: only where layers are compiled

        # one entry per step shape and model (target and draft): more than dynamo's default of 8
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        _COMPILED["layer"] = torch.compile(_layer, dynamic=False)
    return _COMPILED["layer"]


def static_forward(
    lean: Any,
    ids: torch.Tensor,
    start: torch.Tensor,
    buffers: list[tuple[torch.Tensor, torch.Tensor]],
    keep: int,
    positions: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    hidden: bool = False,
    layer: Any = None,
    window: int = 0,
    valid: torch.Tensor | None = None,
    fold: bool = False,
) -> Any:
    """Logits ``[1, keep, V]`` (``keep`` 0: every row) of the rows ``ids [1, n]`` written at the cache slots
    ``start .. start + n - 1`` (``start``: a one-element long tensor on the device), attending to each layer's
    whole buffer under a mask; with ``hidden`` the pair ``(logits, final hidden rows)``.

    ``positions`` None and ``mask`` None: a causal chain after the cache (positions = slots, each row sees the
    slots up to its own). Else ``positions [n]`` (long) and ``mask [n, capacity]`` (bool): the rows' absolute
    positions and the slots each may see. ``layer``: the decoder layer function (``_layer`` or its compiled
    form). Fixed shapes and addresses: capturable. The levers (module doc): ``window`` > 0 attends to the first
    ``window`` slots only (the step must end there); ``valid`` (a one-element long tensor: the real rows, the rest
    padding) makes the step mask the slots outside ``[valid rows, start + valid]`` itself and give each padding row
    its own slot, whatever ``mask`` holds there; ``fold`` rotates q and k in one pass."""
    n = ids.shape[1]
    device = ids.device
    cap = buffers[0][0].shape[-2]
    width = window or cap
    if width < cap:  # views of the buffers' first slots: the attention reads no further
        buffers = [(kb[..., :width, :], vb[..., :width, :]) for kb, vb in buffers]
    slots = start + torch.arange(n, device=device)
    cos_t, sin_t = lean._static_rope_table(cap)
    rows = slots if positions is None else positions
    cos = cos_t.index_select(0, rows)[None, None]  # [1, 1, n, d]
    sin = sin_t.index_select(0, rows)[None, None]
    groups, kvh, d = lean.groups, lean.num_kv_heads, lean.head_dim
    column = torch.arange(width, device=device)[None, :]
    if mask is None:
        mask = column <= slots[:, None]  # [n, width]
    else:
        mask = mask[:, :width]
        if valid is not None:  # the mask_copy lever: what lies outside the caller's rows and slots, set here
            row = torch.arange(n, device=device)[:, None]
            inside = (row < valid) & (column < start + valid)
            mask = torch.where(inside, mask, column == slots[:, None])
    full = mask.repeat(groups, 1)[None, None]  # [1, 1, groups * n, width]: query rows are (group, row)
    shape = (lean.num_heads, kvh, groups, d, lean.scaling)
    step = layer or _layer
    x = lean._embed[0](ids)
    for own, weights, (kb, vb) in zip(lean._layers, fused_weights(lean), buffers):
        # SiLU as the function itself (one compiled entry for every layer), else the layer's own activation
        act = F.silu if lean.silu else own[-1]
        x = step(x, cos, sin, slots, full, kb, vb, weights, shape, act, fold)
    if keep > 0:
        x = x[:, -keep:]
    x = _rms(x, *lean._norm)
    head = lean._head[0]
    logits = F.linear(x, head.weight, head.bias)
    return (logits, x) if hidden else logits


class _Graph:
    """One captured step: its static inputs and outputs, and the buffers it was captured on (``capture`` False: no
    capture, each ``run`` computes the step on the static inputs, as the CPU tests drive it)."""

    def __init__(
        self,
        lean: Any,
        buffers,
        keep: int,
        ids: torch.Tensor,
        start: int,
        masked: bool,
        hidden: bool,
        layer: Any,
        window: int = 0,
        levers: frozenset[str] = frozenset(),
        capture: bool = True,
    ) -> None:
        device = ids.device
        n = ids.shape[1]
        cap = buffers[0][0].shape[-2]
        self.key = (buffers[0][0].data_ptr(), cap)
        self.ids = ids.clone()
        self.start = torch.tensor([start], dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device) if masked else None
        self.mask = torch.zeros(n, cap, dtype=torch.bool, device=device) if masked else None
        # the mask_copy lever: the real rows, a device scalar the step reads (the rest are padding)
        self.valid = torch.tensor([n], dtype=torch.long, device=device) if masked and "mask_copy" in levers else None
        if self.mask is not None:  # a valid mask for the warm-up: each row its own slot
            self.mask[torch.arange(n, device=device), start + torch.arange(n, device=device)] = True
        fold = "qkv_epilogue" in levers

        def run() -> Any:
            return static_forward(
                lean, self.ids, self.start, buffers, keep, self.positions, self.mask, hidden, layer, window, self.valid,
                fold,
            )  # fmt: skip

        self.graph: torch.cuda.CUDAGraph | None = None
        self._step = run
        if not capture:
            return
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm-up off the capture (compilation, lazy initialisations, workspaces)
            for _ in range(2):
                run()
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = run()

    def load(self, ids: torch.Tensor, start: int, positions: torch.Tensor | None, mask: torch.Tensor | None) -> None:
        """The step's inputs into the static tensors: ``ids [1, n]`` (n <= the graph's rows; the rest padding) at
        ``start``, and for a masked step ``positions [n]`` and ``mask [n, start + n]``. Without the mask_copy lever
        the mask buffer is rebuilt here (zeroed, the caller's mask copied in, each padding row given its own slot)
        and the padding ids and positions zeroed; with it the caller's mask is copied in alone (the step masks
        the rest)."""
        n = ids.shape[1]
        rows = self.ids.shape[1]
        self.ids[:, :n].copy_(ids)
        self.start.fill_(start)
        if self.mask is None:
            return
        assert self.positions is not None and positions is not None and mask is not None
        self.positions[:n].copy_(positions.reshape(-1))
        m = self.mask
        if self.valid is not None:
            self.valid.fill_(n)
            m[:n, : start + n].copy_(mask.reshape(n, start + n))
            return
        m.zero_()
        m[:n, : start + n].copy_(mask.reshape(n, start + n))
        if rows > n:  # padding rows: each sees its own slot (finite keys past the valid length)
            pad = torch.arange(n, rows, device=ids.device)
            self.positions[n:].zero_()
            self.ids[:, n:].zero_()
            m[pad, start + pad] = True

    def run(self) -> Any:
        if self.graph is None:
            return self._step()
        self.graph.replay()
        return self.out


def _bucket(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class GraphedSteps:
    """The CUDA graphs of one lean forward's steps, per (rows, kept logits, masked, hidden, attention window), and
    the buffers they were captured on (handed to every new cache of the model). ``levers``: the step-time levers
    (module doc; None: ``PIPELINE_GRAPH_LEVERS``); ``capture``: capture graphs (None: on CUDA), else run each
    step on its graph's static inputs (the CPU tests)."""

    def __init__(
        self,
        lean: Any,
        compile_layers: bool | None = None,
        levers: frozenset[str] | set[str] | None = None,
        capture: bool | None = None,
    ) -> None:
        self.lean = lean
        self.levers = parse_levers(os.environ.get("PIPELINE_GRAPH_LEVERS")) if levers is None else frozenset(levers)
        parse_levers(",".join(self.levers))  # an unknown lever is refused here too
        if capture is None:
            capture = lean._embed[0].weight.device.type == "cuda"
        self.capture = capture
        self.graphs: dict[tuple[int, int, bool, bool, int], _Graph] = {}
        self.captures = 0  # how many graphs were captured (grown or changed buffers capture again)
        self.replays = 0
        self.pool: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # the buffers of the graphs
        if compile_layers is None:
            compile_layers = env_flag("PIPELINE_COMPILE_STEPS")
        self.compile = bool(compile_layers) and lean.silu
        self.compile_error: str | None = None

    def serves(self, n: int, positions, mask, keep: int, hidden_out, taps: tuple = ()) -> bool:
        if taps or n < 1:
            return False
        if positions is None and mask is None:
            return n <= MAX_GRAPH_ROWS and keep <= n and (keep >= 0 or hidden_out is not None)
        if positions is None or mask is None or mask.dtype != torch.bool:
            return False
        return n <= MAX_MASKED_ROWS and (keep == 0 or (keep < 0 and hidden_out is not None) or 0 < keep <= n)

    def _adopt(self, cache: Any) -> None:
        """An empty cache (a new generation) takes the graphs' buffers instead of making its own."""
        pool = self.pool
        if pool is None or not cache.layers or len(cache.layers) < len(pool):
            return
        first = cache.layers[0]
        if not first.is_initialized or first.__dict__.get("_k") is pool[0][0]:
            return
        if pool[0][0].is_inference() and not torch.is_inference_mode_enabled():
            return  # not writable here: the cache keeps its own
        if any(layer.get_seq_length() for layer in cache.layers):
            return
        for layer, (k, v) in zip(cache.layers, pool):
            layer._k, layer._v = k, v

    def prepare(self, cache: Any, end: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The buffers of ``cache`` with room for ``end`` positions: the graphs' own for an empty cache (the first
        cache gets ``GRAPH_CAPACITY`` positions), the cache's otherwise (which then become the graphs')."""
        if not cache.layers or not cache.layers[0].is_initialized:
            if self.pool is None:  # the first cache: buffers big enough that a generation rarely outgrows them
                with torch.inference_mode(False):  # writable in and out of inference mode
                    _ensure_buffers(self.lean, cache, 0)
                    for layer in cache.layers[: len(self.lean._layers)]:
                        layer._k = layer._alloc(layer._k, max(GRAPH_CAPACITY, end))
                        layer._v = layer._alloc(layer._v, max(GRAPH_CAPACITY, end))
            else:
                _ensure_buffers(self.lean, cache, 0)
        self._adopt(cache)
        buffers = _ensure_buffers(self.lean, cache, end)
        if self.pool is None or self.pool[0][0] is not buffers[0][0]:
            self.pool = buffers
        return buffers

    def _layer_fn(self) -> Any:
        return compiled_layer() if self.compile else None

    def __call__(
        self,
        ids: torch.Tensor,
        cache: Any,
        keep: int,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        hidden_out: list | None = None,
    ) -> torch.Tensor | None:
        n = ids.shape[1]
        start = cache.get_seq_length()
        masked = positions is not None
        rows = _bucket(n) if masked else n
        buffers = self.prepare(cache, start + rows)
        hidden = hidden_out is not None
        graph_keep = 0 if masked else (keep if keep > 0 else 0)
        cap = buffers[0][0].shape[-2]
        window = attention_window(start + rows, cap) if "window" in self.levers else 0
        slot = (rows, graph_keep, masked, hidden, window)
        key = (buffers[0][0].data_ptr(), cap)
        graph = self.graphs.get(slot)
        if graph is None or graph.key != key:
            self.graphs.pop(slot, None)  # its private memory goes with it
            graph = self.graphs[slot] = self._capture(buffers, graph_keep, ids, start, rows, masked, hidden, window)
        graph.load(ids, start, positions, mask)
        out = graph.run()
        self.replays += 1
        logits, final = out if hidden else (out, None)
        for layer in cache.layers[: len(self.lean._layers)]:
            layer._set_length(start + n)
        if masked:
            logits = logits[:, :n]
            final = final[:, :n] if final is not None else None
            if keep > 0:
                logits = logits[:, n - keep :]
                final = final[:, n - keep :] if final is not None else None
        if hidden_out is not None and final is not None:
            hidden_out.append(final.clone())
        return None if keep < 0 else logits.clone()

    def _capture(
        self, buffers, keep: int, ids: torch.Tensor, start: int, rows: int, masked: bool, hidden: bool, window: int
    ):
        ids = ids if ids.shape[1] == rows else torch.zeros(1, rows, dtype=ids.dtype, device=ids.device)
        self.captures += 1
        opts = (window, self.levers, self.capture)
        if self.compile:
            try:
                return _Graph(self.lean, buffers, keep, ids, start, masked, hidden, self._layer_fn(), *opts)
            except Exception as err:  # noqa: BLE001 - a compiler that cannot build the layer: the eager layer
                self.compile = False
                self.compile_error = f"{type(err).__name__}: {err}"[:500]
                log.warning("torch.compile of the graphed layer failed (%s): eager layers", self.compile_error)
                if os.environ.get("PIPELINE_COMPILE_STEPS_STRICT"):
                    raise
        return _Graph(self.lean, buffers, keep, ids, start, masked, hidden, None, *opts)
