"""bild: Big Little Decoder (Kim et al., NeurIPS 2023), the sampling generalization (docs/ALGORITHMS.md 6, A.6).

The small (draft) model decodes alone, up to ``max_small_steps`` tokens, while it is confident:
when the largest probability of its row is below ``fallback`` the step is discarded and control
falls back to the large (target) model. The large model then runs once, non-autoregressively, over
the small model's pending tokens; the first pending token whose cross-entropy under the large
model's raw logits, ``-log p(x)``, exceeds ``rollback`` is rolled back with everything after it
and replaced by the large model's token at that position; otherwise the large model adds its own
next token. Both caches are rolled back to what was kept. Lossy by design. Limiting cases:
``rollback: 0`` or ``fallback: 1`` give the target's own sampling (every small token is rolled
back / the small model never decodes). Confidence is read from the warped small row (from the raw
softmax at temperature 0, as the greedy reference does).
"""

from __future__ import annotations

import torch

from .base import Decoder, Generation, Param, cut_at_eos, in_closed, int_at_least, nonneg_number
from .drafters import drafter_param, resolve_drafter
from .warping import sample


class BiLDDecoder(Decoder):
    name = "bild"
    needs_draft = True
    params = {
        "drafter": drafter_param(("model",)),
        "max_small_steps": Param(10, int_at_least(1), "N: small-model tokens before a forced large step"),
        "fallback": Param(0.9, in_closed(0.0, 1.0), "fall back to the large model when max q < fallback"),
        "rollback": Param(2.0, nonneg_number, "roll back a small token when -log p_large(x) > rollback"),
    }

    @classmethod
    def resolve_drafter(cls, values, ctx) -> None:
        resolve_drafter(cls.name, values, ("model",), ctx)

    def _pick(self, probs: torch.Tensor, logits: torch.Tensor, generator) -> int:
        return int(logits.argmax(-1)) if self.warper.greedy else int(sample(probs, generator))

    def _generate(self, prompt, max_new_tokens, eos, generator) -> Generation:
        target, draft, warper = self.target, self.draft, self.warper
        self._start(prompt)
        context = list(prompt)
        out: list[int] = []
        accepted: list[int] = []
        while len(out) < max_new_tokens:
            committed = len(context)
            pending: list[int] = []
            budget = min(self.max_small_steps, max_new_tokens - len(out) - 1)
            stop = False
            while len(pending) < budget:
                logits = draft.forward(context[draft.length :], keep=1)[-1]
                q = warper(logits)
                confidence = logits.softmax(-1).max() if warper.greedy else q.max()
                if float(confidence) < self.fallback:
                    break
                t = self._pick(q, logits, generator)
                pending.append(t)
                context.append(t)
                if t in eos:
                    stop = True
                    break
            logits = target.forward(context[target.length :], keep=len(pending) + 1)  # [len(pending) + 1, V]
            keep = len(pending)
            if pending:
                ce = -torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(pending, device=logits.device)[:, None])[:, 0]
                bad = (ce > self.rollback).nonzero()
                if bad.numel():
                    keep = int(bad[0, 0])
            del context[committed + keep :]
            emitted = pending[:keep]
            if keep == len(pending) and stop:
                y = None  # the small model ended with EOS and the large model kept it
            else:
                row = logits[keep]
                y = self._pick(warper(row), row, generator)
                context.append(y)
                emitted = emitted + [y]
            target.rollback(len(context) - 1)
            draft.rollback(min(draft.length, len(context) - 1))
            emitted, stop = cut_at_eos(emitted, eos)
            out += emitted
            accepted.append(len(emitted))
            if stop:
                break
        return Generation(out, target.forwards, draft.forwards, accepted)
