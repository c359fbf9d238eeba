"""The draft-then-verify loop shared by every chain speculative method (spd, block, mtad).

One iteration: the drafter (``drafters.py``: a draft model, an EAGLE head or n-gram lookup) proposes g tokens; one target forward over ``[last token] + draft``
gives g + 1 rows; the method's verifier says how many drafts to keep and what comes next; both
caches are rolled back to what was kept (docs/ALGORITHMS.md appendix A.1). A method file supplies only
``propose`` and ``verify``. Near ``max_new_tokens`` the draft is shortened so no work is wasted; when
the drafter has nothing to propose (n-gram lookup without a match) the iteration is a plain target step.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import DRAFTERS, Decoder, Generation, Param, emit, int_at_least
from .drafters import NGRAM_PARAMS, Drafter, build_drafter, drafter_param, resolve_drafter


class DraftVerifyDecoder(Decoder):
    needs_draft = True  # with drafter: model (draft_needed)
    supported_drafters: tuple[str, ...] = DRAFTERS
    params = {
        "gamma": Param(4, int_at_least(1), "draft tokens per iteration"),
        "drafter": drafter_param(),
        **NGRAM_PARAMS,
    }

    def __init__(self, target, draft=None, **params) -> None:
        super().__init__(target, draft, **params)
        self.drafter_impl: Drafter | None = build_drafter(self) if self.drafter in DRAFTERS else None

    @classmethod
    def resolve_drafter(cls, values, ctx) -> None:
        resolve_drafter(cls.name, values, cls.supported_drafters, ctx)

    @classmethod
    def draft_needed(cls, values):
        return "drafter: model" if values["drafter"] == "model" else False

    @classmethod
    def draft_alternative(cls) -> str:
        return ", or set drafter: ngram (or eagle, with an EAGLE head in the pair)"

    def _start(self, prompt: list[int]) -> None:
        """Empty the caches; the target caches ``prompt[:-1]`` and the drafter starts (with the
        target's hidden states of those positions when it reads them)."""
        target, drafter = self.target, self.drafter_impl
        target.reset()
        hidden = None
        if drafter.uses_hidden:
            target.capture_hidden = True
            hidden = target.prefill_hidden(prompt[:-1])
        else:
            target.prefill(prompt[:-1])
        drafter.start(prompt, hidden)

    def propose(self, context: list[int], gamma: int, generator) -> tuple[torch.Tensor, Any] | None:
        """Draft up to ``gamma`` tokens after ``context``; return them and what ``verify`` needs
        (None: nothing drafted)."""
        raise NotImplementedError

    def verify(
        self, logits: torch.Tensor, tokens: torch.Tensor, proposal: Any, generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """From target logits ``[g+1, V]``: (number of drafts accepted, next token), as 0-d tensors.

        They stay on the device: the loop reads them with the draft in one transfer per iteration.
        """
        raise NotImplementedError

    def _generate(self, prompt, max_new_tokens, eos, generator) -> Generation:
        target, drafter = self.target, self.drafter_impl
        self._start(prompt)
        context = list(prompt)
        out: list[int] = []
        accepted: list[int] = []
        while len(out) < max_new_tokens:
            length = len(context)
            gamma = min(self.gamma, max_new_tokens - len(out) - 1)
            proposed = self.propose(context, gamma, generator) if gamma > 0 else None
            if proposed is None:  # one token left, or nothing drafted: a plain target step
                emitted = [self._next_token(target.forward(context[-1:], keep=1)[-1], generator)]
                if drafter.uses_hidden:
                    drafter.observe(target.hidden, length - 1)
            else:
                tokens, proposal = proposed
                gamma = tokens.shape[0]
                feed = torch.cat([torch.tensor(context[-1:], device=tokens.device), tokens])
                logits = target.forward(feed, keep=gamma + 1)
                n, y = self.verify(logits, tokens, proposal, generator)
                dev = tokens.device
                head = [torch.as_tensor(v, device=dev).reshape(1) for v in (n, y)]
                read = torch.cat([*head, tokens]).tolist()  # the one host read of the iteration
                n = read[0]
                emitted = read[2 : 2 + n] + [read[1]]
                target.rollback(length + n)
                drafter.rollback(length + n)
                if drafter.uses_hidden:
                    drafter.observe(target.hidden[: n + 1], length - 1)
            if emit(emitted, eos, max_new_tokens, out, context, accepted):
                break
        return Generation(out, target.forwards, drafter.forwards, accepted)

    def draft_chain(self, context: list[int], gamma: int, generator):
        """The drafter's chain (``ChainDraft``) or None when it has nothing to propose."""
        return self.drafter_impl.propose(context, gamma, self.warper, generator)
