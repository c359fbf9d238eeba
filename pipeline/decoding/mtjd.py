"""mtjd: multi-token joint decoding, approximated by beam sampling with the target itself.

Each iteration draws ``num_tokens`` (K = 4) tokens from the target by beam sampling (W beams,
paper eq. 2 weights), emits the best beam and restarts from the new prefix; no verification
(MTAD paper section 3.1). An iteration costs K target forwards (one per depth), so
``accepted`` has one entry per iteration and ``steps`` counts forwards.
"""

from __future__ import annotations

from .base import Decoder, Generation, Param, boolean, emit, int_at_least, one_of
from .beam_sampling import BEAM_WEIGHTS, beam_sample


class MTJDDecoder(Decoder):
    name = "mtjd"
    params = {
        "num_tokens": Param(4, int_at_least(1), "K tokens decoded jointly per iteration"),
        "num_beams": Param(4, int_at_least(1), "beams of the beam sampler"),
        "beam_weights": Param("paper", one_of(*BEAM_WEIGHTS), "beam weight normalization"),
        "replacement": Param(False, boolean, "sample (beam, token) pairs with replacement"),
    }

    def _generate(self, prompt, max_new_tokens, eos, generator) -> Generation:
        target = self.target
        self._start(prompt)
        context = list(prompt)
        out: list[int] = []
        accepted: list[int] = []
        while len(out) < max_new_tokens:
            k = min(self.args.num_tokens, max_new_tokens - len(out))
            beam = beam_sample(
                target,
                context,
                k,
                self.args.num_beams,
                self.warper,
                generator,
                self.args.beam_weights,
                self.args.replacement,
            )
            if emit(beam.tokens, eos, max_new_tokens, out, context, accepted):
                break
        return Generation(out, target.forwards, 0, accepted)
