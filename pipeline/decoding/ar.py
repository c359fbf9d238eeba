"""ar: autoregressive multinomial sampling from the warped target; temperature 0 is greedy.

Its loop is the chain loop (``batched.py``) with nothing drafted: every iteration is one plain target step."""

from __future__ import annotations

from .base import Decoder, Generation
from .batched import BatchedDecoder


class AutoregressiveDecoder(Decoder):
    name = "ar"
    lossless = True
    loop = "plain"  # the loop's plain steps (no drafter)

    def _generate(self, prompt, max_new_tokens, eos, generator) -> Generation:
        return BatchedDecoder(self, 1).decode(prompt, max_new_tokens, eos, generator)
