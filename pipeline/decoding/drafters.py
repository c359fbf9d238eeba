"""Drafters: what proposes tokens, separated from how the target verifies them.

One interface (after transformers' ``CandidateGenerator`` and vLLM's ``v1/spec_decode`` proposers):

- ``start(prompt, hidden)``: a new generation; the target has cached ``prompt[:-1]`` and, for a
  drafter that reads them (``uses_hidden``), passes its last hidden states of those positions;
- ``propose(context, gamma, warper, generator) -> ChainDraft | None``: up to ``gamma`` tokens after
  ``context`` with the warped draft rows q they were drawn from (None: nothing to propose, the
  decoder takes a plain target step);
- ``observe(hidden, start)``: the target's hidden states of positions ``start ..`` (accepted ones);
- ``rollback(length)``: only the first ``length`` context tokens are kept;
- ``forwards``: draft forward passes of the current generation.

Three drafters, chosen by a method's ``drafter`` parameter:

- ``model``: a draft model (``ModelDrafter``; also the trees and beams of specinfer/mcss/spectr/mtad);
- ``eagle``: an EAGLE-1/2 head on the target's features (``pipeline.decoding.eagle``);
- ``ngram``: prompt lookup (Saxena 2023; transformers' ``PromptLookupCandidateGenerator``, vLLM's
  ``NgramProposer``): the continuation of the most recent earlier occurrence of the last n tokens
  in prompt + output, n from ``max_ngram`` down to ``min_ngram``. No model, no training; the draft
  is deterministic (q one-hot), so token and block verification stay exact.

``pair`` (the default of the ``drafter`` parameter) takes the pair's ``drafter:`` setting when the
method supports it, else ``model``.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import DRAFTERS, DrafterContext, Param, int_at_least, one_of
from .drafting import ChainDraft, draft_chain
from .eagle import EagleRunner, eagle_head_of
from .kv import CachedModel
from .warping import Warper, sample


def drafter_param(supported: tuple[str, ...] = DRAFTERS) -> Param:
    """The ``drafter`` parameter (any drafter name passes the type check; ``resolve_drafter`` says which
    ones the method supports and why not the others)."""
    return Param("pair", one_of("pair", *DRAFTERS), "who drafts: the pair's drafter (pair), " + " | ".join(supported))


NGRAM_PARAMS = {
    "max_ngram": Param(3, int_at_least(1), "ngram drafter: longest suffix looked up"),
    "min_ngram": Param(1, int_at_least(1), "ngram drafter: shortest suffix looked up"),
}


CHAIN_METHODS = "spd, block, mtad or typical"
UNSUPPORTED_WHY = {
    "ngram": "n-gram lookup drafts one deterministic chain (q one-hot), so the several sampled candidates "
             "this method verifies would be copies of it",
    "eagle": "EAGLE drafts here are chains; this method needs the draft model's trees/samples",
}


def resolve_drafter(method: str, values: dict[str, Any], supported: tuple[str, ...], ctx: DrafterContext) -> None:
    """Resolve ``values['drafter']`` (``pair`` -> the pair's drafter when ``supported``, else ``model``)
    and check the pair provides it; ValueError names the fix."""
    choice = values["drafter"]
    if choice == "pair":
        choice = ctx.default if ctx.default in supported else "model"
    if choice not in supported:
        why = UNSUPPORTED_WHY.get(choice, "")
        raise ValueError(
            f"method {method!r} cannot use drafter: {choice} ({why}); use drafter: {' | '.join(supported)}, "
            f"or drafter: {choice} with {CHAIN_METHODS}"
        )
    if choice == "eagle" and not ctx.has_eagle:
        raise ValueError(
            f"method {method!r} with drafter: eagle needs an EAGLE head: add `eagle: models/<dir>` to the pair "
            "config (train one with `python -m pipeline.train_eagle pair=<pair>`), or choose drafter: model | ngram"
        )
    values["drafter"] = choice
    if "min_ngram" in values and values["min_ngram"] > values["max_ngram"]:
        raise ValueError(f"method {method!r}: min_ngram ({values['min_ngram']}) must be <= max_ngram ({values['max_ngram']})")


class Drafter:
    name = ""
    uses_hidden = False

    def start(self, prompt: list[int], hidden: torch.Tensor | None = None) -> None:
        raise NotImplementedError

    def propose(self, context: list[int], gamma: int, warper: Warper, generator) -> ChainDraft | None:
        raise NotImplementedError

    def observe(self, hidden: torch.Tensor, start: int) -> None:
        """The target's last hidden states of positions ``start ..`` (ignored by drafters without features)."""

    def rollback(self, length: int) -> None:
        """Keep only what depends on the first ``length`` context tokens."""

    @property
    def forwards(self) -> int:
        return 0


class ModelDrafter(Drafter):
    """A draft model with its own KV cache (``CachedModel``)."""

    name = "model"

    def __init__(self, draft: CachedModel) -> None:
        self.model = draft

    def start(self, prompt, hidden=None) -> None:
        self.model.reset()
        self.model.prefill(prompt[:-1])

    def propose(self, context, gamma, warper, generator):
        return draft_chain(self.model, context, gamma, warper, generator)

    def rollback(self, length: int) -> None:
        self.model.rollback(min(self.model.length, length))

    @property
    def forwards(self) -> int:
        return self.model.forwards


class NgramDrafter(Drafter):
    """Prompt lookup: the continuation of the most recent earlier match of the context's last n tokens."""

    name = "ngram"

    def __init__(self, vocab_size: int, device, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.vocab_size, self.device = vocab_size, device
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.lookups = 0

    def start(self, prompt, hidden=None) -> None:
        self.lookups = 0

    def lookup(self, context: list[int], gamma: int) -> list[int]:
        """The draft tokens (possibly fewer than ``gamma``; empty when nothing matches)."""
        L = len(context)
        ctx = torch.tensor(context, dtype=torch.long)
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            windows = ctx[: L - 1].unfold(0, n, 1)  # windows starting at 0 .. L-1-n, all ending before the last token
            hits = (windows == ctx[L - n :]).all(-1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + n  # the most recent match
                return context[start : start + gamma]
        return []

    def propose(self, context, gamma, warper, generator):
        self.lookups += 1
        tokens = self.lookup(context, gamma)
        if not tokens:
            return None
        x = torch.tensor(tokens, dtype=torch.long, device=self.device)
        probs = torch.zeros(len(tokens), self.vocab_size, device=self.device)
        probs[torch.arange(len(tokens), device=self.device), x] = 1.0
        return ChainDraft(x, probs)


class EagleDrafter(Drafter):
    """EAGLE-1/2 chain drafting: feature-level autoregression on the target's last hidden states.

    Head position p consumes (f_p, x_{p+1}) and predicts f_{p+1}, whose LM-head row drafts x_{p+2}.
    With a context of L tokens the target has given features f_0 .. f_{L-2}; the head catches up on
    the positions it has not seen with real features (one forward), then drafts autoregressively on
    its own predicted features. Positions drafted on predicted features are recomputed with the
    target's real ones at the next ``propose``.
    """

    name = "eagle"
    uses_hidden = True

    def __init__(self, runner) -> None:
        self.runner = runner
        self.real = 0  # head cache positions computed from real target features

    def start(self, prompt, hidden=None) -> None:
        if hidden is None:
            raise ValueError("the EAGLE drafter needs the target's hidden states of the prompt")
        self.runner.reset()
        self.real = 0
        self.runner.observe(hidden, 0)

    def observe(self, hidden, start) -> None:
        self.runner.observe(hidden, start)
        self.real = min(self.real, start)

    def propose(self, context, gamma, warper, generator):
        r = self.runner
        n_feat = r.features.shape[0]  # == len(context) - 1
        if n_feat == 0:  # a one-token prompt: no feature yet, the first step is the target's own
            return None
        real = min(self.real, n_feat - 1)
        r.rollback(real)
        ids = torch.tensor(context[real + 1 : n_feat + 1], dtype=torch.long, device=r.device)
        feature = r.step(r.features[real:n_feat], ids, real)[-1:]
        self.real = n_feat
        tokens, rows = [], []
        pos = n_feat
        for i in range(gamma):
            q = warper(r.logits(feature[-1]))
            t = q.argmax(-1) if warper.greedy else sample(q, generator)
            tokens.append(t)
            rows.append(q)
            if i + 1 < gamma:
                feature = r.step(feature, t.reshape(1), pos)
                pos += 1
        return ChainDraft(torch.stack(tokens), torch.stack(rows))

    @property
    def forwards(self) -> int:
        return self.runner.forwards


def build_drafter(decoder) -> Drafter:
    """The drafter a decoder's resolved ``drafter`` parameter names, over its models."""
    kind = decoder.drafter
    if kind == "model":
        return ModelDrafter(decoder.draft)
    if kind == "ngram":
        return NgramDrafter(decoder.target.vocab_size, decoder.target.device, decoder.max_ngram, decoder.min_ngram)
    if kind == "eagle":
        head = eagle_head_of(decoder.target.model, decoder.name)
        return EagleDrafter(EagleRunner(decoder.target.model, head, decoder.target.vocab_size))
    raise ValueError(f"unknown drafter {kind!r}; valid drafters: {list(DRAFTERS)}")
