"""The decoding engine: one file per method over shared machinery (docs/DESIGN.md section 3).

Public API::

    from pipeline.decoding import METHODS, build_decoder
    decoder = build_decoder("spd", target, draft, gamma=4, temperature=1.0, top_k=10, top_p=0.9)
    gen = decoder.generate(input_ids, max_new_tokens=128, eos_token_ids=[2], generator=g)
    gen.tokens, gen.steps, gen.draft_steps, gen.accepted

``METHODS`` and ``DRAFTERS`` are the registries (``pipeline.registry.Registry``): a taken name is an error,
and a config may name a method or drafter of your own as ``module:attr`` (docs/extending.md).
"""

from __future__ import annotations

from typing import Any

from .ar import AutoregressiveDecoder
from .base import DRAFTERS, METHODS, Decoder, DrafterContext, Generation, validate_params
from .beam import BeamSearchDecoder
from .bild import BiLDDecoder
from .block import BlockVerificationDecoder
from .drafter_scope import register_drafter
from .drafters import Drafter, MedusaDrafter, ModelDrafter, NgramDrafter
from .eagle_drafters import Eagle3Drafter, EagleDrafter
from .hsd import HSDDecoder, HSDReferenceDecoder
from .mcss import MCSSDecoder
from .medusa import MedusaDecoder
from .mtad import MTADDecoder
from .mtjd import MTJDDecoder
from .rules import ChainRule, TreeWalk
from .spd import SpeculativeDecoder
from .specinfer import SpecInferDecoder
from .spectr import SpecTrDecoder
from .traversal import TraversalDecoder
from .typical import TypicalDecoder
from .warping import Warper, make_generator, warp

# registration order is the tables' column order (analysis.schema.METHOD_ORDER: MTAD Table 5's order first)
for _cls in (
    AutoregressiveDecoder,
    BeamSearchDecoder,
    MTJDDecoder,
    SpeculativeDecoder,
    BlockVerificationDecoder,
    HSDDecoder,
    HSDReferenceDecoder,
    SpecTrDecoder,
    SpecInferDecoder,
    MCSSDecoder,
    TraversalDecoder,
    BiLDDecoder,
    TypicalDecoder,
    MedusaDecoder,
    MTADDecoder,
):
    METHODS.register(_cls)

# the built-in drafter kinds, in the order error messages and the bench list them
for _plugin in (ModelDrafter, EagleDrafter, Eagle3Drafter, NgramDrafter, MedusaDrafter):
    register_drafter(_plugin)


def register_method(cls: type[Decoder]) -> type[Decoder]:
    """Register a Decoder subclass under its ``name`` (a taken name is an error); usable as a decorator."""
    return METHODS.register(cls)


def method_class(name: str) -> type[Decoder]:
    """The decoder class registered as ``name``, or ``module:attr`` of one; a clear error lists the valid names."""
    return METHODS.get(name)


def check_method(
    name: str, params: dict[str, Any] | None = None, has_draft: bool = True, drafters: DrafterContext | None = None
) -> dict[str, Any]:
    """Validate a method name and its parameters without any model (used before loading anything).

    ``drafters``: what the pair offers (``DrafterContext.of_pair(pair_config)``: draft model, EAGLE
    head, default drafter); default: a draft model iff ``has_draft``. Returns the resolved
    parameters (defaults filled in, ``drafter: pair`` resolved), the fields of the method's frozen ``Args``, less
    those declared ``keyed_at_default=False`` that are at their default (``Param``: cells keep their keys).
    """
    if drafters is not None:
        has_draft = drafters.has_draft
    cls = method_class(name)
    values = validate_params(cls, dict(params or {}), has_draft=has_draft, drafters=drafters).as_dict()
    spec = cls.all_params()
    return {k: v for k, v in values.items() if spec[k].keyed_at_default or v != spec[k].default}


def method_args(name: str, params: dict[str, Any]) -> Any:
    """The method's frozen ``Args`` from parameters ``check_method`` already resolved (the plan's, carried by the
    cell): no second validation."""
    return method_class(name).Args(**params)


def build_decoder(name: str, target, draft=None, assets=None, **params: Any) -> Decoder:
    """Build the decoder ``name`` over ``target`` (and ``draft``, and the ``assets`` its drafter reads:
    ``LoadedPair.assets``): ``args=method_args(...)`` as the plan resolved them, or keyword parameters, validated
    here first."""
    return method_class(name)(target, draft, assets, **params)


def capabilities(
    name: str, params: dict[str, Any] | None = None, drafters: DrafterContext | None = None
) -> dict[str, Any]:
    """What method ``name`` does configured with ``params`` (validated as ``check_method`` does; default: its
    defaults): draft shape and depth, lossless, batchable, drafter, what it requires beside the target."""
    cls = method_class(name)
    values = validate_params(cls, dict(params or {}), has_draft=True, drafters=drafters).as_dict()
    return cls.capabilities_of(values).as_dict()


__all__ = [
    "DRAFTERS",
    "METHODS",
    "ChainRule",
    "Decoder",
    "Drafter",
    "DrafterContext",
    "Generation",
    "TreeWalk",
    "Warper",
    "build_decoder",
    "capabilities",
    "check_method",
    "make_generator",
    "method_args",
    "method_class",
    "register_drafter",
    "register_method",
    "warp",
]
