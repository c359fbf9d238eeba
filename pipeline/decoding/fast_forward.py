"""A lean batch-1 forward for Llama-family models, used by ``CachedModel`` (gpt-fast style).

The same weights, the same operations in the same order as transformers' ``modeling_llama`` with
SDPA attention, without the per-call machinery around them (output dataclasses, mask factories,
kwargs plumbing, per-module hooks): on the offline pair that machinery is ~10% of a target step
and ~40% of a draft step. With ``fast_matmul`` off the logits are bit-for-bit those of
``model(...)`` (tests/test_fast_forward.py).

``fast_matmul`` (on by default, CPU float32 only): a small-batch ``x @ W^T`` is computed as
``(W @ X^T)^T`` with X holding at least two rows (a single row is duplicated). On the CPUs we
measured, MKL's fp32 gemv (one row) and skinny-gemm (2-8 rows) paths behind ``F.linear`` stream the
weights at a third of the speed of this form (`python -m pipeline.decoding.fast_forward` prints the
comparison on the machine at hand). Results differ from ``F.linear`` by float32 rounding only.

Supported: ``llama``, ``mistral`` and ``qwen2`` checkpoints with full (not sliding-window) attention,
SDPA, ``pretraining_tp == 1``. Anything else goes through transformers' own forward. Set
``PIPELINE_LEAN_FORWARD=0`` to always use transformers' forward, ``PIPELINE_FAST_MATMUL=0`` to keep
``F.linear`` inside the lean forward, ``PIPELINE_CUDA_GRAPHS=0`` to run the steps on a GPU without CUDA graphs
(on by default there: ``cuda_graphs.py``), ``PIPELINE_COMPILE_STEPS=0`` to keep the graphed layers uncompiled,
``PIPELINE_GRAPH_LEVERS=...`` to turn on the graphed step's levers (``cuda_graphs.py``; off by default).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .cpu_kernels import env_flag, fallback_path, kernels, kernels_isa
from .cuda_graphs import GraphedSteps
from .fast_ops import FAST_MATMUL_MAX_ROWS, _fast_matmul, _rms_norm, _rotate_half, compare, small_linear  # noqa: F401

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
# rope types whose cos/sin depend on the position alone (a table computed once serves every step)
STATIC_ROPE_TYPES = ("default", "linear", "llama3")

_NO_MASK = torch.empty(0, dtype=torch.bool)  # the kernels' "causal" mask argument
_NO_MAP = torch.empty(0, dtype=torch.long)  # the kernels' "full head" token map argument

Linear = tuple[torch.Tensor, torch.Tensor | None]  # (weight, bias)
# one decoder layer's weights: input norm weight and epsilon, q, k, v, o, post-attention norm weight and epsilon,
# gate, up, down, the MLP's activation
LayerWeights = tuple[
    torch.Tensor,
    float,
    Linear,
    Linear,
    Linear,
    Linear,
    torch.Tensor,
    float,
    Linear,
    Linear,
    Linear,
    Callable[[torch.Tensor], torch.Tensor],
]

_LEAN: "weakref.WeakKeyDictionary[nn.Module, LeanForward | None]" = weakref.WeakKeyDictionary()


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model`` cannot use the lean forward (None when it can)."""
    config = getattr(model, "config", None)
    if config is None:
        return "no config"
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {config.model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {getattr(config, '_attn_implementation', None)!r} (lean forward mirrors sdpa)"
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        layer_types = getattr(config, "layer_types", None) or []
        if config.model_type != "qwen2" or any(t != "full_attention" for t in layer_types):
            return "sliding-window attention"
    device_map = getattr(model, "hf_device_map", None) or {}
    if len(set(device_map.values())) > 1:
        return "dispatched over several devices (accelerate hooks move tensors between them)"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "not a *ForCausalLM with .model.layers"
    if not isinstance(getattr(model, "lm_head", None), nn.Linear) or not isinstance(inner.embed_tokens, nn.Embedding):
        return "LM head or embedding is not a plain Linear/Embedding"
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        if attn is None or any(hasattr(attn, n) for n in ("q_norm", "k_norm")):
            return "attention with q/k norms"
        if not all(isinstance(getattr(layer.mlp, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")):
            return "MLP is not gate/up/down"
    return None


def lean_forward_for(model: nn.Module) -> "LeanForward | None":
    """The lean forward of ``model`` (built once per model), or None when it cannot or must not be used."""
    if not env_flag("PIPELINE_LEAN_FORWARD"):
        return None
    if model in _LEAN:
        return _LEAN[model]
    lean = LeanForward(model) if unsupported_reason(model) is None else None
    _LEAN[model] = lean
    return lean


def model_kernel_path(model: nn.Module) -> str:
    """The kernels ``model``'s cached steps run on: its lean forward's path, or transformers' own forward."""
    lean = lean_forward_for(model)
    if lean is not None:
        return lean.kernel_path
    param = next(model.parameters())
    name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(param.dtype, str(param.dtype))
    return f"transformers-{param.device.type}-{name}"


class LeanForward(nn.Module):
    """``forward(input_ids [1, n], cache, positions [1, n], mask, keep) -> logits [1, keep, V]``.

    An ``nn.Module`` only so that timing hooks can be registered on it (the benchmark does); it holds
    references to the model's parameters, not copies, and registers none of them.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        # transformers' config and decoder: their fields and submodules are read by name, untyped
        config: Any = model.config
        inner: Any = model.model
        lm_head: Any = model.lm_head
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.groups = self.num_heads // self.num_kv_heads
        self.scaling = self.head_dim**-0.5
        self.intermediate = config.intermediate_size
        # plain Python containers: nothing is registered on this module
        self._embed: list[nn.Embedding] = [inner.embed_tokens]
        self._rotary: list[nn.Module] = [inner.rotary_emb]
        self._layers: list[LayerWeights] = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            self._layers.append(
                (
                    layer.input_layernorm.weight,
                    layer.input_layernorm.variance_epsilon,
                    (a.q_proj.weight, a.q_proj.bias),
                    (a.k_proj.weight, a.k_proj.bias),
                    (a.v_proj.weight, a.v_proj.bias),
                    (a.o_proj.weight, a.o_proj.bias),
                    layer.post_attention_layernorm.weight,
                    layer.post_attention_layernorm.variance_epsilon,
                    (m.gate_proj.weight, m.gate_proj.bias),
                    (m.up_proj.weight, m.up_proj.bias),
                    (m.down_proj.weight, m.down_proj.bias),
                    m.act_fn,
                )
            )
        self._norm: tuple[torch.Tensor, float] = (inner.norm.weight, inner.norm.variance_epsilon)
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None
        self._head: list[nn.Linear] = [lm_head]
        device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        self.fast_matmul = device.type == "cpu" and dtype == torch.float32 and env_flag("PIPELINE_FAST_MATMUL")
        self.kernels = None
        # the kernels cover SiLU MLPs without biases outside q/k/v (Llama, Mistral, Qwen2)
        plain = all(
            wo[1] is None and wg[1] is None and wu[1] is None and wd[1] is None
            for *_, wo, _, _, wg, wu, wd, _ in self._layers
        )
        if (
            device.type == "cpu"
            and dtype == torch.bfloat16
            and getattr(config, "hidden_act", "silu") == "silu"
            and plain
        ):
            self.kernels = kernels()
        if self.kernels is not None:
            self._pack(model)
        # SiLU in every MLP (the graphed step's compiled layer calls F.silu itself)
        self.silu = all(
            isinstance(act, nn.SiLU) or getattr(act, "__name__", "") == "silu" or type(act).__name__ == "SiLUActivation"
            for *_, act in self._layers
        )
        # CUDA graphs of the short steps (decoding/cuda_graphs.py), on by default on CUDA: PIPELINE_CUDA_GRAPHS=0
        # switches them off
        self.graphs: GraphedSteps | None = None
        rope_type = getattr(inner.rotary_emb, "rope_type", None)
        if device.type == "cuda" and env_flag("PIPELINE_CUDA_GRAPHS") and rope_type in STATIC_ROPE_TYPES:
            self.graphs = GraphedSteps(self)

    @property
    def kernel_path(self) -> str:
        """The kernels this model's steps run on (see ``cpu_kernels.kernel_path``)."""
        weight = self._head[0].weight
        return f"bf16-{kernels_isa()}" if self.kernels is not None else fallback_path(weight.device, weight.dtype)

    def _pack(self, model: nn.Module) -> None:
        """The weights in the kernels' layout: QKV and gate/up fused, every matrix packed (a copy of ~ the
        model's decoder and head weights; the model's own parameters stay for prefills and transformers)."""
        assert self.kernels is not None  # packed only for the kernels
        pack = self.kernels.pack
        empty = torch.empty(0, dtype=torch.bfloat16)
        self._packed = []
        with torch.no_grad():
            for w_in, _, wq, wk, wv, wo, w_post, _, wg, wu, wd, _ in self._layers:
                biases = [b for _, b in (wq, wk, wv)]
                bqkv = (
                    empty
                    if all(b is None for b in biases)
                    else torch.cat(
                        [
                            b if b is not None else torch.zeros(w.shape[0], dtype=torch.bfloat16)
                            for (w, _), b in zip((wq, wk, wv), biases)
                        ]
                    ).contiguous()
                )
                self._packed.append(
                    [
                        w_in.detach().contiguous(),
                        pack(torch.cat([wq[0], wk[0], wv[0]])),
                        bqkv,
                        pack(wo[0]),
                        w_post.detach().contiguous(),
                        pack(torch.cat([wg[0], wu[0]])),
                        pack(wd[0]),
                    ]
                )
            head = self._head[0]
            self._head_packed = pack(head.weight)
            self._head_bias = head.bias
            self._vocab = head.weight.shape[0]

    def _linear(self, x: torch.Tensor, wb: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
        weight, bias = wb
        if self.fast_matmul and x.numel() // x.shape[-1] <= FAST_MATMUL_MAX_ROWS:
            return _fast_matmul(x, weight, bias)
        return F.linear(x, weight, bias)

    def _repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """``[1, kv_heads, L, d]`` -> ``[1, heads, L, d]`` (transformers' ``repeat_kv``)."""
        if self.groups == 1:
            return x
        _, _, length, dim = x.shape
        return (
            x[:, :, None].expand(1, self.num_kv_heads, self.groups, length, dim).reshape(1, self.num_heads, length, dim)
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        cache,
        positions: torch.Tensor | None,
        mask: torch.Tensor | None,
        keep: int,
        hidden_out: list | None = None,
        taps: tuple[int, ...] = (),
    ) -> torch.Tensor | None:
        """``positions``: ``[1, n]`` absolute positions, or None for a causal chain right after the cache
        (``cache length .. + n``). ``mask``: None for a causal chain after the cache, else an additive float or
        boolean mask ``[1, 1, n, cache + n]``. ``keep``: logits of the last ``keep`` rows (0 = all; < 0 = none,
        only ``hidden_out``). ``hidden_out``: if given, the LM head's input rows are appended to it, and with
        ``taps`` (decoder layer indices: EAGLE-3's) then the inputs of those layers, concatenated
        ``[1, rows, len(taps) * hidden]``, for the same rows (the residual stream a hook on the layer sees)."""
        n = input_ids.shape[1]
        if self.graphs is not None:
            if self.graphs.serves(n, positions, mask, keep, hidden_out, taps):
                return self.graphs(input_ids, cache, keep, positions, mask, hidden_out)
            self.graphs.prepare(cache, cache.get_seq_length() + n)  # the graphs' buffers, for the steps after
        if self.kernels is not None:
            return self._kernel_forward(input_ids, cache, positions, mask, keep, hidden_out, taps)
        tapped: list[torch.Tensor] = []
        x = self._embed[0](input_ids)
        if positions is None:
            start = cache.get_seq_length()
            positions = torch.arange(start, start + n, device=x.device)[None]
        cos, sin = self._rotary[0](x, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        shape = (1, n, -1, self.head_dim)
        if mask is None and n > 1:
            start = cache.get_seq_length()
            mask = (
                torch.arange(start + n, device=x.device)[None, :]
                <= torch.arange(start, start + n, device=x.device)[:, None]
            )[None, None]
        for i, (w_in, eps_in, wq, wk, wv, wo, w_post, eps_post, wg, wu, wd, act) in enumerate(self._layers):
            if taps:
                tapped.extend(x for t in taps if t == i)
            h = _rms_norm(x, w_in, eps_in)
            q = self._linear(h, wq).view(shape).transpose(1, 2)
            k = self._linear(h, wk).view(shape).transpose(1, 2)
            v = self._linear(h, wv).view(shape).transpose(1, 2)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            k, v = cache.update(k, v, i)
            if mask is None:  # one query token, nothing masked (as transformers' sdpa path)
                if self.groups > 1:
                    a = F.scaled_dot_product_attention(q, k, v, scale=self.scaling, enable_gqa=True)
                else:
                    a = F.scaled_dot_product_attention(q, k, v, scale=self.scaling)
            else:  # transformers repeats the KV heads when a mask is given
                a = F.scaled_dot_product_attention(
                    q, self._repeat_kv(k), self._repeat_kv(v), attn_mask=mask, scale=self.scaling
                )
            a = a.transpose(1, 2).contiguous().reshape(1, n, -1)
            x = x + self._linear(a, wo)
            h = _rms_norm(x, w_post, eps_post)
            x = x + self._linear(act(self._linear(h, wg)) * self._linear(h, wu), wd)
        if keep > 0:
            x = x[:, -keep:]
        x = _rms_norm(x, *self._norm)
        if hidden_out is not None:
            hidden_out.append(x)
            if taps:
                hidden_out.append(torch.cat(tapped, -1)[:, -x.shape[1] :])
        if keep < 0:  # only the hidden states are wanted (a drafter reading the target's features)
            return None
        head = self._head[0]
        return self._linear(x, (head.weight, head.bias))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head over final hidden rows ``h [1, n, hidden]`` (``forward``'s last step, for rows chosen
        after a ``keep < 0`` forward: the batched engine's packed steps, ``decoding/batched.py``)."""
        head = self._head[0]
        if self.kernels is not None:
            logits = self.kernels.linear(h.contiguous(), self._head_packed, self._vocab)
            return logits if self._head_bias is None else logits + self._head_bias
        return self._linear(h, (head.weight, head.bias))

    def _rotary_rows(
        self, x: torch.Tensor, positions: torch.Tensor | None, start: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[n, head_dim]`` of ``positions [1, n]`` (None: ``start .. start + n``): rows of a table
        the model's own rotary module computed once for positions 0..cap (static rope types; a causal chain
        takes a slice of it, no gather), else the module on the spot."""
        n = x.shape[-2]
        rotary = self._rotary[0]
        if getattr(rotary, "rope_type", None) not in STATIC_ROPE_TYPES:
            if positions is None:
                positions = torch.arange(start, start + n, device=x.device)[None]
            cos, sin = rotary(x, positions)
            return cos[0], sin[0]
        table = self._static_rope_table(start + n if positions is None else int(positions.max()) + 1)
        if positions is None:
            return table[0][start : start + n], table[1][start : start + n]
        return table[0][positions[0]], table[1][positions[0]]

    def _static_rope_table(self, need: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[cap, head_dim]`` for positions 0..cap >= ``need``, computed by the model's own rotary
        module (static rope types) and grown by doubling."""
        table = self._rope_table
        if table is None or table[0].shape[0] < need:
            cap = max(need, 512, 2 * (table[0].shape[0] if table is not None else 0))
            weight = self._embed[0].weight
            cos, sin = self._rotary[0](weight[:1], torch.arange(cap, device=weight.device)[None])
            table = self._rope_table = (cos[0], sin[0])
        return table

    def _kernel_args(self, cache, end: int) -> list[torch.Tensor]:
        """The kernels' per-layer arguments: packed weights and cache buffers with room for ``end`` positions
        (the list is rebuilt only when a buffer grows)."""
        if len(cache.layers) < len(self._layers) or not cache.layers[0].is_initialized:
            blank = self._embed[0].weight.new_empty(1, self.num_kv_heads, 0, self.head_dim)
            for i in range(len(self._layers)):
                cache.update(blank, blank, i)
        state = getattr(cache, "_kernel_args", None)
        first = cache.layers[0]
        if state is None or state[0] is not first._k or end > first._k.shape[-2]:
            tensors = []
            for packed, layer in zip(self._packed, cache.layers):
                tensors.extend(packed)
                tensors.extend(layer.buffers(end))
            state = (first._k, tensors)
            cache._kernel_args = state
        return state[1]

    def can_fuse_chain(self) -> bool:
        """Whether ``fused_chain`` runs here (the bf16 kernels, static rotary table, a head without bias)."""
        return (
            self.kernels is not None
            and self._head_bias is None
            and getattr(self._rotary[0], "rope_type", None) in STATIC_ROPE_TYPES
        )

    def fused_chain(
        self,
        ids: torch.Tensor,
        cache,
        gamma: int,
        warper,
        token_map: torch.Tensor | None,
        vocab: int,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``gamma`` tokens sampled from this model's warped rows after ``ids`` [n0] (the tokens after the cache)
        in one call of the kernels: ``(tokens [gamma], index [gamma, k], probs [gamma, k])``, ids in the target
        vocabulary (``token_map``: own head id -> target id). Bit-identical to ``gamma`` separate steps (forward,
        ``Warper.top_k_rows``, ``sample_sparse``) with the same generator; the cache then holds
        ``ids + tokens[:-1]`` more positions."""
        start = cache.get_seq_length()
        end = start + ids.numel() + gamma - 1
        tensors = self._kernel_args(cache, end)
        cos, sin = self._static_rope_table(end)
        norm_w, norm_eps = self._norm
        k = min(warper.top_k, self._vocab if token_map is None else token_map.numel(), vocab)
        assert self.kernels is not None  # can_fuse_chain
        tokens, index, probs = self.kernels.draft_chain(
            ids,
            self._embed[0].weight,
            cos,
            sin,
            tensors,
            start,
            norm_w,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.intermediate,
            float(self._layers[0][1]),
            float(norm_eps),
            float(self.scaling),
            self._head_packed,
            self._vocab,
            vocab,
            _NO_MAP if token_map is None else token_map,
            gamma,
            k,
            float(warper.temperature),
            float(warper.top_p),
            generator,
        )
        for layer in cache.layers:
            layer.advance(end)
        return tokens, index, probs

    def _kernel_forward(self, input_ids, cache, positions, mask, keep, hidden_out, taps=()):
        """``forward`` in one call of the bf16 kernels (``csrc/bf16_decoder.cpp``)."""
        kernels = self.kernels
        assert kernels is not None
        x = torch.embedding(
            self._embed[0].weight, input_ids[0]
        )  # [n, hidden]: the module's lookup without its call machinery
        n = x.shape[0]
        start = cache.get_seq_length()
        cos, sin = self._rotary_rows(x, positions, start)
        end = start + n
        tensors = self._kernel_args(cache, end)
        if mask is None:
            allowed = _NO_MASK
        elif mask.dtype == torch.bool:
            allowed = mask[0, 0]
        else:
            allowed = mask[0, 0] > torch.finfo(mask.dtype).min / 2
        norm_w, norm_eps = self._norm
        eps = self._layers[0][1]
        args = (x, cos, sin, tensors, start, allowed, norm_w, self.num_heads, self.num_kv_heads, self.head_dim)
        rest = (self.intermediate, float(eps), float(norm_eps), float(self.scaling), max(keep, 0))
        tapped = None
        if taps and hidden_out is not None:
            h, tapped = kernels.decoder_forward_taps(*args, *rest, list(taps))
        else:
            h = kernels.decoder_forward(*args, *rest)
        for layer in cache.layers:
            layer.advance(end)
        h = h[None]
        if hidden_out is not None:
            hidden_out.append(h)
            if tapped is not None:
                hidden_out.append(tapped[-h.shape[1] :][None])
        if keep < 0:
            return None
        logits = kernels.linear(h, self._head_packed, self._vocab)
        return logits if self._head_bias is None else logits + self._head_bias


if __name__ == "__main__":  # F.linear against the fast form on the offline pair's shapes (fast_ops.compare)
    compare()
