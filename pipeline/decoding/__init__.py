"""The decoding engine: one file per method over shared machinery (docs/DESIGN.md section 3).

Public API::

    from pipeline.decoding import METHODS, build_decoder
    decoder = build_decoder("spd", target, draft, gamma=4, temperature=1.0, top_k=10, top_p=0.9)
    gen = decoder.generate(input_ids, max_new_tokens=128, eos_token_ids=[2], generator=g)
    gen.tokens, gen.steps, gen.draft_steps, gen.accepted
"""

from __future__ import annotations

from typing import Any

from .ar import AutoregressiveDecoder
from .base import DRAFTERS, Decoder, DrafterContext, Generation, validate_params
from .beam import BeamSearchDecoder
from .bild import BiLDDecoder
from .block import BlockVerificationDecoder
from .hsd import HSDDecoder, HSDReferenceDecoder
from .mcss import MCSSDecoder
from .medusa import MedusaDecoder
from .mtad import MTADDecoder
from .mtjd import MTJDDecoder
from .spd import SpeculativeDecoder
from .specinfer import SpecInferDecoder
from .spectr import SpecTrDecoder
from .traversal import TraversalDecoder
from .typical import TypicalDecoder
from .warping import Warper, make_generator, warp

METHODS: dict[str, type[Decoder]] = {
    cls.name: cls
    for cls in (
        AutoregressiveDecoder,
        BeamSearchDecoder,
        MTJDDecoder,
        SpeculativeDecoder,
        BlockVerificationDecoder,
        HSDDecoder,
        HSDReferenceDecoder,
        MTADDecoder,
        BiLDDecoder,
        SpecTrDecoder,
        SpecInferDecoder,
        MCSSDecoder,
        TraversalDecoder,
        TypicalDecoder,
        MedusaDecoder,
    )
}


def method_class(name: str) -> type[Decoder]:
    """The decoder class registered as ``name``; a clear error lists the valid names."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; valid methods: {sorted(METHODS)}") from None


def check_method(
    name: str, params: dict[str, Any] | None = None, has_draft: bool = True, drafters: DrafterContext | None = None
) -> dict[str, Any]:
    """Validate a method name and its parameters without any model (used before loading anything).

    ``drafters``: what the pair offers (``DrafterContext.of_pair(pair_config)``: draft model, EAGLE
    head, default drafter); default: a draft model iff ``has_draft``. Returns the resolved
    parameters (defaults filled in, ``drafter: pair`` resolved).
    """
    if drafters is not None:
        has_draft = drafters.has_draft
    return validate_params(method_class(name), dict(params or {}), has_draft=has_draft, drafters=drafters)


def build_decoder(name: str, target, draft=None, **params: Any) -> Decoder:
    """Build the decoder ``name`` over ``target`` (and ``draft``), validating ``params`` first."""
    return method_class(name)(target, draft, **params)


__all__ = ["DRAFTERS", "METHODS", "DrafterContext", "Decoder", "Generation", "Warper", "build_decoder", "check_method", "make_generator", "method_class", "warp"]
