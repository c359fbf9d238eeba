"""The decoder interface, its result type, and parameter validation shared by every method."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch

from .checkpoints import resolve_dir
from .kv import CachedModel
from .warping import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, Warper


@dataclass
class Generation:
    """What one call of ``Decoder.generate`` produced.

    ``accepted`` has one entry per decoding iteration: the tokens that iteration emitted (bonus
    token included). For speculative methods an iteration is one target forward, so
    ``len(accepted) == steps``; methods that spend several target forwards per iteration (MTJD,
    beam search) say so in their docstring. Mean accepted tokens per target step is
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
    """A method parameter: its default and a check returning an error text (or None when valid)."""

    default: Any
    check: Callable[[Any], str | None]
    help: str = ""


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


DRAFTERS = ("model", "eagle", "eagle3", "ngram")  # the built-in drafter kinds (drafters.py registers their plugins)
DRAFTER_KINDS: dict[str, Any] = {}  # kind -> drafter plugin class: the one registry (filled by drafters.register_drafter)
EAGLE_KINDS = ("eagle", "eagle3")  # drafters that read a head from the pair's `eagle:` folder (or their own `path`)


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
    """What a pair offers, known before any model loads: its draft model, EAGLE head (folder and version)
    and default drafter (a kind name or a ``{kind: ..., <param>: ...}`` scope)."""

    has_draft: bool = True
    has_eagle: bool = False
    default: Any = None
    eagle_path: str | None = None
    eagle_version: int | None = None

    @classmethod
    def of_pair(cls, pair: Mapping[str, Any]) -> "DrafterContext":
        """From a pair config mapping (``conf/pair/<name>.yaml``)."""
        default = pair.get("drafter")
        kind = default.get("kind") if isinstance(default, Mapping) else default
        kinds = list(DRAFTER_KINDS) or list(DRAFTERS)
        if default is not None and kind not in kinds:
            raise ValueError(f"pair {pair.get('name')!r}: drafter: {default!r} must be one of {kinds} (or {{kind: <one of them>, ...}})")
        path = pair.get("eagle")
        return cls(has_draft=bool(pair.get("draft")), has_eagle=bool(path), default=default,
                   eagle_path=str(path) if path else None, eagle_version=eagle_version(path))

    @classmethod
    def of_models(cls, target, draft, assets: Mapping[str, Any] | None = None) -> "DrafterContext":
        head = (assets or {}).get("eagle")
        if head is None:
            head = getattr(target, "eagle_head", None)  # attached by hand (load_eagle_head(path, target))
        return cls(
            has_draft=draft is not None,
            has_eagle=head is not None,
            default=getattr(target, "default_drafter", None),
            eagle_version=None if head is None else int(getattr(head, "eagle_version", 1)),
        )

    def available(self) -> set[str]:
        out = {"ngram"}
        if self.has_draft:
            out.add("model")
        if self.has_eagle:
            out.add("eagle3" if self.eagle_version == 3 else "eagle")
        return out


WARP_PARAMS: dict[str, Param] = {
    "temperature": Param(DEFAULT_TEMPERATURE, nonneg_number, "0 = greedy"),
    "top_k": Param(DEFAULT_TOP_K, int_at_least(0), "0 = off"),
    "top_p": Param(DEFAULT_TOP_P, in_half_open(0.0, 1.0), "1 = off"),
}


class Decoder:
    """One decoding method over a target (and, for draft-based methods, a draft) model.

    Subclasses declare ``name``, ``needs_draft`` and ``params`` (besides the warping parameters,
    which every method accepts) and implement ``_generate``.
    """

    name: ClassVar[str] = ""
    needs_draft: ClassVar[bool] = False
    lossless: ClassVar[bool] = False
    params: ClassVar[dict[str, Param]] = {}
    # decodes several requests together (batch_size > 1: decoding/batched.py); the others refuse it before loading
    batchable: ClassVar[bool] = False

    def __init__(self, target, draft=None, assets: Mapping[str, Any] | None = None, **params: Any) -> None:
        """``assets``: what the pair loaded beside its models for the drafters (``{"eagle": head}``),
        passed explicitly (``LoadedPair.assets``); a head attached to the target by hand is read too."""
        self.assets = dict(assets or {})
        values = validate_params(type(self), params, has_draft=draft is not None, drafters=DrafterContext.of_models(target, draft, self.assets))
        for key, value in values.items():
            setattr(self, key, value)
        self.warper = Warper(values["temperature"], values["top_k"], values["top_p"])
        self.target = CachedModel(target)
        vocab = self.target.vocab_size
        self.draft = CachedModel(draft, vocab_size=vocab) if (draft is not None and self.draft_needed(values)) else None

    @classmethod
    def draft_needed(cls, values: dict[str, Any]) -> bool | str:
        """Whether these resolved parameters need a draft model (checked before any model is loaded);
        a string names the setting that needs it."""
        return cls.needs_draft

    @classmethod
    def draft_alternative(cls) -> str:
        """Appended to the missing-draft error: another way out, if the method has one."""
        return ""

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
        return None if cls.batchable else "it decodes one sequence at a time (batching covers the chain methods)"

    @classmethod
    def all_params(cls) -> dict[str, Param]:
        return {**WARP_PARAMS, **cls.params}

    @property
    def config(self) -> dict[str, Any]:
        """The resolved parameters of this decoder (defaults filled in)."""
        return {k: getattr(self, k) for k in self.all_params()}

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
) -> dict[str, Any]:
    """Fill defaults and check every parameter of ``cls``; raise ValueError naming the fix.

    ``drafters``: what the pair offers (draft model, EAGLE head, default drafter); default: a draft
    model iff ``has_draft``."""
    spec = cls.all_params()
    params = cls.fold_params(dict(params))
    unknown = sorted(set(params) - set(spec))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for method {cls.name!r}; valid parameters: {sorted(spec)}"
        )
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
            f"whose config has a `draft:` model{cls.draft_alternative()}"
        )
    cls.check_combination(values)
    return values


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
    emitted: list[int], eos: frozenset[int], max_new_tokens: int, out: list[int], context: list[int], accepted: list[int]
) -> bool:
    """Append one iteration's tokens, cut at the first EOS and at ``max_new_tokens``, to ``out`` and
    ``context``, and record how many were emitted; True when decoding must stop."""
    emitted, stop = cut_at_eos(emitted, eos)
    emitted = emitted[: max_new_tokens - len(out)]
    out += emitted
    context += emitted
    accepted.append(len(emitted))
    return stop or len(out) >= max_new_tokens
