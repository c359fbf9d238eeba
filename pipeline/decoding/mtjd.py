"""mtjd: multi-token joint decoding, approximated by beam sampling with the target itself.

Each iteration draws ``num_tokens`` (K = 4) tokens from the target by beam sampling (W beams,
paper eq. 2 weights), emits the best beam and restarts from the new prefix; no verification
(MTAD paper section 3.1). An iteration costs K target forwards (one per depth), so
``accepted`` has one entry per iteration and ``steps`` counts forwards.

Its loop is the loop of ``batched.py`` with the target drawing the tokens itself (``draw_tokens``: MTAD's beam
sampling, ``beam_sampling.draft_beams``, over the target's own sequences; at batch > 1 every request's beams in one
packed target forward per depth), nothing verified and the target's cache left at what was emitted.
"""

from __future__ import annotations

from dataclasses import replace

from .base import Decoder, Generation, Param, boolean, int_at_least, one_of
from .batched import BatchedDecoder
from .beam_sampling import BEAM_WEIGHTS, draft_beams
from .drafting import ChainAsk
from .packed import Lanes


class MTJDDecoder(Decoder):
    name = "mtjd"
    loop = "draw"  # the target draws its own tokens (``draw_tokens``)
    params = {
        "num_tokens": Param(4, int_at_least(1), "K tokens decoded jointly per iteration"),
        "num_beams": Param(4, int_at_least(1), "beams of the beam sampler"),
        "beam_weights": Param("paper", one_of(*BEAM_WEIGHTS), "beam weight normalization"),
        "replacement": Param(False, boolean, "sample (beam, token) pairs with replacement"),
    }

    def _generate(self, prompt, max_new_tokens, eos, generator) -> Generation:
        return BatchedDecoder(self, 1).decode(prompt, max_new_tokens, eos, generator)

    def draw_tokens(self, target: Lanes, asks: list[ChainAsk]) -> list[list[int]]:
        """Each ask's best beam of ``min(num_tokens, ask.gamma)`` tokens, beam-sampled from the target over its
        sequences ``target`` (one target forward per depth over every ask; the target then holds
        ``context + beam[:-1]``)."""
        a = self.args
        asks = [replace(ask, gamma=min(a.num_tokens, ask.gamma)) for ask in asks]
        beams = draft_beams(self.target, target, asks, a.num_beams, self.warper, a.beam_weights, a.replacement)
        return [beam.tokens for beam in beams]
