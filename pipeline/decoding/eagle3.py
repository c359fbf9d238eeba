"""EAGLE-3 draft head (Li et al. 2025; SafeAILab/EAGLE ``eagle/model/cnets.py``, EAGLE-3 branch).

What it computes, as the authors' code does:

- features: the target's hidden states at the INPUTS of three decoder layers (2, L//2, L-3 for a
  target of L layers; a head's config may name others in ``eagle_aux_hidden_state_layer_ids``, as vLLM
  and ``speculators`` read it), concatenated ``[3 * h_t]``; ``fc`` (no bias) maps them to h. A feature
  the head predicted itself is already h-wide and is fed back without ``fc`` (the authors' test
  ``hidden_states.shape[-1] != inputs_embeds.shape[-1]``).
- ``midlayer``: one decoder layer whose attention reads ``cat(input_layernorm(emb(x_{t+1})),
  hidden_norm(f_t))`` (q/k/v take 2h inputs); the residual is the un-normed f_t (``norm_before_residual``,
  a ``speculators`` option, uses the normed one); then ``post_attention_layernorm`` and the MLP.
- draft logits: ``lm_head(norm(out))`` over a draft vocabulary of ``draft_vocab_size`` ids; draft id i
  is target id ``i + d2t[i]``; ``t2d`` marks the target ids the draft covers. q = 0 for every other
  target id, so token, block and tree verification stay exact.

Checkpoints, read from the pair's ``eagle:`` folder (``load_eagle3_head``) and written by
``save_eagle3_head`` in either layout:

- ``eagle`` (the authors'): ``config.json`` (a Llama config with ``draft_vocab_size``, optionally
  ``target_hidden_size``; ``architectures: [LlamaForCausalLMEagle3]``) + ``model.safetensors`` or
  ``pytorch_model.bin`` with ``midlayer.*``, ``fc.weight``, ``norm.weight``, ``lm_head.weight``, ``d2t``,
  ``t2d`` and optionally ``embed_tokens.weight`` (else the target's input embedding is used);
- ``speculators`` (vLLM's ``speculators`` library): ``config.json`` with ``speculators_model_type: eagle3``,
  ``transformer_layer_config`` (the Llama config), ``draft_vocab_size``, ``norm_before_residual``,
  ``target_hidden_size`` and ``speculators_config`` (algorithm, proposal methods, verifier); the same
  tensors with ``layers.0.*`` in place of ``midlayer.*``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from .checkpoints import check_against_weights, read_checkpoint, shapes_of

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
LAYOUTS = ("eagle", "speculators")
AUTHORS_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"
LLAMA_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "vocab_size",
    "max_position_embeddings",
    "hidden_act",
    "head_dim",
    "attention_bias",
    "mlp_bias",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "tie_word_embeddings",
    "model_type",
)


def default_taps(num_layers: int) -> tuple[int, int, int]:
    """The decoder layers whose inputs EAGLE-3 reads on a target of ``num_layers`` layers (the authors' 2, L//2,
    L-3)."""
    taps = (2, num_layers // 2, num_layers - 3)
    if num_layers < 7 or len(set(taps)) < 3:
        raise ValueError(
            f"an EAGLE-3 head taps the inputs of decoder layers 2, L//2 and L-3, which are not three distinct layers "
            f"of a {num_layers}-layer target; name them in the head's config.json as eagle_aux_hidden_state_layer_ids"
        )
    return taps


class Eagle3Layer(nn.Module):
    """The authors' ``LlamaDecoderLayeremb``: attention over cat(norm(emb), norm(feature)), then the MLP."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = LlamaAttention(config, 0)
        d = self.self_attn.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        assert config.num_key_value_heads is not None  # LlamaConfig fills it (num_attention_heads by default)
        self.self_attn.q_proj = nn.Linear(2 * h, config.num_attention_heads * d, bias=bias)
        self.self_attn.k_proj = nn.Linear(2 * h, config.num_key_value_heads * d, bias=bias)
        self.self_attn.v_proj = nn.Linear(2 * h, config.num_key_value_heads * d, bias=bias)
        self.mlp = LlamaMLP(config)
        self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, embeds, hidden, mask, position_embeddings, cache=None) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], -1)
        attn, _ = self.self_attn(
            hidden_states=x, position_embeddings=position_embeddings, attention_mask=mask, past_key_values=cache
        )
        x = residual + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Head(nn.Module):
    """fc(3 target layers) -> midlayer(emb, feature) -> predicted feature; ``draft_logits`` over the draft
    vocabulary."""

    eagle_version = 3
    d2t: torch.Tensor  # buffer: draft id i -> target id i + d2t[i]
    t2d: torch.Tensor  # buffer: which target ids the draft vocabulary holds

    def __init__(
        self,
        config: LlamaConfig,
        draft_vocab_size: int,
        target_hidden_size: int | None = None,
        taps: tuple[int, ...] | None = None,
        embed_tokens: bool = False,
        norm_before_residual: bool = False,
    ) -> None:
        super().__init__()
        config._attn_implementation = "sdpa"
        self.config = config
        h = config.hidden_size
        self.target_hidden_size = int(target_hidden_size or h)
        self.taps = tuple(int(t) for t in taps) if taps else None
        self.embed_tokens = nn.Embedding(config.vocab_size, h) if embed_tokens else None
        self.fc = nn.Linear(3 * self.target_hidden_size, h, bias=False)
        self.midlayer = Eagle3Layer(config, norm_before_residual)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(config)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def draft_vocab_size(self) -> int:
        return self.lm_head.weight.shape[0]

    @property
    def feature_size(self) -> int:
        """Width of the target features the head reads (three layers' inputs)."""
        return 3 * self.target_hidden_size

    def layers_of(self, num_layers: int) -> tuple[int, ...]:
        """The target decoder layers whose inputs are this head's features."""
        taps = self.taps or default_taps(num_layers)
        if len(taps) != 3 or not all(0 <= t < num_layers for t in taps):
            raise ValueError(
                f"EAGLE-3 head taps layers {list(taps)}: need three layer indices of a {num_layers}-layer target"
            )
        return taps

    def draft_to_target(self) -> torch.Tensor:
        """Target id of every draft id (``i + d2t[i]``)."""
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    def set_vocab(self, target_ids: torch.Tensor) -> None:
        """Make the draft vocabulary the sorted ``target_ids`` (fills ``d2t`` and ``t2d``)."""
        ids = torch.as_tensor(target_ids, dtype=torch.long).sort().values
        if ids.numel() != self.draft_vocab_size:
            raise ValueError(f"{ids.numel()} target ids for a draft vocabulary of {self.draft_vocab_size}")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    def forward(
        self,
        features: torch.Tensor,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        cache=None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``features [b, n, 3 h_t]`` (the target's) or ``[b, n, h]`` (predicted), ``embeds [b, n, h]`` (emb of
        x_{t+1}), ``positions [b, n]``; ``mask``: None = causal over the cache + these rows, else boolean
        ``[b, 1, n, cache + n]``. Returns the predicted features ``[b, n, h]`` (before ``norm``)."""
        if features.shape[-1] != self.hidden_size:
            features = self.fc(features)
        n = features.shape[1]
        start = cache.get_seq_length() if cache is not None else 0
        if mask is None:
            mask = (
                torch.arange(start + n, device=features.device)[None, :]
                <= torch.arange(start, start + n, device=features.device)[:, None]
            )
            mask = mask[None, None].expand(features.shape[0], 1, n, start + n)
        pos_emb = self.rotary(features, positions)
        return self.midlayer(embeds, features, mask, pos_emb, cache)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary of predicted features."""
        return self.lm_head(self.norm(out))


def eagle3_config(target_config, **overrides) -> LlamaConfig:
    """A one-layer Llama config for an EAGLE-3 head of ``target_config``'s width (rope as the target's)."""
    fields = {k: getattr(target_config, k) for k in LLAMA_KEYS[:9] if getattr(target_config, k, None) is not None}
    rope = getattr(target_config, "rope_parameters", None)
    if rope:
        fields["rope_parameters"] = dict(rope)
    fields.update(overrides)
    fields["num_hidden_layers"] = 1
    return LlamaConfig(**fields)


def _llama_config(raw: Mapping[str, Any]) -> LlamaConfig:
    fields = {k: raw[k] for k in LLAMA_KEYS if raw.get(k) is not None and k != "model_type"}
    fields["num_hidden_layers"] = 1
    return LlamaConfig(**fields)


def is_speculators(raw: Mapping[str, Any]) -> bool:
    return "speculators_config" in raw or "transformer_layer_config" in raw


def load_eagle3_head(path: str | Path) -> Eagle3Head:
    """An EAGLE-3 head from a folder in the authors' layout or the ``speculators`` layout (see the module doc)."""
    directory, raw, state = read_checkpoint(
        path,
        config_file=CONFIG_FILE,
        weights_files=(WEIGHTS_FILE, "pytorch_model.bin"),
        what="EAGLE-3 head",
        trainer="train_eagle",
    )
    if is_speculators(raw):
        if raw.get("speculators_model_type", "eagle3") != "eagle3":
            raise ValueError(
                f"{directory}: speculators_model_type {raw.get('speculators_model_type')!r}; "
                "only eagle3 heads load here"
            )
        layer = dict(raw.get("transformer_layer_config") or {})
        state = {("midlayer." + k[len("layers.0.") :] if k.startswith("layers.0.") else k): v for k, v in state.items()}
        norm_before_residual = bool(raw.get("norm_before_residual", False))
    else:
        layer = dict(raw)
        norm_before_residual = bool(raw.get("norm_before_residual", False))
    draft_vocab = raw.get("draft_vocab_size") or layer.get("draft_vocab_size")
    shapes = shapes_of(state)
    if draft_vocab is None and "lm_head.weight" in shapes:
        draft_vocab = shapes["lm_head.weight"][0]
    if draft_vocab is None:
        raise ValueError(
            f"EAGLE-3 head at {directory}: config.json has no draft_vocab_size and there is no lm_head.weight"
        )
    config = _llama_config(layer)
    taps = raw.get("eagle_aux_hidden_state_layer_ids") or layer.get("eagle_aux_hidden_state_layer_ids")
    target_hidden = raw.get("target_hidden_size") or layer.get("target_hidden_size")
    check_against_weights(
        lambda: Eagle3Head(
            config,
            int(draft_vocab),
            target_hidden,
            taps,
            embed_tokens="embed_tokens.weight" in shapes,
            norm_before_residual=norm_before_residual,
        ),
        shapes,
        what="EAGLE-3 head",
        directory=directory,
        config_file=CONFIG_FILE,
        optional=("d2t", "t2d"),
    )
    head = Eagle3Head(
        config,
        int(draft_vocab),
        target_hidden,
        taps,
        embed_tokens="embed_tokens.weight" in state,
        norm_before_residual=norm_before_residual,
    )
    state = dict(state)  # the maps may be added below
    if "d2t" not in state:  # a head over the whole vocabulary may omit the maps
        if int(draft_vocab) != config.vocab_size:
            raise ValueError(
                f"EAGLE-3 head at {directory}: a draft vocabulary of {draft_vocab} < {config.vocab_size} needs d2t"
            )
        state["d2t"] = torch.zeros(int(draft_vocab), dtype=torch.long)
    if "t2d" not in state:
        state["t2d"] = torch.zeros(config.vocab_size, dtype=torch.bool)
        state["t2d"][torch.arange(int(draft_vocab)) + state["d2t"].long()] = True
    expected = {k for k in head.state_dict() if not k.startswith("rotary.")}
    got = {k for k in state if not k.startswith("rotary.")}
    missing, unexpected = sorted(expected - got), sorted(got - expected)
    if missing or unexpected:
        raise ValueError(f"EAGLE-3 head at {directory}: missing tensors {missing}, unexpected tensors {unexpected}")
    head.load_state_dict(
        {
            k: (v.long() if k == "d2t" else v.bool() if k == "t2d" else v.float())
            for k, v in state.items()
            if k in expected
        },
        strict=False,
    )
    ids = head.draft_to_target()
    if (
        int(ids.min()) < 0
        or int(ids.max()) >= config.vocab_size
        or not bool(head.t2d[ids].all())
        or int(head.t2d.sum()) != ids.numel()
    ):
        raise ValueError(
            f"EAGLE-3 head at {directory}: d2t and t2d disagree "
            "(draft id i -> target id i + d2t[i] must be the ids t2d marks)"
        )
    head.eval().requires_grad_(False)
    return head


def save_eagle3_head(
    head: Eagle3Head,
    directory: str | Path,
    layout: str = "eagle",
    dtype: torch.dtype = torch.bfloat16,
    verifier: str | None = None,
    speculative_tokens: int = 5,
    **info,
) -> Path:
    """Write ``head`` in the authors' layout (``eagle``) or the ``speculators`` one; ``verifier``: the target's
    name or path (recorded in the speculators config)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: choose one of {list(LAYOUTS)}")
    llama = head.config.to_dict()
    for k in ("_attn_implementation_autoset", "architectures", "transformers_version", "dtype", "torch_dtype"):
        llama.pop(k, None)
    rope = llama.get("rope_parameters") or {}
    if rope.get("rope_theta") is not None:
        llama["rope_theta"] = rope["rope_theta"]  # the authors' code (and older transformers) read the top-level key
    llama["num_hidden_layers"] = 1
    state = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    weights = {k: v for k, v in state.items() if k not in ("d2t", "t2d")}
    extra: dict[str, Any] = {
        "draft_vocab_size": head.draft_vocab_size,
        "target_hidden_size": head.target_hidden_size,
        "norm_before_residual": head.midlayer.norm_before_residual,
    }
    if head.taps:
        extra["eagle_aux_hidden_state_layer_ids"] = list(head.taps)
    if layout == "eagle":
        config = {**llama, **extra, "architectures": [AUTHORS_ARCH], "torch_dtype": str(dtype).replace("torch.", "")}
        names = weights
    else:
        config = {
            "architectures": [SPECULATORS_ARCH],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.1.0",
            "torch_dtype": str(dtype).replace("torch.", ""),
            "transformer_layer_config": llama,
            **extra,
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [
                    {
                        "proposal_type": "greedy",
                        "speculative_tokens": int(speculative_tokens),
                        "verifier_accept_k": 1,
                        "accept_tolerance": 0.0,
                    }
                ],
                "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
            },
        }
        names = {
            ("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v for k, v in weights.items()
        }
    if info:
        config["pipeline_info"] = info
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in names.items()}
    tensors.update(
        d2t=state["d2t"].long().contiguous(), t2d=state["t2d"].bool().contiguous()
    )  # the maps keep their types
    save_file(tensors, directory / WEIGHTS_FILE)
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, default=str) + "\n")
    return directory
