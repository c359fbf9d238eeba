"""EAGLE-1/2 draft head: a feature-level autoregressive drafter on the target's last hidden states.

Architecture (Li et al. 2024, SafeAILab/EAGLE ``eagle/model/cnets.py``): at position t the head
takes the target's last hidden state f_t (the LM head's input: after the final norm) and the
embedding of the next token x_{t+1}, ``fc(cat(emb(x_{t+1}), f_t))`` (2h -> h, with bias), runs one
Llama decoder layer (its input layer norm removed, as in EAGLE) with its own KV cache, and predicts
f_{t+1}; the target's own LM head turns a predicted feature into draft logits, optionally over a
restricted vocabulary (``restricted_head_map.json``: q = 0 elsewhere, verification stays exact).

Checkpoint layout (that of the published EAGLE heads): ``config.json`` (a Llama config with
``num_hidden_layers: 1``; ``bias`` for fc, default true) and ``model.safetensors`` or
``pytorch_model.bin`` with ``fc.weight``, ``fc.bias``, ``layers.0.self_attn.{q,k,v,o}_proj.weight``,
``layers.0.mlp.{gate,up,down}_proj.weight``, ``layers.0.post_attention_layernorm.weight`` and
optionally ``embed_tokens.weight`` (when absent the target's input embedding is used). EAGLE-3
heads (``fc`` 3h -> h, ``midlayer``, d2t/t2d maps) are ``eagle3.py``; ``load_eagle`` reads either
kind from a folder, and ``EagleRunner`` runs either.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.cache_utils import Cache
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from .checkpoints import HFModel, attach, check_against_weights, read_checkpoint, shapes_of, write_checkpoint
from .drafter_context import eagle_version
from .eagle3 import Eagle3Head, load_eagle3_head
from .kv import PreallocatedLayer, preallocated_layers
from .vocab import read_token_map, save_token_map

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class EagleHead(nn.Module):
    """fc(cat(emb, feature)) -> one Llama decoder layer -> predicted next feature ``[n, h]``."""

    token_map: torch.Tensor | None  # a restricted head's own id -> target id (set by the loader, or None)

    def __init__(self, config, bias: bool = True, embed_tokens: bool = False) -> None:
        super().__init__()
        config._attn_implementation = "sdpa"
        self.config = config
        h = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, h) if embed_tokens else None
        self.fc = nn.Linear(2 * h, h, bias=bias)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, 0)])
        self.layers[0].input_layernorm = nn.Identity()  # EAGLE drops the first layer's input norm
        self.rotary = LlamaRotaryEmbedding(config)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def forward(
        self,
        features: torch.Tensor,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        cache=None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``features [b, n, h]`` (f_t), ``embeds [b, n, h]`` (emb of x_{t+1}), ``positions [b, n]``;
        ``mask``: None = causal over the cache + these rows, else a boolean ``[b, 1, n, cache + n]``."""
        x = self.fc(torch.cat([embeds, features], -1))
        n = x.shape[1]
        start = cache.get_seq_length() if cache is not None else 0
        if mask is None:
            mask = (
                torch.arange(start + n, device=x.device)[None, :]
                <= torch.arange(start, start + n, device=x.device)[:, None]
            )
            mask = mask[None, None].expand(x.shape[0], 1, n, start + n)
        pos_emb = self.rotary(x, positions)
        return self.layers[0](
            x,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=cache is not None,
            position_embeddings=pos_emb,
        )

    def config_dict(self) -> dict[str, Any]:
        return self.config.to_dict()


def eagle_config(target_config, **overrides):
    """A one-layer Llama config for an EAGLE head of ``target_config``'s width."""
    fields = {
        k: getattr(target_config, k)
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "rms_norm_eps",
            "vocab_size",
            "max_position_embeddings",
            "hidden_act",
            "head_dim",
        )
        if getattr(target_config, k, None) is not None
    }
    rope = getattr(target_config, "rope_parameters", None)
    if rope:
        fields["rope_parameters"] = dict(rope)
    fields.update(overrides)
    fields["num_hidden_layers"] = 1
    return LlamaConfig(**fields)


def save_eagle_head(
    head: EagleHead,
    directory: str | Path,
    token_map: torch.Tensor | None = None,
    dtype: torch.dtype = torch.bfloat16,
    **info,
) -> Path:
    """Write the published layout: ``config.json`` + ``model.safetensors`` (+ the restricted-head map)."""
    config = head.config.to_dict()
    config.pop("_attn_implementation_autoset", None)
    config["architectures"] = ["EagleHead"]
    config["bias"] = head.fc.bias is not None
    config["torch_dtype"] = str(dtype).replace("torch.", "")
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_theta") is not None:
        # the authors' EAGLE code (and tools that follow it) read the rotary base from the top-level key
        # (absent, they take 10000): write it beside transformers' rope_parameters
        config["rope_theta"] = rope["rope_theta"]
    if info:
        config["pipeline_info"] = info
    state = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    directory = write_checkpoint(
        directory, state, config, dtype=dtype, config_file=CONFIG_FILE, weights_file=WEIGHTS_FILE
    )
    save_token_map(token_map, directory)
    return directory


def load_eagle_head(path: str | Path, target: HFModel | None = None) -> EagleHead:
    """Load an EAGLE-1/2 head (published layout); with ``target``, check shapes and attach it as
    ``target.eagle_head`` (its token map, if any, as ``eagle_head.token_map``)."""
    directory, raw, state = read_checkpoint(
        path,
        config_file=CONFIG_FILE,
        weights_files=(WEIGHTS_FILE, "pytorch_model.bin"),
        what="EAGLE head",
        trainer="train_eagle",
    )
    if "midlayer.self_attn.q_proj.weight" in state or "d2t" in state:
        raise ValueError(
            f"{directory} is an EAGLE-3 head (midlayer / d2t): load it with load_eagle "
            "(or eagle3.load_eagle3_head); drafter: eagle3"
        )
    bias = bool(raw.pop("bias", "fc.bias" in state))
    raw.pop("pipeline_info", None)
    raw.pop("architectures", None)
    raw["num_hidden_layers"] = 1
    config = LlamaConfig(**{k: v for k, v in raw.items() if k not in ("torch_dtype", "dtype")})
    check_against_weights(
        lambda: EagleHead(config, bias=bias, embed_tokens="embed_tokens.weight" in state),
        shapes_of(state),
        what="EAGLE head",
        directory=directory,
        config_file=CONFIG_FILE,
    )  # before anything is built
    head = EagleHead(config, bias=bias, embed_tokens="embed_tokens.weight" in state)
    expected = {k for k in head.state_dict() if not k.startswith("rotary.")}
    got = {k for k in state if not k.startswith("rotary.")}
    missing, unexpected = sorted(expected - got), sorted(got - expected)
    if missing or unexpected:
        raise ValueError(f"EAGLE head at {directory}: missing tensors {missing}, unexpected tensors {unexpected}")
    head.load_state_dict({k: v.float() for k, v in state.items() if k in expected}, strict=False)
    head.eval().requires_grad_(False)
    head.token_map = read_token_map(directory)
    if target is not None:
        attach_eagle_head(target, head)
    return head


def load_eagle(path: str | Path, target: HFModel | None = None) -> EagleHead | Eagle3Head:
    """The EAGLE head in the folder ``path``, EAGLE-1/2 or EAGLE-3 (by its config.json); with ``target``,
    moved to the target's device and dtype after checking shapes (not attached to it)."""
    head = load_eagle3_head(path) if eagle_version(path) == 3 else load_eagle_head(path)
    if target is not None:
        place_eagle_head(target, head)
    return head


def place_eagle_head(target: HFModel, head: EagleHead | Eagle3Head) -> EagleHead | Eagle3Head:
    """Check ``head`` against ``target`` and move it to the target's device and dtype."""
    weight = target.get_output_embeddings().weight
    vocab = weight.shape[0]
    if isinstance(head, Eagle3Head):
        layers = target.config.num_hidden_layers
        head.layers_of(layers)
        if head.target_hidden_size != target.config.hidden_size:
            raise ValueError(
                f"EAGLE-3 head reads target features of width {head.target_hidden_size}, "
                f"the target has {target.config.hidden_size}"
            )
        if head.config.vocab_size > vocab:
            raise ValueError(
                f"EAGLE-3 head's vocabulary ({head.config.vocab_size}) is larger than the target's ({vocab})"
            )
    elif (head_map := getattr(head, "token_map", None)) is not None and int(head_map.max()) >= vocab:
        raise ValueError("EAGLE head's restricted_head_map.json names ids outside the target's vocabulary")
    if head.embed_tokens is None and head.hidden_size != target.get_input_embeddings().weight.shape[1]:
        raise ValueError(
            f"EAGLE head has width {head.hidden_size} and no embed_tokens; "
            f"the target's embeddings are {target.get_input_embeddings().weight.shape[1]} wide"
        )
    head.to(weight.device, weight.dtype)
    return head


def attach_eagle_head(target: HFModel, head: EagleHead) -> HFModel:
    """Put ``head`` on ``target`` as ``target.eagle_head`` (target device and dtype) after checking shapes."""
    vocab = target.get_output_embeddings().weight.shape[0]
    if (head_map := getattr(head, "token_map", None)) is not None and int(head_map.max()) >= vocab:
        raise ValueError("EAGLE head's restricted_head_map.json names ids outside the target's vocabulary")
    return attach(target, head, "eagle_head", "EAGLE head")


class EagleRunner:
    """An EAGLE head bound to a target: its KV cache, the features it has been given, and draft logits."""

    def __init__(self, target_model: HFModel, head: EagleHead | Eagle3Head, vocab_size: int) -> None:
        self.head = head
        self.embed = head.embed_tokens if head.embed_tokens is not None else target_model.get_input_embeddings()
        self.eagle3 = isinstance(head, Eagle3Head)
        # EAGLE-1/2: the target's LM head on the predicted feature; EAGLE-3: the head's norm + LM head over its draft
        # vocabulary
        lm: nn.Linear = head.lm_head if isinstance(head, Eagle3Head) else target_model.get_output_embeddings()
        self.pre = head.norm if isinstance(head, Eagle3Head) else None
        W = lm.weight.detach()
        self.device = W.device
        self.bias = None if lm.bias is None else lm.bias.detach()
        self.token_map: torch.Tensor | None
        if isinstance(head, Eagle3Head):  # the head's rows are already the draft vocabulary's; token_map places them
            token_map = head.draft_to_target()
            if token_map.numel() == vocab_size and bool(
                (token_map == torch.arange(vocab_size, device=token_map.device)).all()
            ):
                self.token_map = None  # the whole vocabulary in order
            else:
                self.token_map = token_map.to(self.device)
        elif (head_map := getattr(head, "token_map", None)) is not None:
            self.token_map = head_map.to(self.device)
            W = W[self.token_map].contiguous()
            self.bias = None if self.bias is None else self.bias[self.token_map]
        else:
            self.token_map = None
        self.W = W
        self.vocab_size = vocab_size
        self.cache = Cache(layer_class_to_replicate=PreallocatedLayer)  # its buffers kept across generations
        self.reset()

    def reset(self) -> None:
        """A new generation: the head's cache emptied (its buffers kept, as ``CachedModel.reset``), no features."""
        self.cache.reset()
        width = self.head.feature_size if isinstance(self.head, Eagle3Head) else self.head.hidden_size
        self.features = torch.zeros(0, width, device=self.device, dtype=self.W.dtype)
        self.forwards = 0

    def fork(self) -> "EagleRunner":
        """A runner over the same head and weights with its own KV cache and features, empty: another sequence's
        (the batched engine gives each of its slots one)."""
        other = copy.copy(self)
        other.cache = Cache(layer_class_to_replicate=PreallocatedLayer)
        other.reset()
        return other

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def rollback(self, length: int) -> None:
        for layer in preallocated_layers(self.cache):
            layer.truncate(length)

    def observe(self, hidden: torch.Tensor, start: int) -> None:
        """The target's features of positions ``start .. start + rows`` (later ones are dropped)."""
        self.features = torch.cat(
            [self.features[:start], hidden.to(self.features.dtype).reshape(-1, self.features.shape[-1])]
        )

    def step(self, features: torch.Tensor, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Run rows (f_p, x_{p+1}) for p = start.. after the cache; predicted features ``[n, h]``."""
        n = tokens.numel()
        positions = torch.arange(start, start + n, device=self.device)[None]
        out = self.head(features[None], self.embed(tokens.reshape(1, -1)), positions, self.cache)
        self.forwards += 1
        return out[0]

    def step_tree(
        self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Run tree rows after the cache: ``features [n, w]``, ``tokens [n]``, absolute ``positions [n]`` and a
        boolean ``mask [n, cache + n]`` (what each row sees); predicted features ``[n, h]``."""
        out = self.head(
            features[None],
            self.embed(tokens.reshape(1, -1).to(self.device)),
            positions.reshape(1, -1).to(self.device),
            self.cache,
            mask=mask[None, None].to(self.device),
        )
        self.forwards += 1
        return out[0]

    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target vocabulary (-inf outside a restricted map), fp32."""
        if self.pre is not None:
            feature = self.pre(feature)
        z = F.linear(feature, self.W, self.bias).float()
        if self.token_map is None:
            if z.shape[-1] < self.vocab_size:
                z = torch.cat([z, z.new_full((*z.shape[:-1], self.vocab_size - z.shape[-1]), float("-inf"))], -1)
            return z
        full = z.new_full((*z.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.token_map, z)
