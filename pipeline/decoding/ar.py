"""ar: autoregressive multinomial sampling from the warped target; temperature 0 is greedy."""

from __future__ import annotations

from .base import Decoder, Generation


class AutoregressiveDecoder(Decoder):
    name = "ar"
    lossless = True
    batchable = True

    def _generate(self, prompt, max_new_tokens, eos, generator) -> Generation:
        target = self.target
        self._start(prompt)
        pending = prompt[-1:]
        out: list[int] = []
        for _ in range(max_new_tokens):
            logits = target.forward(pending, keep=1)[-1]
            y = self.warper.draw(logits, generator)
            pending = y.reshape(1)
            out.append(int(y))
            if out[-1] in eos:
                break
        return Generation(out, target.forwards, 0, [1] * len(out))
