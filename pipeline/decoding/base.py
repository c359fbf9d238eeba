"""The decoder interface, its result type, and parameter validation shared by every method."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch

from pipeline.registry import Registry

from .checkpoints import resolve_dir
from .kv import CachedModel
from .warping import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, Warper


@dataclass
class Generation:
    """What one call of ``Decoder.generate`` produced.

    ``accepted`` has one entry per decoding iteration: the tokens that iteration emitted (bonus
    token included). For speculative methods an iteration is one target forward, so
    ``len(accepted) == steps``; methods that spend several target forwards per iteration (MTJD,
    beam search) say so in their docstring. Mean emitted tokens per target step is
    ``len(tokens) / steps`` for every method.

    ``drafted`` (speculative methods only, else empty): per iteration, the draft positions that
    iteration put to the target (the chain's length, or the tree's depth; 0 for a plain target step),
    so that per-position acceptance rates (accepted at position i / drafts reaching i) are exact.
    """

    tokens: list[int]
    steps: int
    draft_steps: int
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Param:
    """A method parameter: its default and a check returning an error text (or None when valid).

    ``keyed_at_default=False``: a parameter added after cell keys were pinned; at its default it is left out of
    the resolved parameters ``check_method`` returns (a cell's ``params``, so its key), so every cell planned
    before it keeps its key; set to anything else it is in them. Its ``Args`` field defaults to ``default``."""

    default: Any
    check: Callable[[Any], str | None]
    help: str = ""
    keyed_at_default: bool = True


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def nonneg_number(v: Any) -> str | None:
    return None if _is_number(v) and v >= 0 else "must be a number >= 0"


def int_at_least(lo: int) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if isinstance(v, int) and not isinstance(v, bool) and v >= lo else f"must be an integer >= {lo}"

    return check


def int_list_at_least(lo: int) -> Callable[[Any], str | None]:
    """A non-empty list of integers >= lo (e.g. a tree's branching per depth)."""

    def check(v: Any) -> str | None:
        ok = (
            isinstance(v, (list, tuple))
            and len(v) > 0
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= lo for x in v)
        )
        return None if ok else f"must be a non-empty list of integers >= {lo}"

    return check


def in_closed(lo: float, hi: float) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if _is_number(v) and lo <= v <= hi else f"must be a number in [{lo}, {hi}]"

    return check


def in_half_open(lo: float, hi: float) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if _is_number(v) and lo < v <= hi else f"must be a number in ({lo}, {hi}]"

    return check


def one_of(*choices: Any) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {list(choices)}"

    return check


def boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


DRAFT_SHAPES = ("chain", "tree", "none")  # what one target forward of a method verifies


def _drafter_problem(entry: Any) -> str | None:
    ok = (
        isinstance(entry, type)
        and callable(getattr(entry, "create", None))
        and isinstance(getattr(entry, "shapes", None), frozenset)
    )
    return None if ok else "is not a Drafter subclass (pipeline.decoding.drafters.Drafter)"


def _method_problem(entry: Any) -> str | None:
    return (
        None
        if isinstance(entry, type) and issubclass(entry, Decoder) and entry is not Decoder
        else "is not a Decoder subclass (pipeline.decoding.base.Decoder)"
    )


# name -> Decoder class: the one registry of methods (pipeline/decoding/__init__.py registers the built-in ones;
# a config may name a method of its own as `module:attr`)
METHODS: Registry[Any] = Registry("method", check=_method_problem)

# kind -> Drafter class: the one registry of drafter kinds (pipeline/decoding/__init__.py registers the built-in
# ones; a config may name a drafter of its own as `drafter: {kind: mypkg.drafts:MyDrafter}`)
DRAFTERS: Registry[Any] = Registry("drafter", name_of=lambda cls: cls.kind, check=_drafter_problem)


def eagle_version(path: Any) -> int | None:
    """3 when the EAGLE head folder at ``path`` holds an EAGLE-3 head (authors' or ``speculators`` layout),
    1 for an EAGLE-1/2 head, None when it cannot be read (the loader then says what is missing).

    Reads ``config.json`` only: no weights, no model (validation before anything loads).
    """
    if not path:
        return None
    file = resolve_dir(path) / "config.json"
    if not file.exists():
        return None
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    archs = " ".join(config.get("architectures") or []).lower()
    if "speculators_config" in config or "draft_vocab_size" in config or "eagle3" in archs:
        return 3
    return 1


@dataclass(frozen=True)
class DrafterContext:
    """What a pair offers, known before any model loads: its draft model, EAGLE head (folder and version),
    Medusa heads and default drafter (a kind name or a ``{kind: ..., <param>: ...}`` scope)."""

    has_draft: bool = True
    has_eagle: bool = False
    default: Any = None
    eagle_path: str | None = None
    eagle_version: int | None = None
    has_medusa: bool = False

    def offers(self, asset: str | None) -> bool:
        """Whether the pair has ``asset`` (a drafter's or method's declared need; None: nothing): the field
        ``has_<asset>`` (``has_draft``, ``has_eagle``, ``has_medusa``); an asset without such a field is not offered."""
        return asset is None or bool(getattr(self, f"has_{asset}", False))

    @classmethod
    def of_pair(cls, pair: Mapping[str, Any]) -> "DrafterContext":
        """From a pair config mapping (``conf/pair/<name>.yaml``)."""
        default = pair.get("drafter")
        kind = default.get("kind") if isinstance(default, Mapping) else default
        if default is not None and kind not in DRAFTERS and not (isinstance(kind, str) and ":" in kind):
            raise ValueError(
                f"pair {pair.get('name')!r}: drafter: {default!r} must be one of {DRAFTERS.names()} "
                f"(or {{kind: <one of them>, ...}}, or `module:attr` of a Drafter of your own)"
            )
        path = pair.get("eagle")
        ctx = cls(
            has_draft=bool(pair.get("draft")),
            has_eagle=bool(path),
            default=default,
            eagle_path=str(path) if path else None,
            eagle_version=eagle_version(path),
            has_medusa=bool(pair.get("medusa")),
        )
        asset = DRAFTERS.get(kind).asset if isinstance(kind, str) else None  # a str whenever default is set
        if asset is not None and not ctx.offers(asset) and not (isinstance(default, Mapping) and default.get("path")):
            raise ValueError(
                f"pair {pair.get('name')!r}: drafter: {kind} reads the pair's `{asset}:`, which this pair has not: "
                f"add `{asset}: <...>` or choose another drafter"
            )
        return ctx

    @classmethod
    def of_models(cls, target, draft, assets: Mapping[str, Any] | None = None) -> "DrafterContext":
        """From loaded models and the assets passed beside them (``LoadedPair.assets``: ``eagle``, ``medusa`` heads
        and the pair's default ``drafter``); an EAGLE head attached to the target by hand is read too."""
        assets = assets or {}
        head = assets.get("eagle")
        if head is None:
            head = getattr(target, "eagle_head", None)  # attached by hand (eagle.attach_eagle_head)
        return cls(
            has_draft=draft is not None,
            has_eagle=head is not None,
            default=assets.get("drafter"),
            eagle_version=None if head is None else int(getattr(head, "eagle_version", 1)),
            has_medusa=assets.get("medusa") is not None,
        )


@dataclass(frozen=True)
class Capabilities:
    """What a configured method does (``Decoder.capabilities_of(values)``): the answer every reader asks for,
    rather than the class's defaults (a ``typical`` with ``tree: true`` verifies trees)."""

    draft_shape: str  # chain | tree | none
    draft_depth: int | None  # a chain's length or a tree's levels at most (None: no draft)
    lossless: bool
    batch_refusal: str | None  # why it cannot decode several requests together (None: it can)
    drafter: str | None  # the drafter kind (None: no drafter)
    requires: tuple[str, ...]

    @property
    def batchable(self) -> bool:
        return self.batch_refusal is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "draft_shape": self.draft_shape,
            "draft_depth": self.draft_depth,
            "lossless": self.lossless,
            "batchable": self.batchable,
            "drafter": self.drafter,
            "requires": self.requires,
        }


WARP_PARAMS: dict[str, Param] = {
    "temperature": Param(DEFAULT_TEMPERATURE, nonneg_number, "0 = greedy"),
    "top_k": Param(DEFAULT_TOP_K, int_at_least(0), "0 = off"),
    "top_p": Param(DEFAULT_TOP_P, in_half_open(0.0, 1.0), "1 = off"),
}


class Decoder:
    """One decoding method over a target (and, for draft-based methods, a draft) model.

    Subclasses declare ``name``, their ``params`` (besides the warping parameters, which every method
    accepts) and their capabilities, and implement ``_generate`` (or, for the two speculative loops of
    ``speculative.py``, a chain ``rule`` or a tree ``walk``). The class attributes below are a method's
    defaults; what the sweep, the cell, the bench, the analysis and the error messages read is the configured
    method's answer, ``capabilities_of(values)`` (``shape_of``, ``depth_of``, ``lossless_of``,
    ``batch_refusal``, ``drafter_of``), which a method overrides where a parameter changes it:

    - ``draft_shape``: what one target forward verifies, ``chain`` (gamma draft tokens: Leviathan's
      bound applies), ``tree`` or ``none`` (no draft);
    - ``lossless``: the output follows the warped target exactly (tested by chi-square);
    - ``batchable``: the method decodes several requests together (``batch_size > 1``);
    - ``verification_method``: how it verifies, in NVIDIA specdec_bench's words where they have one
      (``longest_prefix``, ``block``), else the rule's own (the cell's ``speculation_profile.json``);
    - ``prefix_drafts``: its draft of K tokens is a prefix of its draft of K + 1 (a chain drawn token by token);
    - ``requires``: what the method itself needs beside the target (``draft``, ``medusa``); a method
      with a ``drafter`` parameter needs what its drafter declares instead.

    Parameters are validated once (``validate_params``, in the plan) into the method's frozen
    dataclass ``Args`` (one field per parameter, generated from ``params``); a decoder reads
    ``self.args.<name>``.
    """

    name: ClassVar[str] = ""
    draft_shape: ClassVar[str] = "none"
    lossless: ClassVar[bool] = False
    batchable: ClassVar[bool] = False
    verification_method: ClassVar[str] = ""
    prefix_drafts: ClassVar[bool] = False
    requires: ClassVar[tuple[str, ...]] = ()
    params: ClassVar[dict[str, Param]] = {}
    Args: ClassVar[type]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.draft_shape not in DRAFT_SHAPES:
            raise TypeError(f"{cls.__name__}.draft_shape must be one of {DRAFT_SHAPES}, got {cls.draft_shape!r}")
        # the frozen per-method dataclass of resolved parameters (picklable: found as <module>.<Class>.Args)
        args = make_dataclass(
            "Args",
            [(k, Any, field(default=None if p.keyed_at_default else p.default)) for k, p in cls.all_params().items()],
            frozen=True,
            namespace={
                "as_dict": lambda self: {f.name: getattr(self, f.name) for f in fields(self)},
                "__doc__": f"The resolved parameters of method {cls.name!r} (validated once).",
            },
        )
        args.__module__, args.__qualname__ = cls.__module__, f"{cls.__qualname__}.Args"
        cls.Args = args

    def __init__(
        self, target, draft=None, assets: Mapping[str, Any] | None = None, *, args: Any = None, **params: Any
    ) -> None:
        """``args``: the method's resolved parameters (``validate_params``, done once in the plan; an ``Args``
        instance is taken as it is); else ``params`` are validated here (the API's ``build_decoder(..., gamma=3)``).
        ``assets``: what the pair loaded beside its models for the drafters (``{"eagle": head, "medusa": heads,
        "drafter": <the pair's default drafter>}``), passed explicitly (``LoadedPair.assets``); only an EAGLE head
        attached to the target by hand is read from the target."""
        self.assets = dict(assets or {})
        if args is None:
            args = validate_params(
                type(self),
                params,
                has_draft=draft is not None,
                drafters=DrafterContext.of_models(target, draft, self.assets),
            )
        elif params:
            raise TypeError(f"method {self.name!r}: pass either args= (validated) or keyword parameters, not both")
        elif not isinstance(args, type(self).Args):
            raise TypeError(
                f"method {self.name!r}: args must be {type(self).__qualname__}.Args (validate_params), "
                f"got {type(args).__name__}"
            )
        self.args = args
        self.shape = type(self).shape_of(args.as_dict())  # what one target forward verifies, as configured
        self.warper = Warper(args.temperature, args.top_k, args.top_p)
        self.target = CachedModel(target)
        vocab = self.target.vocab_size
        self.draft = (
            CachedModel(draft, vocab_size=vocab) if (draft is not None and self.draft_needed(args.as_dict())) else None
        )

    @property
    def draft_model(self) -> CachedModel:
        """The draft model of a method that runs one (``draft_needed``, checked before the decoder is built)."""
        assert self.draft is not None, f"method {self.name!r} runs no draft model here"
        return self.draft

    @classmethod
    def draft_needed(cls, values: dict[str, Any]) -> bool | str:
        """Whether these resolved parameters need a draft model (checked before any model is loaded);
        a string names the setting that needs it."""
        return "draft" in cls.requires

    @classmethod
    def draft_alternative(cls, values: dict[str, Any]) -> str:
        """Appended to the missing-draft error: another way out, if the method has one."""
        return ""

    @classmethod
    def accepts(cls, drafter: Any, values: dict[str, Any]) -> str | None:
        """None when this method can use ``drafter`` (a Drafter class), else why not (methods without a drafter:
        never)."""
        return "this method takes no drafter"

    @classmethod
    def fold_params(cls, params: dict[str, Any]) -> dict[str, Any]:
        """Short forms folded into their scope before validation (e.g. ``max_ngram`` into ``drafter``)."""
        return params

    @classmethod
    def resolve_drafter(cls, values: dict[str, Any], ctx: "DrafterContext") -> None:
        """Resolve and check a ``drafter`` parameter against what the pair offers (drafters.py)."""

    @classmethod
    def check_combination(cls, values: dict[str, Any]) -> None:
        """Checks that involve several parameters; raise ValueError naming the fix."""

    @classmethod
    def batch_refusal(cls, values: dict[str, Any]) -> str | None:
        """Why these resolved parameters cannot decode several requests together (None: they can)."""
        return None if cls.batchable else "it decodes one sequence at a time (with a loop of its own)"

    # ------------------------------------------------------------------ capabilities of a configuration
    # The class attributes above are the method's defaults; what a configured method does (its resolved
    # parameters ``values``, ``validate_params``) is asked of these, which a method overrides where a parameter
    # changes it (typical's ``tree``, medusa's ``acceptance``, the drafter a method is given).

    @classmethod
    def shape_of(cls, values: dict[str, Any]) -> str:
        """What one target forward verifies with these resolved parameters: ``chain``, ``tree`` or ``none``."""
        return cls.draft_shape

    @classmethod
    def depth_of(cls, values: dict[str, Any]) -> int | None:
        """Draft positions one iteration puts to the target at most: a chain's length, a tree's levels (None: no
        draft). The decoder's ``draft_depth`` is what it runs (a drafter may draft fewer levels: Medusa's heads)."""
        return None

    @classmethod
    def lossless_of(cls, values: dict[str, Any]) -> bool:
        """Whether the output follows the warped target exactly with these resolved parameters."""
        return cls.lossless

    @classmethod
    def drafter_of(cls, values: dict[str, Any]) -> str | None:
        """The drafter kind these resolved parameters draft with (None: the method drafts nothing)."""
        return None

    @classmethod
    def capabilities_of(cls, values: dict[str, Any]) -> "Capabilities":
        """Everything the sweep, the cell, the bench and the analysis ask of a configured method, in one answer."""
        return Capabilities(
            draft_shape=cls.shape_of(values),
            draft_depth=cls.depth_of(values),
            lossless=cls.lossless_of(values),
            batch_refusal=cls.batch_refusal(values),
            drafter=cls.drafter_of(values),
            requires=cls.requires,
        )

    @property
    def draft_depth(self) -> int | None:
        """The draft positions one iteration of this decoder puts to the target at most (None: no draft)."""
        return type(self).depth_of(self.config)

    @classmethod
    def all_params(cls) -> dict[str, Param]:
        return {**WARP_PARAMS, **cls.params}

    @property
    def config(self) -> dict[str, Any]:
        """The resolved parameters of this decoder (defaults filled in)."""
        return self.args.as_dict()

    def generate(
        self,
        input_ids: Sequence[int] | torch.Tensor,
        *,
        max_new_tokens: int,
        eos_token_ids: Sequence[int] | int | None = (),
        generator: torch.Generator | None = None,
    ) -> Generation:
        """Decode up to ``max_new_tokens`` new tokens after ``input_ids`` (batch size 1)."""
        prompt = _as_token_list(input_ids)
        if not prompt:
            raise ValueError("input_ids is empty: a prompt needs at least one token (e.g. BOS)")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        limit = self.target.max_positions
        if limit is not None and len(prompt) + max_new_tokens > limit:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the target's "
                f"context of {limit} positions: shorten the prompt or lower max_new_tokens"
            )
        if isinstance(eos_token_ids, int):
            eos = frozenset([eos_token_ids])
        else:
            eos = frozenset(int(t) for t in (eos_token_ids or ()))
        with torch.inference_mode():
            return self._generate(prompt, max_new_tokens, eos, generator)

    def _generate(
        self, prompt: list[int], max_new_tokens: int, eos: frozenset[int], generator: torch.Generator | None
    ) -> Generation:
        raise NotImplementedError

    def prefill_seconds(self) -> float:
        """Wall time the last generation spent writing its prompt into the models' caches (target and
        draft; ``CachedModel.prefill_s``): the part of ``generate``'s time before its first forward step."""
        return sum(m.prefill_s for m in (self.target, self.draft) if m is not None)

    def _start(self, prompt: list[int]) -> None:
        """A new generation: empty the caches and write all but the prompt's last token into them."""
        for model in (self.target, self.draft):
            if model is not None:
                model.reset()
                model.prefill(prompt[:-1])

    def _next_token(self, logits: torch.Tensor, generator: torch.Generator | None) -> int:
        """One token from one row of target logits: argmax when greedy, else a warped sample."""
        return int(self.warper.draw(logits, generator))


def validate_params(
    cls: type[Decoder], params: dict[str, Any], has_draft: bool, drafters: "DrafterContext | None" = None
) -> Any:
    """Fill defaults and check every parameter of ``cls`` into its frozen ``cls.Args``; raise ValueError naming
    the fix. The one validation of a method's parameters (the plan's ``check_method``; ``build_decoder``
    with keyword parameters for the API).

    ``drafters``: what the pair offers (draft model, EAGLE head, default drafter); default: a draft
    model iff ``has_draft``."""
    spec = cls.all_params()
    params = cls.fold_params(dict(params))
    unknown = sorted(set(params) - set(spec))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for method {cls.name!r}; valid parameters: {sorted(spec)}")
    values = {k: params.get(k, p.default) for k, p in spec.items()}
    for key, value in values.items():
        problem = spec[key].check(value)
        if problem:
            raise ValueError(f"method {cls.name!r}: parameter {key}={value!r} {problem}")
    cls.resolve_drafter(values, drafters if drafters is not None else DrafterContext(has_draft=has_draft))
    needed = cls.draft_needed(values)
    if needed and not has_draft:
        why = f" with {needed}" if isinstance(needed, str) else ""
        raise ValueError(
            f"method {cls.name!r}{why} needs a draft model: pass draft=... to build_decoder, or choose a pair "
            f"whose config has a `draft:` model{cls.draft_alternative(values)}"
        )
    cls.check_combination(values)
    return cls.Args(**values)


def _as_token_list(input_ids: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(f"batch size must be 1, got input_ids of shape {tuple(input_ids.shape)}")
            input_ids = input_ids[0]
        return [int(t) for t in input_ids.tolist()]
    return [int(t) for t in input_ids]


def cut_at_eos(tokens: list[int], eos: frozenset[int]) -> tuple[list[int], bool]:
    """Tokens up to and including the first EOS, and whether one was found."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], True
    return tokens, False


def emit(
    emitted: list[int],
    eos: frozenset[int],
    max_new_tokens: int,
    out: list[int],
    context: list[int],
    accepted: list[int],
) -> bool:
    """Append one iteration's tokens, cut at the first EOS and at ``max_new_tokens``, to ``out`` and
    ``context``, and record how many were emitted; True when decoding must stop."""
    emitted, stop = cut_at_eos(emitted, eos)
    emitted = emitted[: max_new_tokens - len(out)]
    out += emitted
    context += emitted
    accepted.append(len(emitted))
    return stop or len(out) >= max_new_tokens
