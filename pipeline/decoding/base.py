"""The decoder interface, its result type, and parameter validation shared by every method."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from functools import cached_property
from typing import Any, Callable, ClassVar, Collection, Mapping, Sequence

import torch

from pipeline.registry import Registry

from .capabilities import DRAFT_SHAPES, LOOPS, Capabilities
from .drafter_context import DRAFTERS as DRAFTERS  # re-exported: the registry's old home
from .drafter_context import DrafterContext
from .drafter_context import eagle_version as eagle_version
from .kv import CachedModel
from .rules import ChainRule, TreeWalk
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


def _method_problem(entry: Any) -> str | None:
    return (
        None
        if isinstance(entry, type) and issubclass(entry, Decoder) and entry is not Decoder
        else "is not a Decoder subclass (pipeline.decoding.base.Decoder)"
    )


# name -> Decoder class: the one registry of methods (pipeline/decoding/__init__.py registers the built-in ones;
# a config may name a method of its own as `module:attr`)
METHODS: Registry[Any] = Registry("method", check=_method_problem)

WARP_PARAMS: dict[str, Param] = {
    "temperature": Param(DEFAULT_TEMPERATURE, nonneg_number, "0 = greedy"),
    "top_k": Param(DEFAULT_TOP_K, int_at_least(0), "0 = off"),
    "top_p": Param(DEFAULT_TOP_P, in_half_open(0.0, 1.0), "1 = off"),
}


class Decoder:
    """One decoding method over a target (and, for draft-based methods, a draft) model.

    Subclasses declare ``name``, their ``params`` (besides the warping parameters, which every method
    accepts) and their capabilities, and the parts their ``loop`` needs (``contract.py``: a chain ``rule`` or a tree
    ``walk`` over a drafter, ``speculative.py``; the target's own draw; or ``_generate``, a loop of its own). The
    class attributes below are a method's defaults; what the sweep, the cell, the bench, the analysis and the error
    messages read is the configured method's answer, ``capabilities_of(values)`` (``contract.Capabilities``,
    computed once with its ``Args``: ``args.capabilities``, ``self.capabilities``), the one place a method overrides
    where a parameter changes it (typical's ``tree``, medusa's ``acceptance``, the drafter a method is given):

    - ``loop``: how the loop (``batched.py``) runs it: ``plain`` (target steps), ``chain``, ``tree``, ``draw`` (the
      target draws its own tokens) or ``own`` (a loop of its own, batch 1 only);
    - ``draft_shape``: what one target forward verifies, ``chain`` (gamma draft tokens: Leviathan's
      bound applies), ``tree`` or ``none`` (no draft);
    - ``lossless``: the output follows the warped target exactly (tested by chi-square);
    - ``verification_method``: how it verifies, in NVIDIA specdec_bench's words where they have one
      (``longest_prefix``, ``block``), else the rule's own (the cell's ``speculation_profile.json``);
    - ``prefix_drafts``: its draft of K tokens is a prefix of its draft of K + 1 (a chain drawn token by token);
    - ``requires``: what the method itself needs beside the target (``draft``, ``medusa``); a method
      with a ``drafter`` parameter needs what its drafter declares instead;
    - ``rule`` / ``walk``: a chain method's rule, a tree method's walk (``rules.py``; None elsewhere).

    Parameters are validated once (``validate_params``, in the plan) into the method's frozen
    dataclass ``Args`` (one field per parameter, generated from ``params``); a decoder reads
    ``self.args.<name>``.
    """

    name: ClassVar[str] = ""
    loop: ClassVar[str] = "own"
    draft_shape: ClassVar[str] = "none"
    lossless: ClassVar[bool] = False
    rule: ClassVar[ChainRule | None] = None
    walk: ClassVar[TreeWalk | None] = None
    verification_method: ClassVar[str] = ""
    prefix_drafts: ClassVar[bool] = False
    requires: ClassVar[tuple[str, ...]] = ()
    params: ClassVar[dict[str, Param]] = {}
    Args: ClassVar[type]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.draft_shape not in DRAFT_SHAPES:
            raise TypeError(f"{cls.__name__}.draft_shape must be one of {DRAFT_SHAPES}, got {cls.draft_shape!r}")
        if cls.loop not in LOOPS:
            raise TypeError(f"{cls.__name__}.loop must be one of {LOOPS}, got {cls.loop!r}")
        # the frozen per-method dataclass of resolved parameters (picklable: found as <module>.<Class>.Args)
        args = make_dataclass(
            "Args",
            [(k, Any, field(default=None if p.keyed_at_default else p.default)) for k, p in cls.all_params().items()],
            frozen=True,
            namespace={
                "as_dict": lambda self: {f.name: getattr(self, f.name) for f in fields(self)},
                "capabilities": _args_capabilities(cls),
                # pickled as its fields alone (the capabilities are computed again where it is read)
                "__reduce__": lambda self: (type(self), tuple(getattr(self, f.name) for f in fields(self))),
                "__doc__": f"The resolved parameters of method {cls.name!r} (validated once) and, computed once "
                "from them, its capabilities (``capabilities``).",
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
        self.capabilities: Capabilities = args.capabilities  # what it does as configured (computed once)
        self.draft_depth: int | None = self.capabilities.draft_depth  # the draft positions it puts to the target
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

    # ------------------------------------------------------------------ capabilities of a configuration

    @classmethod
    def capabilities_of(cls, values: dict[str, Any], drafter: Any = None) -> Capabilities:
        """What the method does with these resolved parameters (``drafter``: a Drafter class to assume in place of
        the one ``values`` name, as ``accepts`` asks): the one override point of a configured method's
        capabilities, read once per ``Args`` (``args.capabilities``). Here: the class's declarations."""
        own = cls.loop == "own"
        return Capabilities(
            loop=cls.loop,
            draft_shape=cls.draft_shape,
            draft_depth=None,
            lossless=cls.lossless,
            batch_refusal="it decodes one sequence at a time (with a loop of its own)" if own else None,
            drafter=None,
            requires=cls.requires,
        )

    @property
    def shape(self) -> str:
        """What one target forward of this decoder verifies (``capabilities.draft_shape``)."""
        return self.capabilities.draft_shape

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
        """Decode up to ``max_new_tokens`` new tokens after ``input_ids`` (batch size 1). A method the loop runs
        (``loop`` not ``own``) has its request checked by the loop's admission (``batched.py``), a method with a
        loop of its own here: the one check, ``check_request``."""
        prompt = _as_token_list(input_ids)
        if self.capabilities.loop == "own":
            check_request(prompt, max_new_tokens, self.target.max_positions)
        with torch.inference_mode():
            return self._generate(prompt, max_new_tokens, eos_set(eos_token_ids), generator)

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

    def next_token(self, logits: torch.Tensor, generator: torch.Generator | None) -> int:
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
    args = cls.Args(**values)
    args.capabilities  # computed once, here: a configuration the method cannot describe fails validation
    return args


def _args_capabilities(cls: type[Decoder]) -> cached_property[Capabilities]:
    """The ``capabilities`` of ``cls.Args``: ``cls.capabilities_of`` of its fields, computed once per ``Args``."""

    def capabilities(self: Any) -> Capabilities:
        return cls.capabilities_of(self.as_dict())

    return cached_property(capabilities)


def eos_set(eos_token_ids: Collection[int] | int | None) -> frozenset[int]:
    """The end-of-sequence ids as a set (one id, several, or none)."""
    if isinstance(eos_token_ids, int):
        return frozenset([eos_token_ids])
    return frozenset(int(t) for t in (eos_token_ids or ()))


def check_request(prompt: list[int], max_new_tokens: Any, max_positions: int | None) -> None:
    """The one check of a request (the loop's admission, ``Decoder.generate`` of a method with a loop of its own):
    a prompt of at least one token, ``max_new_tokens`` an integer >= 1, both within the target's context."""
    if not prompt:
        raise ValueError("input_ids is empty: a prompt needs at least one token (e.g. BOS)")
    m = max_new_tokens
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {m!r}")
    if max_positions is not None and len(prompt) + m > max_positions:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max_new_tokens ({m}) exceeds the target's context of {max_positions} "
            "positions: shorten the prompt or lower max_new_tokens"
        )


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
