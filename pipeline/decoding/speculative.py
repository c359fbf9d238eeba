"""The draft-then-verify loop shared by every chain speculative method (spd, block, mtad).

One iteration: the drafter proposes g tokens; one target forward over ``[last token] + draft``
gives g + 1 rows; the method's verifier says how many drafts to keep and what comes next; both
caches are rolled back to what was kept (docs/ALGORITHMS.md appendix A.1). A method file supplies only
``propose`` and ``verify``. Near ``max_new_tokens`` the draft is shortened so no work is wasted.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import Decoder, Generation, Param, emit, int_at_least


class DraftVerifyDecoder(Decoder):
    needs_draft = True
    params = {"gamma": Param(4, int_at_least(1), "draft tokens per iteration")}

    def propose(self, context: list[int], gamma: int, generator) -> tuple[torch.Tensor, Any]:
        """Draft ``gamma`` tokens after ``context``; return them and what ``verify`` needs."""
        raise NotImplementedError

    def verify(
        self, logits: torch.Tensor, tokens: torch.Tensor, proposal: Any, generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """From target logits ``[g+1, V]``: (number of drafts accepted, next token), as 0-d tensors.

        They stay on the device: the loop reads them with the draft in one transfer per iteration.
        """
        raise NotImplementedError

    def _generate(self, prompt, max_new_tokens, eos, generator) -> Generation:
        target, draft = self.target, self.draft
        self._start(prompt)
        context = list(prompt)
        out: list[int] = []
        accepted: list[int] = []
        while len(out) < max_new_tokens:
            length = len(context)
            gamma = min(self.gamma, max_new_tokens - len(out) - 1)
            if gamma == 0:  # one token left: a plain target step
                emitted = [self._next_token(target.forward(context[-1:], keep=1)[-1], generator)]
            else:
                tokens, proposal = self.propose(context, gamma, generator)
                feed = torch.cat([torch.tensor(context[-1:], device=tokens.device), tokens])
                logits = target.forward(feed, keep=gamma + 1)
                n, y = self.verify(logits, tokens, proposal, generator)
                dev = tokens.device
                head = [torch.as_tensor(v, device=dev).reshape(1) for v in (n, y)]
                read = torch.cat([*head, tokens]).tolist()  # the one host read of the iteration
                n = read[0]
                emitted = read[2 : 2 + n] + [read[1]]
                target.rollback(length + n)
                draft.rollback(min(draft.length, length + n))
            if emit(emitted, eos, max_new_tokens, out, context, accepted):
                break
        return Generation(out, target.forwards, draft.forwards, accepted)
